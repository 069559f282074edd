"""GPU decisions that need no GPU: availability, TensorRT profiles, engine keys, IO binding.

Every GPU candidate asks `reason_unavailable(kind, facts)` whether it can run here. The facts
(`GpuFacts`) are gathered without importing a GPU runtime or TensorFlow where there is no
GPU: the driver's GPUs from /proc, which distributions installed the runtimes' modules and
which TensorRT libraries ONNX Runtime's provider links from the files themselves
(system/gpu_libraries.py), ONNX Runtime's providers and TensorFlow's build only where those modules
are already imported. So on a machine without a GPU every GPU candidate says why it cannot
run at no noticeable cost (tests/test_gpu.py times it), and the decisions are plain functions
of the facts, tested with facts a CPU machine cannot produce. Where the driver lists a GPU,
`tensorrt` and cuda-python are imported once to know they load (a package whose libraries
are missing is installed but does not import), and so is onnxruntime for its providers.

What a backend builds on a GPU is planned here too, as values: the min/opt/max shapes of a
TensorRT optimization profile (`profile_shapes`), the key an engine is cached under
(`engine_cache_key`), the inputs and outputs ONNX Runtime's IO binding binds and whether a
call may replay a CUDA graph (`IoBindingPlan`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..model.inputs import InputSignature
from .environment import (
    gpu_devices,
    install_hint,
    package_version,
)
from .gpu_libraries import (
    find_library,
    installed_by,
    ort_tensorrt_links,
)

__all__ = [
    "CPU_EXTRA",
    "GPU_EXTRA",
    "TENSORRT_EXTRA",
    "GpuFacts",
    "IoBindingPlan",
    "NO_GPU",
    "PROFILE_MAX_BATCH",
    "Profile",
    "TfBuild",
    "default_batch_sizes",
    "engine_cache_key",
    "enable_tf_memory_growth",
    "gpu_facts",
    "iobinding_plan",
    "profile_shapes",
    "reason_unavailable",
    "tensorrt_major",
    "tf_build",
]

CPU_EXTRA = install_hint("cpu")  # onnxruntime, openvino, ai-edge-litert
GPU_EXTRA = install_hint("gpu")  # onnxruntime-gpu with its CUDA and cuDNN wheels
TENSORRT_EXTRA = install_hint("tensorrt")  # the same, TensorRT 10 and cuda-python
# Both ONNX Runtime packages write the `onnxruntime` module: remove both, install one.
ORT_FIX = f"pip uninstall -y onnxruntime onnxruntime-gpu, then {GPU_EXTRA}"

CUDA_EP = "CUDAExecutionProvider"
TENSORRT_EP = "TensorrtExecutionProvider"

NO_GPU = "no NVIDIA GPU here (the driver lists none in /proc/driver/nvidia)"

# The candidate kinds reason_unavailable() knows, and what each needs besides a GPU.
KINDS = ("onnxruntime-cuda", "onnxruntime-tensorrt", "tensorrt", "tf-trt")


@dataclass(frozen=True)
class TfBuild:
    """What TensorFlow was built with (tf.sysconfig.get_build_info())."""

    version: str
    is_cuda_build: bool
    is_tensorrt_build: bool


@dataclass(frozen=True)
class GpuFacts:
    """What decides whether a GPU candidate can run here; None where it was not looked up."""

    gpus: tuple[str, ...]  # NVIDIA GPUs the driver lists (/proc/driver/nvidia)
    # The distributions that installed the `onnxruntime` module: ("onnxruntime-gpu",) as it
    # should be; ("onnxruntime", "onnxruntime-gpu") where both wrote it (one of them won).
    onnxruntime: tuple[str, ...]
    ort_providers: tuple[str, ...] | None  # onnxruntime.get_available_providers(), if imported
    # The TensorRT libraries ONNX Runtime's TensorRT provider links ("libnvinfer.so.10", ...),
    # () where the installed ONNX Runtime has no TensorRT provider; and those found nowhere.
    ort_tensorrt_links: tuple[str, ...]
    ort_tensorrt_missing: tuple[str, ...]
    tensorrt: str | None  # the distribution and version that installed `tensorrt`, if any
    tensorrt_error: str | None  # why `import tensorrt` failed (looked at only with a GPU)
    cuda_python: str | None  # cuda-python's version where its runtime bindings are installed
    cuda_python_error: str | None  # why they failed to import (looked at only with a GPU)
    tf: TfBuild | None  # TensorFlow's build, if TensorFlow is imported

    @property
    def gpu_name(self) -> str | None:
        return self.gpus[0] if self.gpus else None


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that fails, or a broken __spec__
        return False


@functools.lru_cache(maxsize=8)
def import_error(module: str) -> str | None:
    """None if `module` imports, else its error in one line. Imported once per process: a
    GPU package whose native libraries are missing is installed but does not import."""
    try:
        importlib.import_module(module)
    except Exception as exc:  # ImportError, OSError from a library, anything its init raises
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip()
    return None


def tensorrt_major(version: str) -> int:
    """10 for "10.16.1.11"; a version that does not start with a number is a ValueError."""
    head = version.split(".", 1)[0]
    if not head.isdigit():
        raise ValueError(f"not a TensorRT version: {version!r}; expected e.g. '10.16.1.11'")
    return int(head)


def tf_build(import_tensorflow: bool = False) -> TfBuild | None:
    """TensorFlow's build info: from the imported module, or None when it is not imported
    (unless `import_tensorflow`: a candidate that runs on TensorFlow anyway may pay for it)."""
    tf = sys.modules.get("tensorflow")
    if tf is None and import_tensorflow and _importable("tensorflow"):
        import tensorflow as tf
    if tf is None:
        return None
    info = tf.sysconfig.get_build_info()
    return TfBuild(
        version=tf.__version__,
        is_cuda_build=bool(info.get("is_cuda_build", False)),
        is_tensorrt_build=bool(info.get("is_tensorrt_build", False)),
    )


def _cuda_directories() -> list[Path]:
    """The directories of the `cuda` namespace package, found without importing it."""
    try:
        spec = importlib.util.find_spec("cuda")
    except (ImportError, ValueError):
        return []
    return [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []


def cuda_runtime_module() -> str | None:
    """The module of cuda-python's CUDA runtime bindings: cuda.bindings.runtime from
    cuda-python 12.6 on (the only one in 13), cuda.cudart before; None if neither is there.
    Looked up on disk: `cuda` is not imported."""
    directories = _cuda_directories()
    if any((d / "bindings").is_dir() for d in directories):
        return "cuda.bindings.runtime"
    if any(next(d.glob("cudart*"), None) is not None for d in directories):
        return "cuda.cudart"
    return None


def _cuda_python() -> str | None:
    if cuda_runtime_module() is None:
        return None
    return package_version("cuda-bindings") or package_version("cuda-python") or "installed"


def gpu_facts(import_tensorflow: bool = False) -> GpuFacts:
    """The facts. Without a GPU no GPU runtime is imported (and TensorFlow only if asked);
    with one, tensorrt and cuda-python are imported once each where they are installed."""
    gpus = tuple(gpu_devices())
    ort = sys.modules.get("onnxruntime")
    providers = tuple(ort.get_available_providers()) if ort is not None else None
    onnxruntime = tuple(name for name, _ in installed_by("onnxruntime"))
    links = ort_tensorrt_links() if "onnxruntime-gpu" in onnxruntime else ()
    tensorrt = next((f"{name} {version}" for name, version in installed_by("tensorrt")), None)
    cuda_python = _cuda_python()
    return GpuFacts(
        gpus=gpus,
        onnxruntime=onnxruntime,
        ort_providers=providers,
        ort_tensorrt_links=links,
        ort_tensorrt_missing=tuple(name for name in links if find_library(name) is None),
        tensorrt=tensorrt,
        tensorrt_error=import_error("tensorrt") if gpus and tensorrt else None,
        cuda_python=cuda_python,
        cuda_python_error=(
            import_error(cuda_runtime_module() or "cuda.bindings.runtime")
            if gpus and cuda_python
            else None
        ),
        tf=tf_build(import_tensorflow),
    )


def _ort_missing(kind: str, facts: GpuFacts) -> list[str]:
    provider = CUDA_EP if kind == "onnxruntime-cuda" else TENSORRT_EP
    listed = facts.ort_providers is not None and provider in facts.ort_providers
    both = "onnxruntime" in facts.onnxruntime and "onnxruntime-gpu" in facts.onnxruntime
    missing = []
    if not listed and "onnxruntime-gpu" not in facts.onnxruntime:
        # Installing it beside the CPU onnxruntime would not do: one of them would win.
        fix = ORT_FIX if "onnxruntime" in facts.onnxruntime else GPU_EXTRA
        missing.append(f"onnxruntime-gpu is not installed ({fix})")
    elif not listed and facts.ort_providers is not None:
        where = (
            "onnxruntime and onnxruntime-gpu are both installed and write the same module; "
            "the CPU one won"
            if both
            else f"installed by {', '.join(facts.onnxruntime) or 'no distribution pip knows'}"
        )
        missing.append(
            f"ONNX Runtime here has no {provider} (providers: "
            f"{', '.join(facts.ort_providers)}; {where}): {ORT_FIX}"
        )
    if kind == "onnxruntime-tensorrt" and "onnxruntime-gpu" in facts.onnxruntime:
        if not facts.ort_tensorrt_links and not listed:
            missing.append("this onnxruntime-gpu has no TensorRT provider library")
        elif facts.ort_tensorrt_missing:
            needed = ", ".join(facts.ort_tensorrt_missing)
            majors = {name.rsplit(".", 1)[-1] for name in facts.ort_tensorrt_missing}
            other = ""
            if facts.tensorrt:
                other = f"; {facts.tensorrt} is installed and cannot serve it"
            missing.append(
                f"ONNX Runtime's TensorRT provider links {needed} (TensorRT "
                f"{'/'.join(sorted(majors))}), found neither in a TensorRT wheel nor on the "
                f"library search path{other} ({TENSORRT_EXTRA})"
            )
    return missing


def _missing(kind: str, facts: GpuFacts) -> list[str]:
    """What `kind` needs besides a GPU and does not find here, each with its fix."""
    if kind in ("onnxruntime-cuda", "onnxruntime-tensorrt"):
        return _ort_missing(kind, facts)
    missing = []
    if kind == "tensorrt":
        if not facts.tensorrt:
            missing.append(f"tensorrt is not installed ({TENSORRT_EXTRA})")
        elif facts.tensorrt_error:
            missing.append(
                f"{facts.tensorrt} is installed but `import tensorrt` fails "
                f"({facts.tensorrt_error}); its libraries come with tensorrt-cuNN-libs "
                f"({TENSORRT_EXTRA})"
            )
        if not facts.cuda_python:
            # TensorRT's own samples copy buffers with cuda-python; the tensorrt extra brings it
            missing.append(f"cuda-python is not installed ({TENSORRT_EXTRA} brings it)")
        elif facts.cuda_python_error:
            missing.append(
                f"cuda-python {facts.cuda_python} is installed but its CUDA runtime "
                f"bindings do not import ({facts.cuda_python_error})"
            )
    elif kind == "tf-trt":
        if facts.tf is None:
            missing.append("TensorFlow's build was not checked (TensorFlow is not imported)")
        elif not facts.tf.is_tensorrt_build:
            missing.append(
                f"TensorFlow {facts.tf.version} was not built with TensorRT (TF-TRT left "
                f"TensorFlow's pip builds in 2.18; NVIDIA's TensorFlow containers or TF<=2.17 "
                f"have it; the tensorrt and onnxruntime-tensorrt candidates reach TensorRT "
                f"through ONNX)"
            )
    else:
        raise ValueError(f"Unknown GPU candidate kind {kind!r}; known: {KINDS}.")
    return missing


def reason_unavailable(kind: str, facts: GpuFacts) -> str | None:
    """None when the GPU candidate `kind` (one of KINDS) can run here, else one line why not.

    No GPU comes first; what else is missing follows, so that one reading of the report says
    everything a user must install on a GPU machine.
    """
    missing = _missing(kind, facts)
    if not facts.gpus:
        return NO_GPU + (f"; also {'; '.join(missing)}" if missing else "")
    return "; ".join(missing) or None


# --- TensorRT optimization profiles -------------------------------------------------------

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Profile:
    """A TensorRT optimization profile: (min, opt, max) shape per input name, in input order."""

    shapes: tuple[tuple[str, Shape, Shape, Shape], ...]

    def covers(self, name: str, shape: Sequence[int]) -> bool:
        for input_name, low, _, high in self.shapes:
            if input_name == name:
                return len(shape) == len(low) and all(
                    lo <= s <= hi for lo, s, hi in zip(low, shape, high)
                )
        return False

    def ort_options(self) -> dict[str, str]:
        """The TensorRT EP options trt_profile_{min,opt,max}_shapes ("in_0:1x3x224x224,...")."""
        options = {}
        for which, index in (("min", 1), ("opt", 2), ("max", 3)):
            options[f"trt_profile_{which}_shapes"] = ",".join(
                f"{entry[0]}:{'x'.join(map(str, entry[index]))}" for entry in self.shapes
            )
        return options

    def to_json(self) -> list:
        return [[name, list(lo), list(opt), list(hi)] for name, lo, opt, hi in self.shapes]

    @classmethod
    def from_json(cls, data: list) -> Profile:
        return cls(tuple((n, tuple(lo), tuple(opt), tuple(hi)) for n, lo, opt, hi in data))


# The largest batch a TensorRT engine is built for unless the sample's is larger: calls with a
# free batch dimension may use any batch up to it. Larger batches need a larger profile.
PROFILE_MAX_BATCH = 64


def default_batch_sizes(signature: InputSignature) -> tuple[int, ...]:
    """The batch sizes a profile covers by default: the sample's and PROFILE_MAX_BATCH."""
    sample = signature.sample_batch
    return (PROFILE_MAX_BATCH,) if sample is None else (sample, max(sample, PROFILE_MAX_BATCH))


