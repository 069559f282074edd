"""The native libraries of the GPU runtimes: who installed them, what links what, loading them.

pip installs the GPU runtimes as Python packages whose shared libraries come from other wheels,
and what goes wrong is invisible to pip: onnxruntime and onnxruntime-gpu write the same
`onnxruntime` module (the last one written wins, `pip check` says nothing); onnxruntime-gpu
1.31 is a CUDA 13 build whose CUDA and cuDNN libraries (the nvidia-* wheels of its
`[cuda,cudnn]` extras) are found only after `onnxruntime.preload_dlls()`; its TensorRT
provider links `libnvinfer.so.10`, so TensorRT 11 (`libnvinfer.so.11`) cannot serve it. This
module reads those facts from the files themselves, without importing a GPU runtime:

- `installed_by(module)`: the distributions whose RECORD lists the module's `__init__.py` in
  the directory it imports from: the versions that are really there, and both names where
  two distributions wrote the same module;
- `elf_needed(path)`: the sonames a shared library links (its DT_NEEDED entries);
- `ort_tensorrt_links()`: the libnvinfer soname the installed ONNX Runtime's TensorRT
  provider links; `find_library(soname)`: where that library is (TensorRT's wheel, then the
  system's search path);
- `preload_cuda()` and `preload_tensorrt(sonames)`: load them before a session needs them;
- `gpu_versions()`: the versions a GPU bug report needs (driver, CUDA, cuDNN, TensorRT, ONNX
  Runtime), for `infertune env --check`.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.util
import io
import os
import re
import struct
import subprocess
from pathlib import Path

from .environment import package_version

__all__ = [
    "elf_needed",
    "find_library",
    "gpu_versions",
    "installed_by",
    "loaded_libraries",
    "module_directory",
    "ort_tensorrt_links",
    "preload_cuda",
    "preload_tensorrt",
]

# The provider library of onnxruntime-gpu's TensorRT execution provider (Linux).
ORT_TENSORRT_PROVIDER = "libonnxruntime_providers_tensorrt.so"
# The libraries of TensorRT a runtime may link, by name before ".so.N".
TENSORRT_LIBRARIES = ("libnvinfer", "libnvinfer_plugin", "libnvonnxparser")


def module_directory(module: str) -> Path | None:
    """The directory a top-level package would import from, found without importing it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def installed_by(module: str) -> tuple[tuple[str, str], ...]:
    """(distribution, version) of every distribution that installed `module` where it imports
    from: normally one; two where both wrote the same files (onnxruntime and onnxruntime-gpu).

    Read from the RECORD files of the `*.dist-info` directories beside the module whose names
    start like it, so `tensorrt` installed by tensorrt-cu13 is found under that name.
    """
    directory = module_directory(module)
    if directory is None:
        return ()
    init = f"{module}/__init__.py"
    found = []
    for info in sorted(directory.parent.glob(f"{module}*.dist-info")):
        try:
            record = (info / "RECORD").read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if any(line.split(",", 1)[0] == init for line in record.splitlines()):
            name, _, version = info.name[: -len(".dist-info")].partition("-")
            found.append((name.replace("_", "-").lower(), version))
    return tuple(found)


