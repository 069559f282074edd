"""The candidate backends. Adding one is a new file here plus one line in `BACKENDS`."""

from __future__ import annotations

from .base import Backend, Target
from .keras_eager import KerasEager
from .onnxruntime import OnnxRuntimeCpu
from .tf_function import TfFunction
from .tf_xla import TfXla

__all__ = ["BACKENDS", "Backend", "KerasEager", "Target"]

# Every candidate that optimize() tries by default, in the order it tries them.
# The reference (keras-eager, or "original" for non-Keras models) is always tried first.
BACKENDS: dict[str, type[Backend]] = {
    backend.name: backend
    for backend in (
        TfFunction,
        TfXla,
        OnnxRuntimeCpu,
    )
}