def profile_shapes(
    signature: InputSignature, batch_sizes: Iterable[int] = (), names: Sequence[str] | None = None
) -> Profile:
    """The profile for the shapes in use: opt is the sample's shape (what TensorRT tunes its
    kernels for), min has batch 1, max the largest of the sample's batch and `batch_sizes`.

    Only a free batch dimension (None in the signature) varies; every other dimension is the
    sample's in all three. `names` are the engine's input names (default: the signature's
    ONNX names in_0, in_1, ...).
    """
    names = list(names) if names is not None else [f"in_{i}" for i in range(len(signature.specs))]
    if len(names) != len(signature.specs):
        raise ValueError(f"{len(names)} input names for {len(signature.specs)} inputs: {names}")
    sizes = [int(b) for b in batch_sizes]
    if any(b < 1 for b in sizes):
        raise ValueError(f"batch sizes must be positive. Received: {sizes}.")
    shapes = []
    for name, spec, sample in zip(names, signature.specs, signature.sample_shapes):
        opt = tuple(int(d) for d in sample)
        if spec.shape and spec.shape[0] is None and opt:
            low = (1, *opt[1:])
            high = (max([opt[0], *sizes]), *opt[1:])
        else:
            low = high = opt
        shapes.append((name, low, opt, high))
    return Profile(tuple(shapes))


