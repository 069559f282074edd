"""A TensorFlow conversion made in another process, beside this one's.

The conversions are long and mostly Python (TensorFlow freezing the graph, tf2onnx's graph
passes, the TFLite converter's preparation): two of them in one process take turns on one
interpreter lock, so threads cannot overlap them (measured: an ONNX export and a TFLite
conversion of MobileNetV2 took as long in two threads as one after the other). A worker
process can: while this process exports to ONNX, the worker converts to TFLite.

The worker (`python -m infertune.pipeline.tf_worker JOB`, started as every child is:
system/children.py) loads the model from a .keras file this process wrote (and, for a calibrated
conversion, the calibration samples it reads), builds the conversion with the very function
this process would call (its registered build, export/registry.py),
writes it into the job directory with the conversion's `worker` files and exits: 0 with the
result, 1 with error.txt. A worker that fails leaves the conversion to this process
(`Target.shared`), which the report's notes say. offload.py decides which conversions go.

Keras loads a class it does not define only where it is registered or named in
`custom_objects`, in the loading process: the worker imports the modules of the model's own
classes and names them (`custom_classes`). A class defined in `__main__` (a script, a
notebook) or inside a function cannot be imported there, so no worker starts for such a model
and the model is not saved for one (on a BERT-base-sized model of a script's layers the
worker had cost a 2 s save before it failed).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..export.registry import CONVERSIONS
from ..precision.data import (
    arrays_batches,
    batches_arrays,
    first_samples,
)
from ..system.children import start_module

__all__ = ["OffloadedConversion", "custom_classes"]

# The longest this process waits for a worker's conversion before it makes it here instead:
# a conversion long enough to go to a worker takes 15 s or more; an hour means it hangs.
WORKER_TIMEOUT_S = 3600.0
# A calibrated conversion's samples (registry.py `samples`), as this process has them.
_CALIBRATION_FILE = "calibration.npz"


class OffloadedConversion:
    """The `key` conversion of a Keras model, being built by a worker process that imports
    `classes` (custom_classes of the model) to load it."""

    def __init__(self, key: str, target: Any, classes: list[tuple[str, str]]):
        conversion = CONVERSIONS.get(key)
        if conversion is None or conversion.worker is None:
            builds = sorted(k for k, c in CONVERSIONS.items() if c.worker is not None)
            raise ValueError(f"no worker builds {key!r}; it builds {builds}")
        self.key = key
        self.directory = Path(tempfile.mkdtemp(prefix="infertune-tf-worker-"))
        self.worker_s: float | None = None  # the worker's own seconds, once it is done
        try:
            target.source.owner.save(self.directory / "model.keras")
            if conversion.samples and target.calibration:
                _write_calibration(target.calibration, conversion.samples, self.directory)
            spec = {
                "key": key,
                "model": "model.keras",
                "custom_classes": classes,
                "signature": target.signature.to_dict(),
                "outputs": target.output_structure.to_dict(),
                "dtypes": [str(d) for d in target.output_dtypes],
            }
            (self.directory / "job.json").write_text(json.dumps(spec))
            self._log = open(self.directory / "worker.log", "wb")  # noqa: SIM115 (close())
            self._process = start_module(
                "infertune.pipeline.tf_worker",
                str(self.directory),
                stdout=self._log,
                stderr=self._log,
            )
        except BaseException:
            log = getattr(self, "_log", None)
            if log is not None:
                log.close()
            shutil.rmtree(self.directory, ignore_errors=True)
            raise

    def result(self, timeout_s: float = WORKER_TIMEOUT_S) -> Any:
        """The conversion, once the worker is done; raises RuntimeError with the worker's
        error (or TimeoutError) where it is not there."""
        try:
            code = self._process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.close()
            raise TimeoutError(f"the worker did not finish within {timeout_s:g} s") from None
        self._log.close()
        if code != 0:
            error = self.directory / "error.txt"
            why = error.read_text().strip() if error.is_file() else _tail(self._log.name)
            raise RuntimeError(f"the worker process failed (exit status {code}): {why}")
        self.worker_s = float((self.directory / "seconds.txt").read_text())
        return CONVERSIONS[self.key].worker.read(self.directory)

    def close(self) -> None:
        """Stop the worker if it still runs and remove its files."""
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._log.close()
        shutil.rmtree(self.directory, ignore_errors=True)


def _write_calibration(batches: list[list[np.ndarray]], samples: int, directory: Path) -> None:
    """The first `samples` rows of the calibration batches (flat input batches), for the
    worker: what the conversion would read of them here."""
    np.savez(directory / _CALIBRATION_FILE, **batches_arrays("in", first_samples(batches, samples)))


def _read_calibration(directory: Path) -> list[list[np.ndarray]] | None:
    """The calibration batches _write_calibration wrote, or None where there are none."""
    path = directory / _CALIBRATION_FILE
    if not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as stored:
        return arrays_batches({key: stored[key] for key in stored.files}, "in")


# Top-level packages whose classes Keras deserializes by itself.
_KERAS_PACKAGES = ("keras", "tf_keras", "keras_hub", "keras_nlp", "keras_cv", "tensorflow")


def custom_classes(model: Any) -> list[tuple[str, str]]:
    """(module, name) of each class of `model` and its layers (nested) that Keras does not
    define, for a worker process to import; ValueError, naming the class, for one it
    cannot import there. Layers only: a function or initializer of the user's own (Keras
    does not record its module) still makes the worker fail, and the conversion is made
    here."""
    flatten = getattr(model, "_flatten_layers", None)
    objects = list(flatten(include_self=True, recursive=True)) if flatten else [model]
    found: dict[tuple[str, str], None] = {}
    for cls in (type(obj) for obj in objects):
        module, name = cls.__module__, cls.__qualname__
        if module.split(".")[0] in _KERAS_PACKAGES:
            continue
        if module == "__main__":
            where = "in __main__ (a script or notebook)"
        elif "<locals>" in name:
            where = "inside a function"
        else:
            found[(module, name)] = None
            continue
        raise ValueError(
            f"the model's class {name} is defined {where}, which a worker process cannot "
            f"import to load the model (defined in a module, it can)"
        )
    return list(found)


def _load_model(path: Path, classes: list[list[str]]) -> Any:
    """The model this process's parent saved, with the classes custom_classes named."""
    from ..model.source import load_model
    from ..system.quiet import import_tensorflow

    import_tensorflow()  # before Keras imports it: without its start-up lines
    import keras

    with keras.saving.custom_object_scope(_custom_objects(classes)):
        return load_model(path)


