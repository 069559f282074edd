"""Facts about the machine and software a measurement was made on.

Collected without importing optional runtimes (versions come from package metadata), so
recording the environment never fails and costs little.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import platform
import sys
from importlib import metadata

__all__ = [
    "BF16_FLAGS",
    "INT8_DOT_FLAGS",
    "collect_environment",
    "differences",
    "fingerprint",
    "gpu_devices",
    "precision_instructions",
]

# Packages whose versions change results or speed; absent ones are recorded as None.
_PACKAGES = (
    "tensorflow",
    "keras",
    "tf_keras",
    "tf2onnx",
    "onnx",
    "onnxruntime",
    "onnxruntime-gpu",
    "openvino",
    "ai-edge-litert",
    "tensorrt",
    "cuda-python",
    "numpy",
    "infertune",
)
_CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx512_fp16", "amx_bf16")
# The instructions reduced precision runs fast on: int8 dot products summed in int32 (VNNI,
# AMX), and bfloat16 arithmetic (without them OpenVINO emulates bf16, slower than float32).
# The report's environment lists those present ("precision_instructions"); the CPU model
# decides them, so they stay out of the fingerprint (results tuned before they were listed
# keep their key).
INT8_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity), the count thread settings go by."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def install_hint(extra: str) -> str:
    """How to install what one of infertune's extras brings, in words that work: the
    packages themselves (from this installation's metadata), or the extra from infertune's
    source tree, which is where infertune installs from (it is not on a package index)."""
    where = f'infertune\'s "{extra}" extra: pip install ".[{extra}]" in its source tree'
    marker = f'extra == "{extra}"'
    try:
        requires = metadata.requires("infertune") or []
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        requires = []
    packages = [r.split(";")[0].strip() for r in requires if r.split(";")[-1].strip() == marker]
    if not packages:
        return where
    quoted = " ".join(f"'{p}'" if any(c in p for c in "[<>") else p for p in packages)
    return f"pip install {quoted} ({where})"


def precision_instructions() -> list[str]:
    """The CPU's instructions for int8 and bfloat16 arithmetic (INT8_DOT_FLAGS, BF16_FLAGS),
    as /proc/cpuinfo lists them (empty where it cannot be read)."""
    return list(_cpu_info()["precision_instructions"])


def _cpu_info() -> dict:
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name":
                    model = value.strip()
                elif key == "flags":
                    flags = set(value.split())
                if model and flags:
                    break
    except OSError:
        pass
    return {
        "model": model,
        "logical_cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "features": [flag for flag in _CPU_FLAGS if flag in flags],
        "precision_instructions": [f for f in (*INT8_DOT_FLAGS, *BF16_FLAGS) if f in flags],
    }


def _threads() -> dict:
    settings = {
        var: os.environ.get(var)
        for var in ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")
    }
    tf = sys.modules.get("tensorflow")  # only if already imported: never import it for this
    if tf is not None:
        settings["tf_intra_op"] = tf.config.threading.get_intra_op_parallelism_threads()
        settings["tf_inter_op"] = tf.config.threading.get_inter_op_parallelism_threads()
    return settings


def _gpus() -> list[str]:
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return []
    return [device.name for device in tf.config.list_physical_devices("GPU")]


def gpu_devices() -> list[str]:
    """NVIDIA GPUs the driver exposes, read from /proc without TensorFlow or CUDA libraries."""
    models = []
    for info in sorted(glob.glob("/proc/driver/nvidia/gpus/*/information")):
        try:
            with open(info, encoding="utf-8") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key.strip() == "Model":
                        models.append(value.strip())
                        break
        except OSError:
            continue
    return models


def collect_environment(packages: tuple[str, ...] = _PACKAGES) -> dict:
    """Versions (of `packages`, default all that matter), CPU model and features, GPUs
    (TensorFlow's view where it is imported, and the driver's), thread settings."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_info(),
        "gpus": _gpus(),
        "gpu_devices": gpu_devices(),
        "threads": _threads(),
        "packages": {name: package_version(name) for name in packages},
    }


def fingerprint(environment: dict) -> str:
    """A short hash of what makes a tuning result valid: Python, CPU, GPUs, package versions
    and the thread variables. The same with or without TensorFlow imported (nothing in it is
    read through TensorFlow), so a process that never imports it computes the same value."""
    threads = environment.get("threads") or {}
    cpu = {k: v for k, v in (environment.get("cpu") or {}).items() if k != "precision_instructions"}
    relevant = {
        "python": environment.get("python"),
        "cpu": cpu,
        "gpu_devices": environment.get("gpu_devices"),
        "packages": environment.get("packages"),
        "threads": {k: v for k, v in threads.items() if not k.startswith("tf_")},
    }
    blob = json.dumps(relevant, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def differences(saved: dict, current: dict, packages: tuple[str, ...] = ()) -> list[str]:
    """What changed since `saved` was recorded that can change a tuned result's speed: the
    CPU, its usable cores and features, the GPUs, and the versions of `packages`."""
    changes = []
    for key, words in (
        ("model", "CPU"),
        ("usable_cores", "usable cores"),
        ("features", "CPU features"),
    ):
        then, now = saved.get("cpu", {}).get(key), current.get("cpu", {}).get(key)
        if then != now:
            changes.append(f"{words}: {_words(then)} when saved, {_words(now)} here")
    then, now = saved.get("gpu_devices"), current.get("gpu_devices")
    if then is not None and then != now:
        changes.append(f"GPUs: {_words(then)} when saved, {_words(now)} here")
    for name in packages:
        then = saved.get("packages", {}).get(name)
        now = current.get("packages", {}).get(name)
        if then != now:
            changes.append(f"{name} {then or 'absent'} when saved, {now or 'absent'} here")
    return changes


def _words(value) -> str:
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    return str(value)
