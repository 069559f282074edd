"""The model called as the user calls it: `model(x)`. The reference and the baseline."""

from __future__ import annotations

import numpy as np

from ..inputs import to_numpy
from ..structure import flatten
from .base import Backend, Target

__all__ = ["KerasEager"]


class KerasEager(Backend):
    """Eager `model(x)` for Keras models; for a tf.Module or tf.function, the call as given."""

    name = "keras-eager"

    def __init__(self, name: str = "keras-eager"):
        self.name = name  # "original" for models that are not Keras

    def prepare(self, target: Target) -> None:
        self._call = target.source
        self._pack = target.signature.structure.packer()

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        leaves, _ = flatten(self._call(self._pack(inputs)))
        return [to_numpy(leaf) for leaf in leaves]

    def close(self) -> None:
        self._call = None