def _custom_objects(classes: list[list[str]]) -> dict[str, Any]:
    """The classes custom_classes named, imported, under the names Keras looks them up by."""
    import importlib

    import keras

    objects: dict[str, Any] = {}
    for module, name in classes:
        cls = importlib.import_module(module)
        for part in name.split("."):
            cls = getattr(cls, part)
        objects[cls.__name__] = cls
        objects[keras.saving.get_registered_name(cls)] = cls
    return objects


def _tail(path: str, limit: int = 300) -> str:
    try:
        text = Path(path).read_text(errors="replace").strip()
    except OSError:
        return "no output"
    return text[-limit:] if text else "no output"


def main() -> None:
    from ..errors import one_line

    directory = Path(sys.argv[1])
    start = time.perf_counter()
    try:
        from ..model.inputs import InputSignature
        from ..model.structure import Structure
        from ..model.target import Target

        spec = json.loads((directory / "job.json").read_text())
        source = _load_model(directory / spec["model"], spec["custom_classes"])
        target = Target(
            source,
            InputSignature.from_dict(spec["signature"]),
            Structure.from_dict(spec["outputs"]),
            [np.dtype(d) for d in spec["dtypes"]],
            calibration=_read_calibration(directory),
        )
        conversion = CONVERSIONS[spec["key"]]
        conversion.worker.write(conversion.build(target), directory)
    except Exception as exc:
        (directory / "error.txt").write_text(one_line(exc))
        sys.exit(1)
    (directory / "seconds.txt").write_text(f"{time.perf_counter() - start:.6f}")


if __name__ == "__main__":
    main()
