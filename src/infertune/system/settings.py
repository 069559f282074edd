"""Settings read from environment variables, for tests, benchmarks and operators.

They change how long or where optimize() works, never what it may choose. Each is read when
it is used, so a test sets it with `monkeypatch.setenv` and a benchmark in its environment.

    INFERTUNE_MEASURE_S      seconds of measurement per batch size when optimize() has no
                             time_budget_s (default 5; the test suite uses 0.3)
    INFERTUNE_TF_WORKER      "auto" (default): a long TFLite conversion of a Keras model goes
                             to a worker process where a core is free (pipeline/tf_worker.py);
                             "always": every one, whatever its size or the machine's load;
                             "never": none
    INFERTUNE_EXTERNAL_DATA_BYTES  weights (bytes) past which the ONNX export keeps them as
                             external data and the TFLite conversion takes its large-model
                             path (default 1 GiB, below protobuf's 2 GiB; tests lower it)
    INFERTUNE_MEMORY_BYTES   the most memory (bytes) the candidates may hold in all, below what
                             the machine has free (on a machine shared with other work);
                             unset: what is free when tuning begins
    INFERTUNE_HOLD_ALL_BYTES memory (bytes) past which the verified candidates that copy the
                             weights are not all held for the measurement at once (default
                             2 GiB; pipeline/tournament.py; tests lower it)
    INFERTUNE_MACHINE_FILE   where what runs learn about the machine is kept (pipeline/machine.py;
                             default $XDG_CACHE_HOME/infertune/machine.json, "off": nowhere)
    INFERTUNE_TRT_CACHE      where TensorRT engines are kept between runs (system/gpu.py; default
                             $XDG_CACHE_HOME/infertune/tensorrt)
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "TF_WORKER_MODES",
    "engine_cache_dir",
    "external_data_bytes",
    "hold_all_bytes",
    "machine_file",
    "measure_s",
    "memory_limit_bytes",
    "tf_worker_mode",
]

DEFAULT_MEASURE_S = 5.0
DEFAULT_EXTERNAL_DATA_BYTES = 1 << 30
DEFAULT_HOLD_ALL_BYTES = 2 << 30
TF_WORKER_MODES = ("auto", "always", "never")


def measure_s() -> float:
    """Seconds of measurement per batch size without a time budget: INFERTUNE_MEASURE_S."""
    return _positive("INFERTUNE_MEASURE_S", DEFAULT_MEASURE_S)


def external_data_bytes() -> int:
    """INFERTUNE_EXTERNAL_DATA_BYTES: weights past which the conversions take their paths
    for models past protobuf's 2 GiB."""
    return int(_positive("INFERTUNE_EXTERNAL_DATA_BYTES", DEFAULT_EXTERNAL_DATA_BYTES))


def hold_all_bytes() -> int:
    """INFERTUNE_HOLD_ALL_BYTES: the memory the candidates that copy the weights may hold at
    once after verification before only the fastest few are kept for the measurement."""
    return int(_positive("INFERTUNE_HOLD_ALL_BYTES", DEFAULT_HOLD_ALL_BYTES))


def memory_limit_bytes() -> int | None:
    """INFERTUNE_MEMORY_BYTES: the most memory the candidates may hold in all, or None."""
    if not os.environ.get("INFERTUNE_MEMORY_BYTES", "").strip():
        return None
    return int(_positive("INFERTUNE_MEMORY_BYTES", 0.0))


def tf_worker_mode() -> str:
    """INFERTUNE_TF_WORKER: "auto", "always" or "never"."""
    value = os.environ.get("INFERTUNE_TF_WORKER", "auto").strip().lower() or "auto"
    if value not in TF_WORKER_MODES:
        raise ValueError(
            f"INFERTUNE_TF_WORKER must be one of {TF_WORKER_MODES}. Received: {value!r}."
        )
    return value


def machine_file() -> Path | None:
    """INFERTUNE_MACHINE_FILE: where the machine's record lives; None for "off" (or empty),
    $XDG_CACHE_HOME/infertune/machine.json where unset."""
    explicit = os.environ.get("INFERTUNE_MACHINE_FILE")
    if explicit is not None:
        return None if explicit.strip().lower() in ("", "off", "none", "0") else Path(explicit)
    return _cache_home() / "infertune" / "machine.json"


def engine_cache_dir() -> Path:
    """INFERTUNE_TRT_CACHE: where TensorRT engines are kept between runs, else
    $XDG_CACHE_HOME/infertune/tensorrt."""
    explicit = os.environ.get("INFERTUNE_TRT_CACHE")
    if explicit:
        return Path(explicit)
    return _cache_home() / "infertune" / "tensorrt"


def _cache_home() -> Path:
    """$XDG_CACHE_HOME, else ~/.cache."""
    return Path(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"))


def _positive(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{name} must be a positive number. Received: {text!r}.")
    return value
