"""A package: everything tuning needs, made once with TensorFlow where the model is, and tuned
on the machine that serves (another CPU, a GPU) without TensorFlow, Keras or the model.

`make_package` (with TensorFlow) writes a directory:

    manifest.json        format and version, infertune's version, the model's description,
                         the input and output signatures, the options that decide the result,
                         the weights' bytes, what planning needs (the arithmetic, op types,
                         trace and call times), each conversion's files and settings (or why
                         it failed), what needs TensorFlow on the target (a split model),
                         the environment it was made in, and the sha256 of every other file
    onnx/                the ONNX export (model.onnx, model.onnx.data past 2 GB)
    tflite/, tflite-fixed/, tflite-int8/, tflite-dynamic-int8/
                         the TFLite conversions (the int8 ones where int8 is allowed)
    data/checks.npz      the sample and the verification inputs, and the model's outputs on
                         each: what every candidate is verified against
    data/calibration.npz the calibration inputs and the model's outputs on them
    data/accuracy.npz    the labelled data and the model's predictions on it

Every quantization that needs no TensorFlow (ONNX Runtime's static int8, NNCF's int8 for
OpenVINO) is made on the target, from the stored export and calibration inputs: where it
runs. `tune_package` runs the pipeline's stages from these files: the candidates that need
the model (its own call, tf.function, XLA) are `unavailable` with that reason; the others
are prepared from the stored conversions, verified against the stored outputs with the same
rule as optimize(), measured and selected as there. A package refuses to be read when a file
differs from its manifest, or when its format is newer than this infertune's.
"""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._version import __version__
from ..accuracy import METRICS, Accuracy
from ..backends import Backend
from ..backends.litert.convert import Converted
from ..backends.registry import BACKENDS
from ..errors import ArtifactError, ModelError, OptionError, one_line
from ..export.onnx import read_onnx, write_onnx
from ..export.registry import shared
from ..model.inputs import InputSignature
from ..model.outputs import OutputSignature
from ..model.structure import Structure
from ..model.target import Target
from ..model.traffic import Traffic
from ..options import DEFAULTS, Options
from ..precision.data import LabelledBatch, arrays_batches, batches_arrays, numbered
from ..precision.gate import PrecisionData
from ..report import Report
from ..report.progress import Progress
from ..result.choice import Choice
from ..result.saved import check_target, file_sha256
from ..system.environment import collect_environment
from .contest import contest
from .frame import Frame, Model, frame_model
from .padding import PaddingCheck
from .planning import Probe
from .reference import Check, tuned_batch_sizes
from .traffic_plan import TrafficFrame

__all__ = ["FORMAT", "FORMAT_VERSION", "Package", "is_package", "make_package", "tune_package"]

FORMAT = "infertune-package"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
# The TFLite conversions a package carries (the int8 ones where int8 is allowed).
_TFLITE = ("tflite", "tflite-fixed")
_TFLITE_INT8 = ("tflite-int8", "tflite-dynamic-int8")
# Options a package's tuning may set (how to tune here); the others decide the result and
# are the package's.
TUNING_HERE = ("backends", "time_budget_s", "isolation", "candidate_timeout_s")


