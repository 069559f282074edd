"""The candidate backends. Adding one is a new file here plus one line in `BACKENDS`."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from .base import Backend, Target
from .keras_eager import KerasEager
from .litert import litert_variants
from .onnxruntime import onnxruntime_cpu_variants
from .onnxruntime_gpu import onnxruntime_gpu_variants
from .openvino import OpenVinoCpu, OpenVinoCpuBf16
from .tensorrt import TensorRtEngine, TensorRtEngineFp16
from .tf_function import TfFunction
from .tf_head import TensorFlowOnly, TfHeadChain
from .tf_trt import TfTrt
from .tf_xla import TfXla

__all__ = [
    "BACKENDS",
    "GPU_BACKENDS",
    "Backend",
    "KerasEager",
    "Target",
    "TensorFlowOnly",
    "TfFunction",
    "TfHeadChain",
    "backend_class",
]

# The GPU candidates: without a GPU each is `unavailable` with its reason (gpu.py).
_GPU: dict[str, Callable[[], Backend]] = {
    **onnxruntime_gpu_variants(),
    TensorRtEngine.name: TensorRtEngine,
    TensorRtEngineFp16.name: TensorRtEngineFp16,
    TfTrt.name: TfTrt,
}
GPU_BACKENDS: tuple[str, ...] = tuple(_GPU)

# Every candidate optimize() knows, by name, in the order it tries them: a factory each.
# The reference (keras-eager, or "original" for non-Keras models) is always tried first.
BACKENDS: dict[str, Callable[[], Backend]] = {
    TfFunction.name: TfFunction,
    TfXla.name: TfXla,
    **onnxruntime_cpu_variants(),
    OpenVinoCpu.name: OpenVinoCpu,
    f"{OpenVinoCpu.name}:throughput": partial(OpenVinoCpu, "THROUGHPUT", callers_only=True),
    OpenVinoCpuBf16.name: OpenVinoCpuBf16,
    **litert_variants(),
    **_GPU,  # after every CPU one
}


def backend_class(kind: str) -> type[Backend] | None:
    """The backend class named `kind` (a saved manifest's `backend.kind`), or None.

    Variants share a class: "onnxruntime-cpu:threads=1" is an OnnxRuntimeCpu named
    "onnxruntime-cpu" plus its settings. BACKENDS holds classes and functools.partial's of them.
    """
    classes: dict[str, type[Backend]] = {KerasEager.name: KerasEager, TfHeadChain.name: TfHeadChain}
    for factory in BACKENDS.values():
        cls = getattr(factory, "func", factory)
        classes.setdefault(cls.name, cls)
    return classes.get(kind)


# A split model's chain loads its body's backend by kind through this registry.
TfHeadChain.body_class = staticmethod(backend_class)
