"""Core benchmark: the "TensorFlow inference is slow" cases, infertune against the by-hand ways.

In one run, for each model, it times (interleaved, with infertune's measurement engine):
Keras eager `model(x)`, `model.predict(x)`, tf.function, tf.function + XLA and ONNX Runtime
written by hand the way a user would, and the callable infertune.optimize() returns. It
prints ratios and checks the targets:

* the optimized callable >= 50x faster than `model(x)` on the small CNN at batch 1;
* the callable within 10% (or 5 us) of calling its chosen runtime directly;
* optimize() itself under 20 s on the small CNN (TensorFlow's import excluded).

    python benchmarks/core.py [--out DIR] [--budget SECONDS]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import by_hand
import numpy as np

import infertune
from infertune.demo import demo_model
from infertune.environment import collect_environment
from infertune.measure import measure_interleaved, warm_up

CASES = [("small-cnn", 1), ("mlp", 1000)]


def runners_by_hand(model, sample) -> tuple[dict, bytes]:
    """The candidates as a user writes them, without infertune: name -> zero-arg runner."""
    model_bytes = by_hand.onnx_bytes(model, sample)
    return {
        "model(x)": by_hand.keras_call(model, sample),
        "model.predict(x)": by_hand.keras_predict(model, sample),
        "tf.function": by_hand.tf_function(model, sample),
        "tf.function+XLA": by_hand.tf_function(model, sample, jit_compile=True),
        "onnxruntime session.run": by_hand.onnxruntime_session(model_bytes, sample),
    }, model_bytes


def direct_runner(opt, model_bytes: bytes, sample, runners: dict):
    """The chosen runtime called directly with the chosen settings: (label, runner)."""
    backend = opt._backend  # the benchmark reads the chosen settings to rebuild them by hand
    if opt.backend.startswith("onnxruntime-cpu") and not opt.backend.endswith("int8"):
        options = backend.settings.session_options()
        return "direct " + opt.backend, by_hand.onnxruntime_session(model_bytes, sample, options)
    by_name = {"keras-eager": "model(x)", "tf-function": "tf.function", "tf-xla": "tf.function+XLA"}
    if opt.backend in by_name:
        return by_name[opt.backend], runners[by_name[opt.backend]]
    return None, None


def run_case(name: str, batch: int, budget_s: float) -> dict:
    model, sample = demo_model(name)
    sample = np.repeat(sample[:1], batch, axis=0) if sample.shape[0] != batch else sample
    start = time.perf_counter()
    opt = infertune.optimize(model, sample, verbose=False)
    optimize_s = time.perf_counter() - start
    runners, model_bytes = runners_by_hand(model, sample)
    direct_key, direct_run = direct_runner(opt, model_bytes, sample, runners)
    if direct_key is not None:
        runners.setdefault(direct_key, direct_run)
    runners["infertune"] = lambda: opt(sample)
    estimates = {key: warm_up(fn) for key, fn in runners.items()}
    result = measure_interleaved(
        runners, budget_s=budget_s, per_call_estimate_s=estimates, min_rounds=10
    )
    stats = {key: s.to_dict() for key, s in result.stats.items()}
    ours = result.stats["infertune"].p50
    direct = result.stats[direct_key].p50 if direct_key else float("nan")
    return {
        "model": name,
        "batch": batch,
        "selected": opt.backend,
        "optimize_s": optimize_s,
        "p50_ms": {key: s.p50 for key, s in result.stats.items()},
        "stats": stats,
        "speedup_vs_eager": result.stats["model(x)"].p50 / ours,
        "speedup_vs_predict": result.stats["model.predict(x)"].p50 / ours,
        "direct": direct_key,
        "overhead_us": (ours - direct) * 1e3,
        "overhead_ratio": ours / direct,
        "report": opt.report.to_dict(),
    }


def markdown(results: list[dict]) -> str:
    columns = ["model(x)", "model.predict(x)", "tf.function", "tf.function+XLA",
               "onnxruntime session.run", "infertune"]  # fmt: skip
    lines = [
        "| model | batch | " + " | ".join(columns) + " | infertune chose | vs model(x) | "
        "vs predict | overhead vs direct | optimize() |",
        "|---" * (len(columns) + 7) + "|",
    ]
    for r in results:
        cells = [f"{r['p50_ms'][c]:.4g}" for c in columns]
        lines.append(
            f"| {r['model']} | {r['batch']} | " + " | ".join(cells) + f" | {r['selected']} | "
            f"{r['speedup_vs_eager']:.0f}x | {r['speedup_vs_predict']:.0f}x | "
            f"{r['overhead_us']:+.2f} us ({(r['overhead_ratio'] - 1) * 100:+.1f}%) | "
            f"{r['optimize_s']:.1f} s |"
        )
    return "\n".join(lines)


def check_targets(results: list[dict]) -> list[str]:
    lines = []
    for r in results:
        overhead_ok = r["overhead_ratio"] <= 1.10 or r["overhead_us"] <= 5.0
        lines.append(
            f"{'PASS' if overhead_ok else 'FAIL'} {r['model']}: callable within 10% or 5 us of "
            f"{r['direct']} ({r['overhead_us']:+.2f} us, {(r['overhead_ratio'] - 1) * 100:+.1f}%)"
        )
        if r["model"] == "small-cnn":
            lines.append(
                f"{'PASS' if r['speedup_vs_eager'] >= 50 else 'FAIL'} small-cnn: "
                f"{r['speedup_vs_eager']:.0f}x faster than model(x) (target >= 50x)"
            )
            lines.append(
                f"{'PASS' if r['optimize_s'] < 20 else 'FAIL'} small-cnn: optimize() took "
                f"{r['optimize_s']:.1f} s (target < 20 s)"
            )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="write core.json and core.md here")
    parser.add_argument("--budget", type=float, default=10.0, help="measurement seconds per model")
    args = parser.parse_args()
    results = [run_case(name, batch, args.budget) for name, batch in CASES]
    table = markdown(results)
    targets = check_targets(results)
    env = collect_environment()
    machine = (
        f"{env['cpu']['model']}, {env['cpu']['usable_cores']} cores, {platform.python_version()}"
    )
    text = f"Median ms per call (p50), {machine}\n\n{table}\n\n" + "\n".join(targets)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "core.md").write_text(text + "\n", encoding="utf-8")
        payload = {"environment": env, "results": results, "targets": targets}
        (args.out / "core.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return 0 if all(line.startswith("PASS") for line in targets) else 1


if __name__ == "__main__":
    sys.exit(main())