# --- engine cache --------------------------------------------------------------------------


def engine_cache_key(
    model_bytes: bytes | str, precision: str, profile: Profile, trt_version: str, gpu_name: str
) -> str:
    """A stable hex digest naming a built engine: the same ONNX model, precision, profile,
    TensorRT version and GPU give the same engine; anything else must build anew (an engine
    is specific to the GPU model and the TensorRT version that built it). `model_bytes` may
    be the path of a model.onnx whose weights are external data beside it (both hashed)."""
    digest = hashlib.sha256()
    if isinstance(model_bytes, str):
        model = hashlib.sha256()
        for file in sorted(Path(model_bytes).parent.glob("model.onnx*")):
            with open(file, "rb") as f:
                for block in iter(lambda f=f: f.read(1 << 24), b""):
                    model.update(block)
        digest.update(model.digest())
    else:
        digest.update(hashlib.sha256(model_bytes).digest())
    settings = {
        "precision": precision,
        "profile": profile.to_json(),
        "tensorrt": trt_version,
        "gpu": gpu_name,
    }
    digest.update(json.dumps(settings, sort_keys=True).encode())
    return digest.hexdigest()[:32]


# --- ONNX Runtime IO binding ---------------------------------------------------------------


@dataclass(frozen=True)
class IoBindingPlan:
    """What an ONNX Runtime CUDA session binds per call.

    Inputs are copied to the GPU once per call (bind_cpu_input, or OrtValue.update_inplace
    into the buffers a CUDA graph was captured with), outputs are bound on the GPU and copied
    to the host explicitly: that copy is the synchronization point. A CUDA graph replays
    fixed device addresses and shapes, so it serves only calls with exactly the sample's
    shapes (`uses_graph`); every other shape goes through the plain session.
    """

    input_names: tuple[str, ...]
    input_dtypes: tuple[np.dtype, ...]
    input_shapes: tuple[Shape, ...]  # the sample's: the shapes a CUDA graph is captured at
    output_names: tuple[str, ...]
    cuda_graph: bool
    why_no_graph: str | None = field(default=None, compare=False)

    def uses_graph(self, shapes: Sequence[Sequence[int]]) -> bool:
        return self.cuda_graph and tuple(tuple(s) for s in shapes) == self.input_shapes


