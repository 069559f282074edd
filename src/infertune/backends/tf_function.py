"""`tf.function` around the model, traced once for any batch size (None batch dimension)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..models import tensor_specs
from .base import Backend, Target

__all__ = ["SAVEDMODEL_DIR", "TfFunction", "load_flat_savedmodel", "save_flat_savedmodel"]

SAVEDMODEL_DIR = "model.savedmodel"  # Triton's name for a SavedModel in a model version


class TfFunction(Backend):
    """The model as one TensorFlow graph: no per-op Python dispatch, no per-call retracing."""

    name = "tf-function"
    relative_cost = 1.5  # one trace, and its first call
    jit_compile = False
    runtime_packages = ("tensorflow",)

    def prepare(self, target: Target) -> None:
        import tensorflow as tf

        if self.jit_compile:
            self._fn = tf.function(
                target.source.graph_function(target.signature),
                input_signature=tensor_specs(target.signature),
                jit_compile=True,
            )
            self._fn.get_concrete_function()  # trace now: tracing belongs to prepare_s
        else:  # the very function the ONNX export and the TFLite conversion start from
            self._fn, _ = target.traced()
        self._owner = target.source.owner  # its variables are what the saved function reads

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        return [tensor.numpy() for tensor in self._fn(*inputs)]

    def close(self) -> None:
        self._fn = None
        self._owner = None

    def save_artifact(self, directory: Path) -> dict:
        """A SavedModel of the traced function (XLA's jit_compile attribute included)."""
        save_flat_savedmodel(self._fn, self._owner, directory / SAVEDMODEL_DIR)
        return {"dir": SAVEDMODEL_DIR}

    @classmethod
    def load_artifact(cls, directory: Path, settings: dict, target: Target) -> Backend:
        backend = cls()
        backend._owner = load_flat_savedmodel(directory / settings["dir"])
        backend._fn = backend._owner.fn
        return backend


def save_flat_savedmodel(fn: Any, owner: Any, path: Path) -> None:
    """Save a flat-in/flat-out tf.function (with its input_signature) as a SavedModel.

    The function is kept as `fn` and as the serving_default signature (inputs in_0, in_1, ...;
    outputs output_0, output_1, ...: what TensorFlow Serving and Triton call). `owner` (the
    model) is tracked beside it so that every variable the function reads is saved.
    """
    import tensorflow as tf

    module = tf.Module()
    module.model = owner
    module.fn = fn
    tf.saved_model.save(
        module, str(path), signatures={"serving_default": fn.get_concrete_function()}
    )


def load_flat_savedmodel(path: Path) -> Any:
    """The object `save_flat_savedmodel` wrote; call its `fn` with flat inputs."""
    import tensorflow as tf

    return tf.saved_model.load(str(path))
