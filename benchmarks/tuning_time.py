"""Tuning time: what optimize() costs, against what one runtime costs to try by hand.

python benchmarks/tuning_time.py [--models resnet50,mobilenet-v2,small-cnn]
                                 [--budget SECONDS] [--out DIR] [--json FILE] [--log DIR]

For each model, in a fresh process of its own (so that no model's compiled state, caches or
memory help another):
1. imports TensorFlow, tf2onnx and infertune and exports a tiny model once (the one-time
   costs of the first conversion in a process are nobody's);
2. times one by-hand tf2onnx export of the model (`tf2onnx.convert.from_function` of
   `tf.function(lambda x: model(x))`, what a user writes to try ONNX Runtime once);
3. times optimize(model, x) with every candidate that can run here (the defaults);
4. times the by-hand export again.
The ratio is optimize()'s time over the mean of the two exports: both sides ran in the same
process, minutes apart, so the drift of a shared machine hits them alike. The stage
breakdown is the report's own (`report.stages`). Besides the wall-clock ratio (the wait a
user feels), the CPU-time ratio (this process and its children, user + system): on a machine
whose cores other work keeps busy, wall time follows the CPU work, whatever overlaps.

Models: resnet50 is keras.applications.ResNet50(weights=None, input_shape=(128, 128, 3)),
batch 1, inputs uniform in 0..255; mobilenet-v2 and small-cnn are infertune's demo models
(224x224x3 and 28x28x1, batch 1, inputs in 0..1).

Results: docs/benchmarks/tuning-time/<date>/ (--out); --log keeps each model's optimize()
progress log.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import harness

BENCHMARK = "tuning-time"
MODELS = ("resnet50", "mobilenet-v2", "small-cnn")


def build(name: str):
    import numpy as np

    if name == "resnet50":
        import keras

        keras.utils.set_random_seed(0)
        model = keras.applications.ResNet50(weights=None, input_shape=(128, 128, 3))
        sample = np.random.default_rng(0).uniform(0, 255, (1, 128, 128, 3)).astype(np.float32)
        return model, sample
    from infertune.demo import demo_model

    return demo_model(name)


def child(name: str, budget: float | None) -> dict:
    """One model in this process: export by hand, optimize(), export by hand again."""
    import tensorflow as tf  # noqa: F401
    import tf2onnx  # noqa: F401

    import infertune
    from infertune.demo import demo_model

    tiny, tiny_x = demo_model("mlp")
    harness.onnx_bytes(tiny, tiny_x)  # tf2onnx's first conversion in a process: one-time costs
    model, sample = build(name)
    model(sample)  # built and called once, as a user's model is before they tune it

    start, cpu = time.perf_counter(), _cpu_s()
    harness.onnx_bytes(model, sample)
    export_before, export_cpu_before = time.perf_counter() - start, _cpu_s() - cpu
    start, cpu = time.perf_counter(), _cpu_s()
    opt = infertune.optimize(model, sample, time_budget_s=budget, verbose=True)
    optimize_s, optimize_cpu = time.perf_counter() - start, _cpu_s() - cpu
    start, cpu = time.perf_counter(), _cpu_s()
    harness.onnx_bytes(model, sample)
    export_after, export_cpu_after = time.perf_counter() - start, _cpu_s() - cpu
    export_s = (export_before + export_after) / 2
    export_cpu = (export_cpu_before + export_cpu_after) / 2
    report = opt.report
    return {
        "model": name,
        "time_budget_s": budget,
        "export_s": [export_before, export_after],
        "optimize_s": optimize_s,
        "ratio": optimize_s / export_s,
        "optimize_cpu_s": optimize_cpu,
        "export_cpu_s": [export_cpu_before, export_cpu_after],
        "cpu_ratio": optimize_cpu / export_cpu,
        "load_average": os.getloadavg()[0],
        "selected": opt.backend,
        "stages": report.to_dict().get("stages"),
        "statuses": {c.name: c.status for c in report.candidates},
        "reasons": {c.name: c.reason for c in report.candidates if c.status == "skipped"},
        "summary": report.stage_summary() if hasattr(report, "stage_summary") else None,
    }


def _cpu_s() -> float:
    """CPU seconds (user + system) of this process and of its children that have ended."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def table(results: list[dict]) -> dict:
    head = [
        "model", "optimize() s", "by-hand tf2onnx export s (before, after)", "ratio",
        "CPU-time ratio", "load average", "selected",
    ]  # fmt: skip
    rows = [
        [
            r["model"],
            f"{r['optimize_s']:.1f}",
            ", ".join(f"{s:.1f}" for s in r["export_s"]),
            f"{r['ratio']:.2f}x",
            f"{r['cpu_ratio']:.2f}x",
            f"{r['load_average']:.1f}",
            r["selected"],
        ]
        for r in results
        if "error" not in r
    ]
    rows += [[r["model"], "failed", r["error"][-300:]] for r in results if "error" in r]
    return harness.table(head, rows)


def details(results: list[dict]) -> list[str]:
    """Each model's stage breakdown and the candidates skipped, with why."""
    lines = []
    for r in results:
        if "error" in r:
            continue
        lines.append(f"- **{r['model']}**")
        if r["summary"]:
            lines += [f"  - {line}" for line in r["summary"].splitlines() if line.strip()]
        for cand, why in r["reasons"].items():
            lines.append(f"  - skipped {cand}: {why}")
    return lines


def main() -> int:
    parser = harness.parser(__doc__, "--out", "--json", child=True)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--budget", type=float, default=None, help="optimize(time_budget_s=)")
    parser.add_argument("--log", help="a directory for each model's optimize() progress log")
    args = parser.parse_args()
    if args.child:
        harness.write_child_result(args.child_out, child(args.child, args.budget))
        return 0

    results = []
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory(prefix="tuning-time-") as tmp:
            child_args = [] if args.budget is None else ["--budget", str(args.budget)]
            log = Path(args.log) / f"{name}.log" if args.log else Path(tmp) / "log"
            log.parent.mkdir(parents=True, exist_ok=True)
            result = harness.run_in_child(__file__, name, child_args, log_file=log)
        results.append(result)
        if "error" in result:
            print(f"{name}: {result['error']}", file=sys.stderr)
            continue
        exports = ", ".join(f"{s:.1f}" for s in result["export_s"])
        harness.log(
            "tuning-time",
            f"{name}: optimize() {result['optimize_s']:.1f} s, one by-hand tf2onnx export "
            f"{exports} s (before, after): ratio {result['ratio']:.2f}x (CPU time "
            f"{result['cpu_ratio']:.2f}x; load average {result['load_average']:.1f}); "
            f"selected {result['selected']}",
        )
    data = harness.results(
        BENCHMARK,
        about=harness.about(__doc__),
        notes="Ratio: optimize()'s wall time over the mean of the two by-hand exports made in "
        "the same process before and after it; the CPU-time ratio the same in CPU seconds "
        "(the process and its children, user + system).",
        rows=results,
        tables=[table(results)],
        headline={f"{r['model']}: ratio": r["ratio"] for r in results if "error" not in r},
        sections=[{"title": "Stages and skipped candidates", "lines": details(results)}],
    )
    harness.publish(data, args.out, args.json)
    return 0  # a model whose child failed is said above and in the table


if __name__ == "__main__":
    sys.exit(main())