# -- making one (with TensorFlow) ------------------------------------------------------------
def make_package(model: Model, options: Options, path: Path, progress: Progress) -> Path:
    """Write the package of `model` (loaded, its data read) tuned with `options` to `path`
    (new or an empty directory)."""
    if options.accuracy is not None and not isinstance(options.accuracy.metric, str):
        raise OptionError(
            f"a package keeps a named metric only ({', '.join(METRICS)}): a function cannot "
            f"be stored. Received: metric={options.accuracy.name!r}."
        )
    check_target(path)
    frame = frame_model(model, options, progress)
    target, signature, checks, outputs = frame.target, frame.signature, frame.checks, frame.outputs
    structure, planned = target.output_structure, frame.probe
    needs_tensorflow = None
    if signature.strings:
        needs_tensorflow = "the model takes strings, which only TensorFlow runs"
    elif frame.split is not None:
        needs_tensorflow = f"the model is {frame.split.describe()}: its head runs in TensorFlow"
    data = frame.precision or PrecisionData(accuracy=options.accuracy)
    if data.calibration and not data.calibration_reference:
        data.calibration_reference = [data.reference_call(b) for b in data.calibration]
    data.complete()  # every prediction by the model itself: the package stores them
    path.mkdir(parents=True, exist_ok=True)
    try:
        conversions = _write_conversions(target, options, path, progress, data.calibration)
        _write_arrays(path / "data" / "checks.npz", _check_arrays(checks))
        traffic = frame.traffic
        if traffic is not None:
            stored = [*traffic.checks.values(), *traffic.batch_checks.values()]
            _write_arrays(path / "data" / "traffic.npz", _check_arrays(stored))
        if data.calibration:
            arrays = batches_arrays("in", data.calibration) | batches_arrays(
                "ref", data.calibration_reference
            )
            _write_arrays(path / "data" / "calibration.npz", arrays)
        if data.labelled:
            arrays = {f"label_{i}": b.labels for i, b in enumerate(data.labelled)}
            arrays |= batches_arrays("in", [b.inputs for b in data.labelled])
            arrays |= {f"pred_{i}": p for i, p in enumerate(data.predictions)}
            _write_arrays(path / "data" / "accuracy.npz", arrays)
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "infertune": __version__,
            "made_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "model": frame.description,
            "inputs": signature.to_dict(),
            "structure": structure.to_dict(),
            "dtypes": [np.dtype(d).str for d in target.output_dtypes],
            "outputs": outputs.to_dict(),
            "options": options.saved(),
            "accuracy_output": data.output if data.accuracy is not None else None,
            "weights_bytes": target.weights_bytes(),
            "probe": {
                "flops": planned.flops,
                "flops_note": planned.flops_note,
                "op_types": dict(planned.op_types),
                "trace_s": planned.trace_s,
                "call_s": planned.call_s,
                "checks": planned.checks,
            },  # fmt: skip
            "checks": [c.label for c in checks],
            "traffic": _traffic_manifest(traffic) if traffic is not None else None,
            "conversions": conversions,
            "needs_tensorflow": needs_tensorflow,
            "environment": collect_environment(),
        }
        manifest["files"] = _hash_files(path)
        (path / MANIFEST).write_text(json.dumps(manifest, indent=1, default=str))
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    progress.say(f"package written to {path}")
    return path


def _write_conversions(
    target: Target, options: Options, path: Path, progress: Progress, calibration: Any
) -> dict:
    """Each conversion that needs TensorFlow, written under its key (or why it failed)."""
    keys = ["onnx", *_TFLITE]
    if "int8" in options.precision:
        keys += [k for k in _TFLITE_INT8 if k != "tflite-int8" or calibration]
    written: dict[str, dict] = {}
    for key in keys:
        try:
            with progress.timed(f"package: {key}", text=f"converting: {key}"):
                value = shared(target, key)
        except Exception as exc:  # the candidates that need it are failed there, saying why
            written[key] = {"failed": one_line(exc)}
            continue
        directory = path / key
        directory.mkdir()
        if value is None:  # tflite-fixed: the free conversion serves the sample's shapes
            written[key] = {"none": True}
        elif key == "onnx":
            written[key] = {**write_onnx(directory, value, value), "width": value.parallel_width}
        else:
            value.write(directory / "model.tflite")
            written[key] = {
                "file": "model.tflite",
                "output_names": list(value.output_names),
                "rewrites": list(value.rewrites),
            }
    return written