def elf_needed(path: str | os.PathLike) -> list[str]:
    """The sonames a 64-bit little-endian ELF shared library links (DT_NEEDED), in order.

    Raises ValueError for a file that is not such a library."""
    with open(path, "rb") as f:
        header = f.read(64)
        if header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
            raise ValueError(f"{path} is not a 64-bit little-endian ELF file")
        phoff = struct.unpack_from("<Q", header, 0x20)[0]
        phentsize, phnum = struct.unpack_from("<HH", header, 0x36)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
        loads, dynamic = [], None
        for i in range(phnum):
            kind, _, offset, vaddr, _, filesz = struct.unpack_from("<IIQQQQ", table, i * phentsize)
            if kind == 1:  # PT_LOAD: maps file offsets to addresses
                loads.append((vaddr, offset, filesz))
            elif kind == 2:  # PT_DYNAMIC
                dynamic = (offset, filesz)
        if dynamic is None:
            return []
        f.seek(dynamic[0])
        data = f.read(dynamic[1])
        needed, strtab = [], None
        for tag, value in struct.iter_unpack("<qQ", data[: len(data) // 16 * 16]):
            if tag == 0:  # DT_NULL
                break
            if tag == 1:  # DT_NEEDED: an offset into the string table
                needed.append(value)
            elif tag == 5:  # DT_STRTAB: the string table's address
                strtab = value
        if strtab is None:
            return []
        base = next((o + strtab - v for v, o, size in loads if v <= strtab < v + size), None)
        if base is None:
            raise ValueError(f"{path}: its string table is in no loaded segment")
        names = []
        for offset in needed:
            f.seek(base + offset)
            raw = f.read(256)
            names.append(raw.split(b"\0", 1)[0].decode("ascii", "replace"))
        return names


def ort_tensorrt_links() -> tuple[str, ...]:
    """The TensorRT libraries (sonames) the installed ONNX Runtime's TensorRT provider links,
    e.g. ("libnvinfer.so.10", "libnvonnxparser.so.10"); () where it has no such provider."""
    directory = module_directory("onnxruntime")
    provider = directory / "capi" / ORT_TENSORRT_PROVIDER if directory else None
    if provider is None or not provider.is_file():
        return ()
    return _tensorrt_sonames(str(provider), provider.stat().st_mtime)


@functools.lru_cache(maxsize=4)
def _tensorrt_sonames(path: str, mtime: float) -> tuple[str, ...]:
    return tuple(name for name in elf_needed(path) if name.startswith(TENSORRT_LIBRARIES))


def _wheel_directories() -> list[Path]:
    """Where pip puts TensorRT's libraries: the tensorrt_libs package (tensorrt-cuNN-libs)."""
    directory = module_directory("tensorrt_libs")
    return [directory] if directory is not None else []


def find_library(soname: str) -> str | None:
    """The path of the shared library `soname` (e.g. "libnvinfer.so.10"): in TensorRT's wheel,
    in $LD_LIBRARY_PATH, or in the system's linker cache (ldconfig -p); None if nowhere."""
    for directory in _wheel_directories():
        if (directory / soname).is_file():
            return str(directory / soname)
    for directory in filter(None, os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)):
        if os.path.isfile(os.path.join(directory, soname)):
            return os.path.join(directory, soname)
    return _linker_cache().get(soname)


@functools.lru_cache(maxsize=1)
def _linker_cache() -> dict[str, str]:
    """soname -> path, from `ldconfig -p` (empty where ldconfig is missing)."""
    for ldconfig in ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"):
        try:
            listing = subprocess.run(
                [ldconfig, "-p"], capture_output=True, text=True, timeout=10, check=False
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        found: dict[str, str] = {}
        for line in listing.splitlines():
            match = re.match(r"\s*(\S+) \(([^)]*)\) => (\S+)", line)
            # "libc6,x86-64" or "libc6,AArch64": a 64-bit library; a 32-bit one never wins
            if match and "64" in match.group(2):
                found.setdefault(match.group(1), match.group(3))
        return found
    return {}


def loaded_libraries() -> list[str]:
    """Paths of the shared libraries mapped into this process (/proc/self/maps)."""
    paths: list[str] = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rstrip("\n").split(None, 5)[-1]
                if ".so" in path and path.startswith("/") and path not in paths:
                    paths.append(path)
    except OSError:
        pass
    return paths


@functools.lru_cache(maxsize=1)
def preload_cuda() -> tuple[str, ...]:
    """Load the CUDA and cuDNN libraries onnxruntime-gpu was built against, from the nvidia-*
    wheels of its [cuda,cudnn] extras, before a CUDA session is created: without it the CUDA
    provider finds them only where a system-wide CUDA of the same major is installed, and
    ONNX Runtime falls back to the CPU. Once per process.

    `onnxruntime.preload_dlls()` prints what it could not load instead of raising: those
    lines are returned (empty when everything loaded), for the error of a session that then
    falls back to the CPU. It is a no-op in the CPU build.
    """
    import onnxruntime

    preload = getattr(onnxruntime, "preload_dlls", None)
    if preload is None:  # onnxruntime < 1.21: only the system's libraries are searched
        return ("this onnxruntime has no preload_dlls (before 1.21)",)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        preload()
    return tuple(line.strip() for line in printed.getvalue().splitlines() if line.strip())


def preload_tensorrt(sonames: tuple[str, ...]) -> list[str]:
    """Load the TensorRT libraries `sonames` (what ONNX Runtime's TensorRT provider links)
    from where find_library() finds them, so that the provider, loaded later by ONNX Runtime,
    resolves them from this process instead of the system's search path (a TensorRT wheel is
    not on it). Returns the paths loaded; raises RuntimeError naming what is missing."""
    missing, loaded = [], []
    for soname in sonames:
        path = find_library(soname)
        if path is None:
            missing.append(soname)
            continue
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        loaded.append(path)
    if missing:
        raise RuntimeError(
            f"ONNX Runtime's TensorRT provider links {', '.join(missing)}, found neither in "
            f"TensorRT's wheel nor on the library search path"
        )
    return loaded


# --- versions for a bug report -------------------------------------------------------------


def _driver_version() -> str | None:
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as f:
            first = f.readline()
    except OSError:
        return None
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", first)
    return match.group(1) if match else first.strip() or None


def _first_version(*names: str) -> str | None:
    for name in names:
        version = package_version(name)
        if version is not None:
            return f"{name} {version}"
    return None


def gpu_versions(ort_build_cuda: str | None = None) -> dict[str, str]:
    """What a GPU bug report needs, where present: the driver, the CUDA and cuDNN wheels,
    TensorRT (the distribution that installed `tensorrt`, its libraries, what ONNX Runtime's
    provider links) and ONNX Runtime (who installed it, the CUDA it was built for)."""
    versions: dict[str, str] = {}
    driver = _driver_version()
    if driver:
        versions["NVIDIA driver"] = driver
    cuda = _first_version(
        "nvidia-cuda-runtime", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime-cu12"
    )
    if cuda or ort_build_cuda:
        built = f"onnxruntime built for CUDA {ort_build_cuda}" if ort_build_cuda else None
        versions["CUDA"] = "; ".join(filter(None, [cuda, built]))
    cudnn = _first_version("nvidia-cudnn-cu13", "nvidia-cudnn-cu12")
    if cudnn:
        versions["cuDNN"] = cudnn
    tensorrt = [f"{name} {version}" for name, version in installed_by("tensorrt")]
    tensorrt += [f"{name} {version}" for name, version in installed_by("tensorrt_libs")]
    links = ort_tensorrt_links()
    if links:
        tensorrt.append(f"onnxruntime's TensorRT provider links {', '.join(links)}")
    if tensorrt:
        versions["TensorRT"] = "; ".join(tensorrt)
    ort = installed_by("onnxruntime")
    if ort:
        versions["ONNX Runtime"] = ", ".join(f"{name} {version}" for name, version in ort)
    cuda_python = _first_version("cuda-python", "cuda-bindings")
    if cuda_python:
        versions["cuda-python"] = cuda_python
    return versions
