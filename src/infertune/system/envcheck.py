"""`infertune env --check`: every candidate that can run here, end to end on a tiny model.

`infertune env` says which candidates could run here from what is installed; the check runs
them: a tiny Keras model (dense 16-32-4) through optimize() with every precision allowed, so
each candidate is exported, compiled, verified against the model and timed, exactly as in a
real run. The result is a Markdown table (candidate, status, p50 latency, error against the
model, reason) under the versions a GPU bug report needs (driver, CUDA, cuDNN, TensorRT, ONNX
Runtime): what a user pastes into an issue.

Without a GPU it says that no GPU candidate can run here and why (each GPU candidate is
listed `unavailable` with everything else it would need) and exits 0. The exit status is 1
only when a candidate that could run here broke: `failed` or `timeout`, or an fp32 candidate
whose outputs differ from the model's (`mismatch`). A reduced-precision candidate outside
the default tolerance is reported, not counted as broken: that is what reduced precision may
do.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from ..backends.registry import GPU_BACKENDS
from ..report import (
    CandidateResult,
    Report,
)
from .gpu import (
    NO_GPU,
    gpu_facts,
)
from .gpu_libraries import gpu_versions

__all__ = ["CHECK_PRECISIONS", "EnvCheck", "run_check", "tiny_model"]

# Every precision: the check runs every candidate that can run here, reduced ones included.
CHECK_PRECISIONS = ("fp32", "fp16", "bf16", "int8")
_BROKEN = ("failed", "timeout")


def tiny_model(seed: int = 0):
    """16 -> Dense 32 relu -> Dense 4, random weights, and a batch of 8: every runtime
    compiles it in well under a second, so the check measures the paths, not the model."""
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(4)],
        name="env_check",
    )
    sample = np.random.default_rng(seed).standard_normal((8, 16)).astype("float32")
    return model, sample


@dataclass
class EnvCheck:
    """The report of the check run, the versions found, and why no GPU candidate ran."""

    report: Report
    versions: dict[str, str]
    gpus: tuple[str, ...]
    no_gpu_reason: str | None  # None where the driver lists a GPU

    def broken(self) -> list[CandidateResult]:
        """Candidates that could run here and broke: failed, timed out, or fp32 and wrong."""
        return [
            c
            for c in self.report.candidates
            if c.status in _BROKEN or (c.status == "mismatch" and c.precision == "fp32")
        ]

    def exit_code(self) -> int:
        return 1 if self.broken() else 0

    def text(self) -> str:
        lines = ["## infertune env --check", ""]
        env = self.report.environment or {}
        lines.append(f"- Python {env.get('python')} on {env.get('platform')}")
        cpu = env.get("cpu") or {}
        lines.append(f"- CPU: {cpu.get('model')}, {cpu.get('usable_cores')} usable cores")
        lines.append(f"- GPU: {', '.join(self.gpus) or 'none'}")
        for name, version in self.versions.items():
            lines.append(f"- {name}: {version}")
        packages = {k: v for k, v in (env.get("packages") or {}).items() if v}
        lines.append("- packages: " + ", ".join(f"{k} {v}" for k, v in packages.items()))
        lines.append("")
        if self.no_gpu_reason is not None:
            lines.append(
                f"No GPU candidate can run here: {self.no_gpu_reason}. Each GPU candidate "
                f"below is `unavailable` with everything else it would need."
            )
            lines.append("")
        lines += _table(self.report.candidates)
        counts: dict[str, int] = {}
        for c in self.report.candidates:
            counts[c.status] = counts.get(c.status, 0) + 1
        lines.append("")
        lines.append(
            f"{len(self.report.candidates)} candidates: "
            + ", ".join(f"{n} {status}" for status, n in counts.items())
            + f"; model {self.report.model}, batch {self.report.batch_size}, "
            f"rtol {self.report.rtol:g}, atol {self.report.atol:g}"
        )
        ran = [
            c.name
            for c in self.report.candidates
            if c.name in GPU_BACKENDS and c.status in ("ok", "selected")
        ]
        if self.no_gpu_reason is None:
            lines.append(f"GPU candidates that ran end to end: {', '.join(ran) or 'none'}")
        broken = self.broken()
        if broken:
            lines.append(f"BROKEN here: {', '.join(c.name for c in broken)} (exit status 1)")
        else:
            lines.append("Every candidate that can run here ran end to end (exit status 0).")
        return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(candidates: list[CandidateResult]) -> list[str]:
    rows = [
        "| candidate | status | p50 ms | max rel err | error / reason |",
        "|---|---|---|---|---|",
    ]
    for c in candidates:
        p50 = f"{c.p50:.4g}" if c.p50 is not None else ""
        err = f"{c.max_rel_err:.2g}" if c.max_rel_err is not None else ""
        name = c.name if c.precision == "fp32" else f"{c.name} ({c.precision})"
        rows.append(f"| {name} | {c.status} | {p50} | {err} | {_cell(c.reason)} |")
    return rows


def _ort_build_cuda() -> str | None:
    """The CUDA version the imported ONNX Runtime was built for (None for the CPU build)."""
    module = sys.modules.get("onnxruntime.capi.build_and_package_info")
    return getattr(module, "cuda_version", None) if module is not None else None


def run_check(verbose: bool = True) -> EnvCheck:
    """Run every candidate on the tiny model (optimize() with every precision allowed)."""
    import infertune

    model, sample = tiny_model()
    opt = infertune.optimize(model, sample, precision=CHECK_PRECISIONS, verbose=verbose)
    facts = gpu_facts()
    return EnvCheck(
        report=opt.report,
        versions=gpu_versions(_ort_build_cuda()),
        gpus=facts.gpus,
        no_gpu_reason=None if facts.gpus else NO_GPU,
    )
