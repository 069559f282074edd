"""The machine's GPU facts and the decisions they make without a GPU: whether each GPU
candidate can run here, and why not.

Every GPU candidate asks `reason_unavailable(kind, facts)` whether it can run here. The facts
(`GpuFacts`) are gathered without importing a GPU runtime or TensorFlow where there is no
GPU: the driver's GPUs from /proc, which distributions installed the runtimes' modules and
which TensorRT libraries ONNX Runtime's provider links from the files themselves
(system/gpu_libraries.py), ONNX Runtime's providers and TensorFlow's build only where those modules
are already imported. So on a machine without a GPU every GPU candidate says why it cannot
run at no noticeable cost (tests/backends/test_gpu.py times it), and the decisions are plain
functions of the facts, tested with facts a CPU machine cannot produce. Where the driver lists a
GPU, `tensorrt` and cuda-python are imported once to know they load (a package whose libraries
are missing is installed but does not import), and so is onnxruntime for its providers.

What a backend builds on a GPU is planned in its runtime's folder, as values that need no GPU
either: TensorRT's optimization profile and engine cache key (backends/tensorrt/profiles.py),
ONNX Runtime's IO binding (backends/onnxruntime/iobinding.py).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

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
    "NO_GPU",
    "TfBuild",
    "enable_tf_memory_growth",
    "gpu_facts",
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