def _traffic_manifest(traffic: TrafficFrame) -> dict:
    """What tuning from the package needs of the traffic: the requests' sizes, the pad values,
    the padding check, the lengths to measure at and the held-out rows; the requests at each
    length with the model's outputs are in data/traffic.npz, in the order of `checked`, then
    those at another batch size, in the order of `checked_batch`."""
    return {
        "traffic": traffic.traffic.to_dict(),
        "pad_values": [_plain(v) for v in traffic.pad_values],
        "dim_index": traffic.dim_index,
        "padding": traffic.padding.to_dict() if traffic.padding is not None else None,
        "lengths": traffic.lengths,
        "checked": list(traffic.checks),
        "checked_batch": list(traffic.batch_checks),  # after `checked` in traffic.npz
        "held_out": traffic.held_out,
        "why_exact": traffic.why_exact,
    }


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _check_arrays(checks: list[Check]) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    for i, check in enumerate(checks):
        arrays |= {f"in_{i}_{j}": a for j, a in enumerate(check.inputs)}
        arrays |= {f"ref_{i}_{j}": a for j, a in enumerate(check.reference)}
    return arrays


def _write_arrays(file: Path, arrays: dict[str, np.ndarray]) -> None:
    file.parent.mkdir(exist_ok=True)
    np.savez(file, **arrays)


def _hash_files(path: Path) -> dict[str, str]:
    return {
        str(file.relative_to(path)): file_sha256(file)
        for file in sorted(path.rglob("*"))
        if file.is_file() and file.name != MANIFEST
    }


# -- reading one (without TensorFlow) ------------------------------------------------------
def is_package(path: Any) -> bool:
    """Whether `path` is a package's directory (its manifest names the format)."""
    try:
        manifest = Path(path) / MANIFEST
        return manifest.is_file() and json.loads(manifest.read_text()).get("format") == FORMAT
    except (OSError, ValueError, TypeError):
        return False


