"""What the benchmarks share besides the by-hand runtimes (by_hand.py): what "exact" means,
the output error, interleaved timing of zero-argument runners, a model's run in a child
process, a table's by-hand cells, the candidates' fates, the machine's description, and where
a run's results are written.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from infertune.backends.onnxruntime.cpu import OnnxRuntimeCpu
from infertune.pipeline.timing import (
    MeasureResult,
    measure_interleaved,
    warm_up,
)

EXACT_RTOL = 1e-3  # infertune's default tolerance: what "exact" means for a by-hand default


def relative_error(outputs, reference) -> float:
    """The largest ||out - ref|| / ||ref|| over the outputs; each side is one array or a list
    of arrays in the same order. An output of the same size in another shape is compared
    flat (LiteRT may keep a fixed batch); a different count or size raises ValueError."""
    outs = list(outputs) if isinstance(outputs, list | tuple) else [outputs]
    refs = list(reference) if isinstance(reference, list | tuple) else [reference]
    if len(outs) != len(refs):
        raise ValueError(f"returned {len(outs)} output(s), the model returns {len(refs)}")
    worst = 0.0
    for out, ref in zip(outs, refs):
        ref = np.asarray(ref, dtype=np.float64)
        out = np.asarray(out, dtype=np.float64)
        if out.size != ref.size:
            raise ValueError(f"returned an output of shape {out.shape}, the model's is {ref.shape}")
        diff = float(np.linalg.norm(out.reshape(ref.shape) - ref))
        norm = float(np.linalg.norm(ref))
        worst = max(worst, diff / norm if norm > 0 else (0.0 if diff == 0 else float("inf")))
    return worst


# ONNX Runtime's spinning workers keep a core busy after each call (see OrtSettings): the
# by-hand session's blocks are followed by the same wait as infertune's own measurement.
ONNXRUNTIME_COOLDOWN_S = OnnxRuntimeCpu().cooldown_s


def measure_runners(
    runners: dict[str, Callable[[], object]],
    *,
    budget_s: float,
    cooldown_s: dict[str, float],
    min_rounds: int = 8,
    race: bool = True,
) -> MeasureResult:
    """Warm every runner up, then time them all in interleaved rounds (infertune's engine);
    `race` False: none leaves the rounds for being far behind (measure_interleaved)."""
    estimates = {label: warm_up(fn, min_calls=2) for label, fn in runners.items()}
    return measure_interleaved(
        runners,
        budget_s=budget_s,
        per_call_estimate_s=estimates,
        cooldown_s=cooldown_s,
        min_rounds=min_rounds,
        race=race,
    )


def machine_description(env: dict) -> str:
    """One line: CPU, cores, platform, Python and package versions (collect_environment())."""
    cpu = env["cpu"]
    return (
        f"{cpu['model']}, {cpu['usable_cores']} cores ({', '.join(cpu['features'])}), "
        f"{env['platform']}, Python {platform.python_version()}, "
        + ", ".join(f"{k} {v}" for k, v in env["packages"].items() if v)
    )


def write_results(out: Path, text: str, env: dict, results: list, targets: list[str]) -> None:
    """`out`/results.md (the printed tables) and `out`/results.json (everything, the
    environment and the targets' verdicts included)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text(text + "\n", encoding="utf-8")
    payload = {"environment": env, "results": results, "targets": targets}
    (out / "results.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")


def run_in_child(script: str, name: str, args: list[str], timeout_s: float) -> dict:
    """`script --child NAME ARGS --child-out FILE` in a child process, its JSON result read
    back; a crash or a hang becomes that model's failure."""
    with tempfile.TemporaryDirectory(prefix=f"{Path(script).stem}-") as tmp:
        path = Path(tmp) / "result.json"
        command = [sys.executable, script, "--child", name, *args, "--child-out", str(path)]
        start = time.perf_counter()
        try:
            done = subprocess.run(command, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return {"model": name, "error": f"did not finish within {timeout_s:.0f} s"}
        if done.returncode != 0 or not path.exists():
            return {"model": name, "error": f"the child process exited with {done.returncode}"}
        result = json.loads(path.read_text(encoding="utf-8"))
        result["wall_s"] = time.perf_counter() - start
        return result


def milliseconds(value: float) -> str:
    return f"{value:.4g}"


def raw_cell(r: dict, label: str) -> str:
    """A by-hand runtime's cell in a results table: its p50 in ms (with its error where it is
    not exact), or why there is none."""
    if label in r["raw_failed"]:
        return "failed"
    value = r["p50_ms"].get(label)
    if value is None:
        return "-"
    err = r["raw_rel_err"].get(label, 0.0)
    return milliseconds(value) + (f" (err {err:.0e})" if err > EXACT_RTOL else "")


# The runtimes written by hand that zoo.py and production.py time infertune against.
RAW_RUNTIMES = ("tf.function", "tf.function+XLA", "onnxruntime", "openvino-f32", "litert")


def runtime_table(
    results: list[dict],
    trailing: list[str],
    chose: Callable[[dict], str],
    tail: Callable[[dict], list[str]],
) -> str:
    """The markdown table of zoo.py and production.py: each model's input, optimize()'s
    seconds, its choice (`chose(r)`), the p50 ms of every runtime by hand and of infertune,
    the ratio to the fastest exact runtime by hand, then the `trailing` columns (`tail(r)`)."""
    columns = [*RAW_RUNTIMES, "infertune"]
    head = (
        "| model | input | optimize() s | infertune chose | "
        + " | ".join(columns)
        + " | vs fastest exact by hand | "
        + " | ".join(trailing)
        + " |"
    )
    lines = [head, "|---" * (len(columns) + 5 + len(trailing)) + "|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['model']} | | | {r['error']} |" + " |" * (len(columns) + 3))
            continue
        cells = [raw_cell(r, label) for label in RAW_RUNTIMES]
        ours = r["p50_ms"].get("infertune")
        cells.append("-" if ours is None else milliseconds(ours))
        ratio = r["vs_best_exact_raw"]
        versus = "-" if ratio is None else f"{ratio:.2f}x ({r['best_exact_raw']})"
        lines.append(
            f"| {r['model']} | {r['input']} | {r['optimize_s']:.0f} | {chose(r)} | "
            + " | ".join(cells)
            + f" | {versus} | "
            + " | ".join(tail(r))
            + " |"
        )
    return "\n".join(lines)


def fate_lines(title: str, candidates: list[dict]) -> list[str]:
    """A model's line of every candidate's fate (the names by status), then a line for each
    candidate that failed, mismatched or timed out, with its reason."""
    by_status: dict[str, list[str]] = {}
    for c in candidates:
        by_status.setdefault(c["status"], []).append(c["name"])
    statuses = "; ".join(f"{status}: {', '.join(names)}" for status, names in by_status.items())
    lines = [f"- {title}: {statuses}"]
    for c in candidates:
        if c["status"] in ("mismatch", "failed", "timeout"):
            lines.append(f"  - {c['name']} {c['status']}: {c['reason']}")
    return lines
