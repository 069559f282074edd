"""A choice that repeats: optimize() run again and again on each model, on an idle machine,
and every run's choice timed against the others' in one interleaved run.

For each model, in a child process of its own, optimize(model, x) runs `--runs` times (every
candidate that can run here, the defaults), each result kept; then the callable of each
distinct choice is timed in one interleaved run (no candidate leaves the rounds), and each
run's choice is compared with the fastest of them by p50. Target: every run's choice within
5% of the fastest, on every model. The table says how often each candidate was chosen, by how
much each choice is behind the fastest, and how many runs called their choice a close call
(the runner-up within 5%, said in the report).

    python benchmarks/stability.py [--models mobilenet-v2-160,small-cnn,transformer]
                                   [--runs 10] [--budget 5] [--out DIR] [--quick]

Models: keras.applications MobileNetV2 at 160x160 (weights=None, batch 1, inputs in 0..1) and
the demo's small CNN and transformer. Results: docs/benchmarks/stability/<date>/ (--out).
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import harness

BENCHMARK = "stability"
MODELS = ("mobilenet-v2-160", "small-cnn", "transformer")
WITHIN = 1.05  # every run's choice at most this much slower than the fastest choice


def build(name: str):
    import numpy as np

    if name == "mobilenet-v2-160":
        import keras

        keras.utils.set_random_seed(0)
        model = keras.applications.MobileNetV2(input_shape=(160, 160, 3), weights=None)
        return model, np.random.default_rng(0).random((1, 160, 160, 3), dtype=np.float32)
    from infertune.demo import demo_model

    return demo_model(name)


def child(name: str, runs: int, budget_s: float) -> dict:
    """`runs` optimize() runs of one model, then every distinct choice timed together."""
    import infertune

    model, sample = build(name)
    chosen, kept = [], {}
    for run in range(runs):
        start = time.perf_counter()
        opt = infertune.optimize(model, sample, verbose=False)
        seconds = time.perf_counter() - start
        report = opt.report
        own = report.candidate(opt.backend).latency
        chosen.append(
            {
                "run": run + 1,
                "choice": opt.backend,
                "p50_ms": own.p50 if own else None,
                "close_call": "close call" in report.selection_reason,
                "head_to_head": "head to head" in report.selection_reason,
                "tuning_s": seconds,
                "reason": report.selection_reason,
            }
        )
        harness.log(name, f"run {run + 1}: {opt.backend} ({seconds:.1f} s)")
        if opt.backend in kept:
            opt.close()
        else:
            kept[opt.backend] = opt
    runners = {choice: (lambda opt=opt: opt(sample)) for choice, opt in kept.items()}
    # A runtime whose threads spin after a call (ONNX Runtime's default session) waits its
    # cool-down after its block, as in optimize()'s own measurement: else the next block runs
    # beside its spinning threads.
    cooldown = {choice: max(b.cooldown_s for b in opt.backends) for choice, opt in kept.items()}
    measured = harness.measure_runners(
        runners, budget_s=budget_s, cooldown_s=cooldown, min_rounds=10, race=False
    )
    p50 = {choice: stats.p50 for choice, stats in measured.stats.items()}
    fastest = min(p50.values())
    for row in chosen:
        row["vs_fastest"] = p50[row["choice"]] / fastest
    return {"model": name, "runs": chosen, "p50_ms": p50}


def main() -> int:
    made = harness.parser(__doc__, "--out", "--quick", child=True)
    made.add_argument("--models", help=f"comma-separated, of {', '.join(MODELS)}")
    made.add_argument("--runs", type=int, default=10, help="optimize() runs per model")
    made.add_argument("--budget", type=float, default=5.0, help="seconds of the final timing")
    args = made.parse_args()
    if args.child:
        result = child(args.child, args.runs, args.budget)
        harness.write_child_result(args.child_out, result)
        return 0
    runs = 2 if args.quick else args.runs
    models = harness.names_from(args.models, MODELS, made)
    rows, targets, cells = [], [], []
    for name in models:
        args_for = ["--runs", str(runs), "--budget", str(1.0 if args.quick else args.budget)]
        result = harness.run_in_child(__file__, name, args_for)
        if "error" in result:
            cells.append([name, "failed", result["error"][:200], "", "", ""])
            targets.append(
                harness.target(f"{name}: every choice within 5%", "<= 1.05x", None, False)
            )
            continue
        counts = Counter(row["choice"] for row in result["runs"])
        worst = max(row["vs_fastest"] for row in result["runs"])
        close = sum(row["close_call"] for row in result["runs"])
        settled = sum(row["head_to_head"] for row in result["runs"])
        fastest = min(result["p50_ms"], key=result["p50_ms"].get)
        choices = ", ".join(
            f"{choice} {count}x ({result['p50_ms'][choice] / result['p50_ms'][fastest]:.3f}x)"
            for choice, count in counts.most_common()
        )
        cells.append(
            [name, str(len(result["runs"])), choices, f"{worst:.3f}x", str(close), str(settled)]
        )
        rows += [{"model": name, **row} for row in result["runs"]]
        met = None if args.quick else worst <= WITHIN
        targets.append(
            harness.target(
                f"{name}: every run's choice within 5% of the fastest", "<= 1.05x", worst, met,
                f"{name}: the slowest run's choice {worst:.3f}x the fastest choice over "
                f"{len(result['runs'])} runs ({choices})",
            )
        )  # fmt: skip
    table = harness.table(
        ["model", "runs", "choices (count, p50 against the fastest choice)", "worst",
         "close calls", "settled head to head"],
        cells,
        title="optimize() run again and again; every distinct choice timed in one interleaved run",
    )  # fmt: skip
    data = harness.results(
        BENCHMARK, rows=rows, tables=[table], targets=targets,
        headline={t["name"]: t["value"] for t in targets}, about=harness.about(__doc__),
    )  # fmt: skip
    harness.publish(data, args.out, quick=args.quick)
    return harness.exit_code(targets)


if __name__ == "__main__":
    sys.exit(main())