@dataclass
class Package:
    """A package read and checked: its manifest and directory."""

    path: Path
    manifest: dict

    @classmethod
    def read(cls, path: Path) -> Package:
        """The package at `path`; ArtifactError where it is not one, was changed, or was
        written by a newer infertune."""
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except (OSError, ValueError) as exc:
            raise ArtifactError(f"'{path}' is not an infertune package: {one_line(exc)}") from exc
        if manifest.get("format") != FORMAT:
            raise ArtifactError(f"'{path}' is not an infertune package (no {FORMAT} manifest).")
        version = manifest.get("format_version")
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise ArtifactError(
                f"The package '{path}' has format version {version}, newer than this "
                f"infertune's ({FORMAT_VERSION}, infertune {__version__}): upgrade infertune "
                f"where it is tuned (it was made by infertune {manifest.get('infertune')})."
            )
        files = manifest.get("files", {})
        found = _hash_files(path)
        changed = sorted(n for n in files if found.get(n) != files[n])
        added = sorted(set(found) - set(files))
        if changed or added:
            what = "; ".join(
                part for part in (
                    f"changed or missing: {', '.join(changed[:5])}" if changed else "",
                    f"not in its manifest: {', '.join(added[:5])}" if added else "",
                ) if part
            )  # fmt: skip
            raise ArtifactError(f"The package '{path}' differs from its manifest ({what}).")
        return cls(path, manifest)

    @property
    def signature(self) -> InputSignature:
        return InputSignature.from_dict(self.manifest["inputs"])

    def arrays(self, name: str) -> dict[str, np.ndarray]:
        file = self.path / "data" / f"{name}.npz"
        if not file.is_file():
            return {}
        with np.load(file, allow_pickle=False) as data:
            return {key: data[key] for key in data.files}

    def checks(self) -> list[Check]:
        arrays = self.arrays("checks")
        labels = self.manifest["checks"]
        return [
            Check(label, numbered(arrays, f"in_{i}"), numbered(arrays, f"ref_{i}"))
            for i, label in enumerate(labels)
        ]

    def precision(self, options: Options) -> PrecisionData:
        """What the gate judges reduced precision by, from the stored data."""
        data = PrecisionData(accuracy=options.accuracy)
        calibration = self.arrays("calibration")
        data.calibration = arrays_batches(calibration, "in")
        data.calibration_reference = arrays_batches(calibration, "ref")
        labelled = self.arrays("accuracy")
        if options.accuracy is not None and labelled:
            inputs = arrays_batches(labelled, "in")
            data.labelled = [
                LabelledBatch(batch, labelled[f"label_{i}"]) for i, batch in enumerate(inputs)
            ]
            data.predictions = [labelled[f"pred_{i}"] for i in range(len(inputs))]
            data.output = self.manifest["accuracy_output"] or 0
        return data

    def target(self, options: Options) -> Target:
        """The Target the candidates are prepared on: no model, the conversions preloaded."""
        manifest = self.manifest
        target = Target(
            None,
            self.signature,
            Structure.from_dict(manifest["structure"]),
            [np.dtype(d) for d in manifest["dtypes"]],
            options.objective,
            options.concurrency,
        )
        target.from_package = True
        target.assume_weights(int(manifest["weights_bytes"]))
        for key, settings in manifest["conversions"].items():
            directory = self.path / key
            if "failed" in settings:
                target.preload_failure(key, settings["failed"])
            elif settings.get("none"):
                target.preload(key, None)
            elif key == "onnx":
                exported = read_onnx(directory, settings)
                object.__setattr__(exported, "parallel_width", settings.get("width"))
                target.preload(key, exported)
            else:
                content = (directory / settings["file"]).read_bytes()
                names, rewrites = tuple(settings["output_names"]), tuple(settings["rewrites"])
                target.preload(key, Converted(content, names, rewrites))
        for key in (*_TFLITE, *_TFLITE_INT8):
            if key not in manifest["conversions"]:
                target.preload_failure(key, "not in the package (int8 was not allowed there)")
        return target

    def frame(self, options: Options) -> Frame:
        """The frame the contest runs on: the stored checks, outputs, probe and data, the
        conversions preloaded, the candidates that run from files (those that need the
        model `unavailable`, saying so)."""
        manifest = self.manifest
        signature = self.signature
        checks = self.checks()
        target = self.target(options)
        precision = self.precision(options)
        target.calibration = precision.calibration or None
        batch_sizes = tuned_batch_sizes(options.batch_sizes, signature)
        precision.batch_sizes = [n for n in batch_sizes or [] if n != signature.sample_batch]
        stored = manifest["probe"]
        planned = Probe(
            stored["flops"], stored["flops_note"], Counter(stored["op_types"]),
            stored["trace_s"], stored["call_s"], stored["checks"],
        )  # fmt: skip
        note = (
            f"tuned from the package '{self.path}' (made {manifest['made_at']} by infertune "
            f"{manifest['infertune']}, on {manifest['environment'].get('cpu', {}).get('model')}); "
            f"verified against the model's outputs stored there"
        )
        return Frame(
            f"{manifest['model']} (package)", signature, checks[0].inputs, target, checks,
            OutputSignature.from_dict(manifest["outputs"]), planned,
            package_candidates(options), batch_sizes, precision, traffic=self.traffic(),
            notes=[note],
        )  # fmt: skip

    def traffic(self) -> TrafficFrame | None:
        """The traffic as the frame left it, from the manifest and data/traffic.npz."""
        stored = self.manifest.get("traffic")
        if not stored:
            return None
        arrays = self.arrays("traffic")
        checks = {
            int(n): Check(f"a request of length {n}", numbered(arrays, f"in_{i}"),
                          numbered(arrays, f"ref_{i}"))
            for i, n in enumerate(stored["checked"])
        }  # fmt: skip
        batch_checks = {}
        for i, n in enumerate(stored.get("checked_batch", []), start=len(checks)):
            inputs = numbered(arrays, f"in_{i}")
            label = f"a request of length {n} at batch {inputs[0].shape[0]}"
            batch_checks[int(n)] = Check(label, inputs, numbered(arrays, f"ref_{i}"))
        padding = stored["padding"]
        return TrafficFrame(
            Traffic.from_dict(stored["traffic"]),
            tuple(stored["pad_values"]),
            stored["dim_index"],
            PaddingCheck.from_dict(padding) if padding else None,
            [int(n) for n in stored["lengths"]],
            checks,
            batch_checks,
            [int(r) for r in stored["held_out"]],
            stored["why_exact"],
        )


