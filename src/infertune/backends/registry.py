"""The registry of candidate backends: every family and its variants, by name.

A family is one backend class with its variants (settings such as a thread count, named
`family:variant`), and its rank among the families for each kind of model: the order
optimize() tries them in under a time budget, most likely to win first (pipeline/planning.py:
a compute-bound model is won by the best kernels, an overhead-bound one by the lowest
per-call floor). A family without a rank comes after the ranked ones, in the order of these
lines; reduced precision after every exact one.

Adding a backend: its file in backends/ (a subclass of base.Backend; a runtime that spans
files has a folder of its own) and its line in FAMILIES.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from .base import Backend
from .keras_eager import KerasEager
from .litert.backend import litert_variants
from .litert.int8 import (
    LiteRTDynamicInt8,
    LiteRTInt8,
)
from .onnxruntime.cpu import (
    OnnxRuntimeCpuInt8,
    OnnxRuntimeCpuInt8Static,
    onnxruntime_cpu_variants,
)
from .onnxruntime.cuda import (
    OnnxRuntimeCuda,
    OnnxRuntimeCudaFp16,
    OnnxRuntimeTensorrt,
    OnnxRuntimeTensorrtFp16,
    cuda_variants,
)
from .openvino.cpu import (
    OpenVinoCpu,
    OpenVinoCpuBf16,
    OpenVinoCpuInt8,
)
from .tensorrt.engine import (
    TensorRtEngine,
    TensorRtEngineFp16,
)
from .tf_function import TfFunction
from .tf_head import TfHeadChain
from .tf_trt import TfTrt
from .tf_xla import TfXla

__all__ = [
    "BACKENDS",
    "FAMILIES",
    "GPU_BACKENDS",
    "Family",
    "backend_class",
    "family_of",
    "family_rank",
]


def family_of(name: str) -> str:
    """A candidate's family: its name without the variant (`onnxruntime-cpu:threads=1`)."""
    return name.split(":")[0]


@dataclass(frozen=True)
class Family:
    """A backend class and its variants, by candidate name, and its rank among the families
    for a compute-bound and an overhead-bound model (0 first; None: after the ranked ones)."""

    variants: dict[str, Callable[[], Backend]]
    compute: int | None = None
    overhead: int | None = None
    gpu: bool = False  # without a GPU each is `unavailable` with its reason (system/gpu.py)

    @property
    def name(self) -> str:
        return family_of(next(iter(self.variants)))


def _one(cls: type[Backend]) -> dict[str, Callable[[], Backend]]:
    return {cls.name: cls}


# Every candidate optimize() knows, one family a line, GPU ones after every CPU one. The
# reference (keras-eager, or "original" for non-Keras models) is not here: always tried first.
FAMILIES: tuple[Family, ...] = (
    Family(_one(TfFunction), compute=4, overhead=4),
    Family(_one(TfXla), compute=3, overhead=3),
    Family(onnxruntime_cpu_variants(), compute=2, overhead=0),
    Family(_one(OnnxRuntimeCpuInt8)),
    Family(_one(OnnxRuntimeCpuInt8Static)),
    Family({OpenVinoCpu.name: OpenVinoCpu,
            f"{OpenVinoCpu.name}:throughput": partial(OpenVinoCpu, "THROUGHPUT",
                                                      callers_only=True)},
           compute=0, overhead=2),
    Family(_one(OpenVinoCpuBf16)),
    Family(_one(OpenVinoCpuInt8)),
    Family(litert_variants(), compute=1, overhead=1),
    Family(_one(LiteRTInt8)),
    Family(_one(LiteRTDynamicInt8)),
    Family(cuda_variants(OnnxRuntimeCuda), gpu=True),
    Family(cuda_variants(OnnxRuntimeCudaFp16), gpu=True),
    Family(_one(OnnxRuntimeTensorrt), gpu=True),
    Family(_one(OnnxRuntimeTensorrtFp16), gpu=True),
    Family(_one(TensorRtEngine), gpu=True),
    Family(_one(TensorRtEngineFp16), gpu=True),
    Family(_one(TfTrt), gpu=True),
)  # fmt: skip

# Every candidate by name, in the order of FAMILIES: a factory each.
BACKENDS: dict[str, Callable[[], Backend]] = {
    name: factory for family in FAMILIES for name, factory in family.variants.items()
}
GPU_BACKENDS: tuple[str, ...] = tuple(
    name for family in FAMILIES if family.gpu for name in family.variants
)
_RANKS = {family.name: family for family in FAMILIES}


def family_rank(name: str, regime: str) -> int | None:
    """The rank of candidate `name`'s family for a model of `regime` ("compute" or
    "overhead"), None where it has none."""
    family = _RANKS.get(family_of(name))
    return None if family is None else getattr(family, regime)


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
