"""Facts about the machine and software a measurement was made on.

Collected without importing optional runtimes (versions come from package metadata), so
recording the environment never fails and costs little.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from importlib import metadata

__all__ = ["collect_environment", "fingerprint"]

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
    "numpy",
    "infertune",
)
_CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx512_fp16", "amx_bf16")


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


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
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "features": [flag for flag in _CPU_FLAGS if flag in flags],
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


def collect_environment() -> dict:
    """Versions, CPU model and features, GPUs TensorFlow sees, thread settings."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_info(),
        "gpus": _gpus(),
        "threads": _threads(),
        "packages": {name: package_version(name) for name in _PACKAGES},
    }


def fingerprint(environment: dict) -> str:
    """A short hash of what makes a tuning result valid: packages, CPU, GPUs, Python."""
    relevant = {
        key: environment.get(key) for key in ("python", "cpu", "gpus", "packages", "threads")
    }
    blob = json.dumps(relevant, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