# -- tuning one ------------------------------------------------------------------------------
class NeedsModel(Backend):
    """A candidate that needs the model itself (its own call, tf.function, XLA), where only
    its conversions are here: `unavailable`, saying so."""

    name = "needs-model"

    def __init__(self, name: str, precision: str = "fp32"):
        self.name, self.precision = name, precision

    def available(self) -> str | None:
        return (
            "needs the model and TensorFlow: a package carries the model's conversions, not "
            "the model (tune with optimize(model, x) where they are)"
        )

    def prepare(self, target: Target) -> None:
        raise RuntimeError(self.available())

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        raise RuntimeError(self.available())


def package_candidates(options: Options) -> list[Backend]:
    """The candidates of a package's tuning: those that run from its conversions, the others
    (the model's own call, tf.function, XLA) `unavailable`."""
    backends: list[Backend] = [NeedsModel("keras-eager")]
    wanted = list(BACKENDS) if options.backends is None else list(options.backends)
    for name in wanted:
        backend = name if isinstance(name, Backend) else BACKENDS[name]()
        if not backend.conversions and not isinstance(name, Backend):
            backend = NeedsModel(backend.name, backend.precision)
        backends.append(backend)
    return backends


def package_options(package: Package, given: dict) -> Options:
    """The package's options, with those that say how to tune here (TUNING_HERE) taken from
    `given`; OptionError for a given option that decides the result and differs."""
    stored = package.manifest["options"]
    values = Options.from_saved(stored)
    accuracy_settings = stored.get("accuracy")
    accuracy = None
    if accuracy_settings is not None:
        accuracy = Accuracy(
            data=None,
            metric=accuracy_settings["metric"],
            max_drop=accuracy_settings["max_drop"],
            relative=accuracy_settings["relative"],
            higher_is_better=accuracy_settings["higher_is_better"],
            output=accuracy_settings["output"],
        )
    for name, value in given.items():
        if name in TUNING_HERE:
            continue
        if value != getattr(DEFAULTS, name) and value != getattr(values, name):
            raise OptionError(
                f"{name}={value!r} decides the result, and the package was made with "
                f"{name}={getattr(values, name)!r}: make the package with it "
                f"(infertune.package(..., {name}=...)). Here only {', '.join(TUNING_HERE)} "
                f"may be set."
            )
    here = {name: given[name] for name in TUNING_HERE if name in given}
    checked = Options.checked(
        **{n: getattr(values, n) for n in ("rtol", "atol", "objective", "precision")},
        batch_sizes=values.batch_sizes,
        latency_budget_ms=values.latency_budget_ms,
        concurrency=values.concurrency,
        reference=values.reference,
        **here,
    )
    return _with(
        checked,
        accuracy=accuracy,
        data_digest=stored.get("data"),
        traffic_digest=stored.get("traffic"),
        pad_value=stored.get("pad_value", 0),
        free_dims=stored.get("free_dims"),
    )


def _with(options: Options, **fields: Any) -> Options:
    import dataclasses

    return dataclasses.replace(options, **fields)


def tune_package(package: Package, options: Options, progress: Progress) -> tuple[Choice, Report]:
    """The pipeline's contest on a package: prepare, verify (against the stored outputs),
    measure and select every candidate that runs from its files here."""
    manifest = package.manifest
    if manifest.get("needs_tensorflow"):
        raise ModelError(
            f"This package needs TensorFlow where it is tuned ({manifest['needs_tensorflow']}): "
            f"tune the model itself with optimize(model, x) there."
        )
    return contest(package.frame(options), options, progress)
