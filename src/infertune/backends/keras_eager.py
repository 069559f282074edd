"""The model called as the user calls it: `model(x)`. The reference and the baseline."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np

from ..model.inputs import (
    InputSignature,
    to_numpy,
)
from ..model.outputs import OutputSignature
from ..model.source import (
    inference_call,
    load_model,
    tensor_specs,
)
from ..model.structure import flatten
from .base import Backend, Target
from .tf_function import (
    SAVEDMODEL_DIR,
    load_flat_savedmodel,
    save_flat_savedmodel,
    savedmodel_triton_plan,
    tensorflow_missing,
)
from .triton_plan import TritonPlan

__all__ = ["KerasEager"]

KERAS_FILE = "model.keras"


class KerasEager(Backend):
    """Eager `model(x)` for Keras models; for a tf.Module or tf.function, the call as given."""

    name = "keras-eager"
    relative_cost = 0.0
    memory_factor = 0.0  # the model itself
    runtime_packages = ("tensorflow", "keras")
    triton_serves = True

    def __init__(self, name: str = "keras-eager"):
        self.name = name  # "original" for models that are not Keras

    def available(self) -> str | None:
        return tensorflow_missing()

    def prepare(self, target: Target) -> None:
        self._call = target.source
        self._pack = target.signature.structure.packer()
        self._target = target  # what save_artifact writes

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        leaves, _ = flatten(self._call(self._pack(inputs)))
        return [to_numpy(leaf) for leaf in leaves]

    def close(self) -> None:
        self._call = None
        self._target = None

    def save_artifact(self, directory: Path) -> dict:
        """A Keras model as a .keras file (Keras' own format, loaded in safe mode); a tf.Module
        or tf.function as a SavedModel of its flat traced call."""
        import tensorflow as tf

        source = self._target.source
        if source.is_keras:
            module = type(source.owner).__module__.split(".")[0]  # "keras" or "tf_keras"
            source.owner.save(directory / KERAS_FILE)
            return {"format": "keras", "file": KERAS_FILE, "module": module, "name": self.name}
        signature = self._target.signature
        fn = tf.function(source.graph_function(signature), input_signature=tensor_specs(signature))
        save_flat_savedmodel(fn, source.owner, directory / SAVEDMODEL_DIR)
        return {"format": "savedmodel", "dir": SAVEDMODEL_DIR, "name": self.name}

    @classmethod
    def triton_plan(
        cls, directory: Path, entry: dict, inputs: InputSignature, outputs: OutputSignature
    ) -> TritonPlan:
        """Triton's TensorFlow backend, on a SavedModel of the model's flat traced call (a
        .keras result is traced into one first: Triton has no eager mode)."""
        settings = entry["settings"]
        if settings["format"] == "keras":
            source = _keras_as_savedmodel(directory / settings["file"], inputs)

            def write(version_dir: Path) -> None:
                shutil.move(str(source), str(version_dir / SAVEDMODEL_DIR))
                shutil.rmtree(source.parent, ignore_errors=True)

        else:
            source = directory / settings["dir"]

            def write(version_dir: Path) -> None:
                shutil.copytree(source, version_dir / SAVEDMODEL_DIR)

        plan = savedmodel_triton_plan(source, write, inputs, outputs)
        plan.notes.insert(
            0, "the model's own call runs as a TensorFlow graph (Triton has no eager mode)"
        )
        return plan

    @classmethod
    def load_artifact(cls, directory: Path, settings: dict, target: Target) -> Backend:
        backend = cls(settings["name"])
        backend._pack = target.signature.structure.packer()
        if settings["format"] == "keras":
            if settings["module"] == "tf_keras":
                import tf_keras as keras
            else:
                import keras
            # safe_mode (the default): a Lambda layer's Python code is refused, not run.
            model = keras.models.load_model(directory / settings["file"], compile=False)
            backend._call = inference_call(model)  # as tuned: model(x, training=False)
        else:
            loaded = load_flat_savedmodel(directory / settings["dir"])
            backend._loaded = loaded
            backend.run = lambda inputs: [tensor.numpy() for tensor in loaded.fn(*inputs)]
        return backend


def _keras_as_savedmodel(file: Path, inputs: InputSignature) -> Path:
    """A .keras model as a SavedModel of its flat traced call, in a temporary directory."""
    import tensorflow as tf

    source = load_model(file)
    fn = tf.function(source.graph_function(inputs), input_signature=tensor_specs(inputs))
    path = Path(tempfile.mkdtemp(prefix="infertune-keras-")) / SAVEDMODEL_DIR
    save_flat_savedmodel(fn, source.owner, path)
    return path