def iobinding_plan(
    signature: InputSignature,
    input_names: Sequence[str],
    output_names: Sequence[str],
    want_cuda_graph: bool,
) -> IoBindingPlan:
    """The binding for `signature`; a CUDA graph where asked for and the model qualifies
    (every input has a known shape in the sample and a dtype the GPU takes)."""
    if len(input_names) != len(signature.specs):
        raise ValueError(f"{len(input_names)} input names for {len(signature.specs)} inputs")
    why = None
    dtypes = tuple(np.dtype(spec.dtype) for spec in signature.specs)
    if not want_cuda_graph:
        why = "not asked for"
    elif any(dtype.kind not in "biuf" for dtype in dtypes):
        why = "an input is neither numeric nor boolean (strings stay on the host)"
    elif any(0 in shape for shape in signature.sample_shapes):
        why = "an input of the sample is empty"
    return IoBindingPlan(
        input_names=tuple(input_names),
        input_dtypes=dtypes,
        input_shapes=tuple(tuple(int(d) for d in s) for s in signature.sample_shapes),
        output_names=tuple(output_names),
        cuda_graph=want_cuda_graph and why is None,
        why_no_graph=why,
    )


# --- TensorFlow on the GPU -----------------------------------------------------------------


def enable_tf_memory_growth() -> dict:
    """Let TensorFlow take GPU memory as it needs it instead of the whole card at start, so
    the candidates tried after it (ONNX Runtime, TensorRT) still find memory.

    Must run before TensorFlow initializes its GPUs; afterwards TensorFlow refuses the change
    ("Physical devices cannot be modified after being initialized"), which is reported, not
    raised. Without a GPU the driver lists, TensorFlow is not imported for this.
    Returns {"gpus": [...], "enabled": [...], "already": [...], "too_late": [...]}.
    """
    done: dict[str, list[str]] = {"gpus": [], "enabled": [], "already": [], "too_late": []}
    if "tensorflow" not in sys.modules and not gpu_devices():
        return done
    import tensorflow as tf

    for device in tf.config.list_physical_devices("GPU"):
        done["gpus"].append(device.name)
        try:
            if tf.config.experimental.get_memory_growth(device):
                done["already"].append(device.name)
                continue
            tf.config.experimental.set_memory_growth(device, True)
            done["enabled"].append(device.name)
        except (RuntimeError, ValueError):  # already initialized: the setting can't change now
            done["too_late"].append(device.name)
    return done
