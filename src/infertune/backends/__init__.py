"""The candidate backends. Adding one is a new file here plus one line in `BACKENDS`."""

from __future__ import annotations

from collections.abc import Callable

from .base import Backend, Target
from .keras_eager import KerasEager
from .litert import litert_variants
from .onnxruntime import onnxruntime_cpu_variants
from .openvino import OpenVinoCpu, OpenVinoCpuBf16
from .tf_function import TfFunction
from .tf_xla import TfXla

__all__ = ["BACKENDS", "Backend", "KerasEager", "Target"]

# Every candidate optimize() knows, by name, in the order it tries them: a factory each.
# The reference (keras-eager, or "original" for non-Keras models) is always tried first.
BACKENDS: dict[str, Callable[[], Backend]] = {
    TfFunction.name: TfFunction,
    TfXla.name: TfXla,
    **onnxruntime_cpu_variants(),
    OpenVinoCpu.name: OpenVinoCpu,
    OpenVinoCpuBf16.name: OpenVinoCpuBf16,
    **litert_variants(),
}
