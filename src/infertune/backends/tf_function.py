"""`tf.function` around the model, traced once for any batch size (None batch dimension)."""

from __future__ import annotations

import numpy as np

from ..models import tensor_specs
from .base import Backend, Target

__all__ = ["TfFunction"]


class TfFunction(Backend):
    """The model as one TensorFlow graph: no per-op Python dispatch, no per-call retracing."""

    name = "tf-function"
    jit_compile = False

    def prepare(self, target: Target) -> None:
        import tensorflow as tf

        specs = tensor_specs(target.signature)
        self._fn = tf.function(
            target.source.graph_function(target.signature),
            input_signature=specs,
            jit_compile=self.jit_compile,
        )
        self._fn.get_concrete_function()  # trace now: tracing belongs to prepare_s

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        return [tensor.numpy() for tensor in self._fn(*inputs)]

    def close(self) -> None:
        self._fn = None
