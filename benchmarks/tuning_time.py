"""Tuning time: what optimize() costs, against what one runtime costs to try by hand.

python benchmarks/tuning_time.py [--models resnet50,mobilenet-v2,small-cnn]
                                 [--budget SECONDS] [--json FILE] [--log DIR]

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
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MODELS = ("resnet50", "mobilenet-v2", "small-cnn")
HERE = Path(__file__).resolve().parent


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


def child(name: str, budget: float | None, out: Path) -> None:
    """One model in this process: export by hand, optimize(), export by hand again."""
    sys.path.insert(0, str(HERE))
    import tensorflow as tf  # noqa: F401
    import tf2onnx  # noqa: F401
    from by_hand import onnx_bytes

    import infertune
    from infertune.demo import demo_model

    tiny, tiny_x = demo_model("mlp")
    onnx_bytes(tiny, tiny_x)  # tf2onnx's first conversion in a process: one-time costs
    model, sample = build(name)
    model(sample)  # built and called once, as a user's model is before they tune it

    start, cpu = time.perf_counter(), _cpu_s()
    onnx_bytes(model, sample)
    export_before, export_cpu_before = time.perf_counter() - start, _cpu_s() - cpu
    start, cpu = time.perf_counter(), _cpu_s()
    opt = infertune.optimize(model, sample, time_budget_s=budget, verbose=True)
    optimize_s, optimize_cpu = time.perf_counter() - start, _cpu_s() - cpu
    start, cpu = time.perf_counter(), _cpu_s()
    onnx_bytes(model, sample)
    export_after, export_cpu_after = time.perf_counter() - start, _cpu_s() - cpu
    export_s = (export_before + export_after) / 2
    export_cpu = (export_cpu_before + export_cpu_after) / 2
    report = opt.report
    result = {
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
    out.write_text(json.dumps(result, indent=2))


def _cpu_s() -> float:
    """CPU seconds (user + system) of this process and of its children that have ended."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--budget", type=float, default=None, help="optimize(time_budget_s=)")
    parser.add_argument("--json", help="write every result here as JSON")
    parser.add_argument("--log", help="a directory for each model's optimize() progress log")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.budget, Path(args.child_out))
        return

    results = []
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory(prefix="tuning-time-") as tmp:
            out = Path(tmp) / "result.json"
            command = [sys.executable, __file__, "--child", name, "--child-out", str(out)]
            if args.budget is not None:
                command += ["--budget", str(args.budget)]
            log = Path(args.log) / f"{name}.log" if args.log else Path(tmp) / "log"
            if args.log:
                log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "w") as stream:
                done = subprocess.run(command, stderr=stream, stdout=stream, check=False)
            if done.returncode != 0:
                tail = log.read_text()[-2000:]
                print(f"{name}: the child failed (exit {done.returncode}):\n{tail}")
                continue
            result = json.loads(out.read_text())
        results.append(result)
        exports = ", ".join(f"{s:.1f}" for s in result["export_s"])
        print(
            f"{name}: optimize() {result['optimize_s']:.1f} s, one by-hand tf2onnx export "
            f"{exports} s (before, after): ratio {result['ratio']:.2f}x (CPU time "
            f"{result['cpu_ratio']:.2f}x; load average {result['load_average']:.1f}); "
            f"selected {result['selected']}",
            flush=True,
        )
        if result["summary"]:
            print("  " + result["summary"].replace("\n", "\n  "), flush=True)
        skipped = result["reasons"]
        if skipped:
            print(f"  skipped: {len(skipped)}", flush=True)
            for cand, why in skipped.items():
                print(f"    {cand}: {why}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
