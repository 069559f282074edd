"""Tuning per batch size: the dispatched callable against raw runtimes at each batch size.

For each model, in one run: optimize(model, x, batch_sizes=[1, 8, 64, 256]) (one choice per
batch size, dispatched at call time) and optimize(model, x) tuned at batch 1 only (one
choice for every size, as before batch_sizes existed). Then, at each batch size, in one
interleaved measurement: both callables and every raw runtime written by hand with its
default settings (harness.py: tf.function, XLA, ONNX Runtime, OpenVINO, LiteRT converted at
that batch size). Targets (exit code 1 if one fails):

* at every batch size, the dispatched callable within 5% of the fastest exact raw runtime
  (exact: relative error within rtol=1e-3 of `model(x)`);
* the dispatch costs nothing measurable: the callable within 3% (or 2 us) of calling the
  chosen candidate's runtime directly (`backend.run`) at every batch size, as the median
  difference of pairs of calls made back to back (the machine's drift between rounds, 10%
  at 256 samples, cancels within a pair; the same statistic of the direct call against
  itself is printed as the measurement's resolution);
* the gain over the single choice tuned at batch 1 is reported (no target: where one
  runtime wins everywhere it is 1x).

    python benchmarks/batch_sizes.py [--models small-cnn,mlp,mobilenet-v2-96] [--out DIR]

Results: docs/benchmarks/batch-sizes/<date>/ (--out).
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import harness
import numpy as np
from harness import EXACT_RTOL

import infertune

BENCHMARK = "batch-sizes"
BATCH_SIZES = (1, 8, 64, 256)
TARGET = 0.95  # dispatched callable >= 0.95x the speed of the fastest exact raw runtime
DISPATCH_REL, DISPATCH_US = 0.03, 2.0  # the callable vs the chosen runtime called directly
RAW = ("tf.function", "tf.function+XLA", "onnxruntime", "openvino", "litert")  # defaults


def _models() -> dict:
    import keras

    from infertune.demo import small_cnn

    def mlp():
        keras.utils.set_random_seed(0)
        return keras.Sequential(
            [keras.Input((256,))]
            + [keras.layers.Dense(n, activation="relu") for n in (512, 512)]
            + [keras.layers.Dense(64)],
            name="mlp_256_512_512_64",
        )

    def mobilenet_v2_96():
        keras.utils.set_random_seed(0)
        return keras.applications.MobileNetV2(
            weights=None, input_shape=(96, 96, 3), classifier_activation=None
        )

    return {  # name -> (builder, feature shape, value range)
        "small-cnn": (small_cnn, (28, 28, 1), (0.0, 1.0)),
        "mlp": (mlp, (256,), (-1.0, 1.0)),
        "mobilenet-v2-96": (mobilenet_v2_96, (96, 96, 3), (-1.0, 1.0)),
    }


def _draw(shape, value_range, batch: int, seed: int) -> np.ndarray:
    low, high = value_range
    rng = np.random.default_rng(seed)
    return rng.uniform(low, high, (batch, *shape)).astype("float32")


def run_model(name: str, budget_s: float) -> dict:
    build, shape, value_range = _models()[name]
    model = build()
    sample = _draw(shape, value_range, 1, seed=0)

    def say(text: str) -> None:
        harness.log("batch-sizes", f"{name}: {text}")

    say(f"optimize(batch_sizes={list(BATCH_SIZES)})")
    start = time.perf_counter()
    dispatched = infertune.optimize(model, sample, batch_sizes=BATCH_SIZES, verbose=False)
    dispatched_s = time.perf_counter() - start
    say("optimize() at batch 1 only")
    start = time.perf_counter()
    single = infertune.optimize(model, sample, verbose=False)
    single_s = time.perf_counter() - start
    model_bytes = harness.onnx_bytes(model, sample)
    rows = []
    for batch in BATCH_SIZES:
        x = _draw(shape, value_range, batch, seed=batch)
        reference = np.asarray(model(x), dtype=np.float64)
        builders, _ = harness.by_hand_builders(model, x, RAW, onnx=model_bytes)
        runners, skipped, _ = harness.build_runners(builders)
        errors = harness.check_first_calls(runners, reference, skipped)
        runners["infertune"] = lambda x=x: dispatched(x)
        runners["tuned at batch 1"] = lambda x=x: single(x)
        chosen = dispatched.backends_by_batch[batch]
        backend = next(b for b in dispatched.backends if b.name == chosen)
        runners["chosen, direct"] = lambda x=x, b=backend: b.run([x])[0]
        say(f"batch {batch}: measuring {len(runners)} runners")
        cooldown = {
            "onnxruntime": harness.onnxruntime_cooldown_s(),
            "infertune": _cooldown(dispatched, chosen),
            "tuned at batch 1": _cooldown(single, single.backend),
            "chosen, direct": backend.cooldown_s,
        }
        measured = harness.measure_runners(runners, budget_s=budget_s, cooldown_s=cooldown)
        p50 = {label: s.p50 for label, s in measured.stats.items()}
        dispatch_us, noise_us = paired_difference_us(
            runners["infertune"], runners["chosen, direct"], budget_s / 3
        )
        exact = {
            label: p50[label]
            for label in runners
            if label in errors and errors[label] <= EXACT_RTOL and label in p50
        }
        best = min(exact, key=exact.get)
        rows.append(
            {
                "model": name,
                "batch": batch,
                "chosen": chosen,
                "single_choice": single.backend,
                "p50_ms": p50,
                "rel_err": errors,
                "skipped": skipped,
                "best_raw": best,
                "vs_best_raw": exact[best] / p50["infertune"],
                "gain_over_single": p50["tuned at batch 1"] / p50["infertune"],
                "dispatch_us": dispatch_us,
                "dispatch_noise_us": noise_us,
                "dispatch_ratio": 1 + dispatch_us / (p50["chosen, direct"] * 1e3),
            }
        )
    return {
        "model": name,
        "optimize_s": dispatched_s,
        "optimize_single_s": single_s,
        "backends_by_batch": dispatched.backends_by_batch,
        "rows": rows,
        "report": dispatched.report.to_dict(),
    }


def paired_difference_us(a, b, budget_s: float) -> tuple[float, float]:
    """What `a` costs over `b`, in us: the median over pairs of calls made back to back (the
    order alternating), so that the machine's drift between rounds, which the interleaved
    measurement's separate medians carry (10% at 256 samples), cancels within each pair.
    Also the same statistic for `b` against itself: the resolution of this measurement."""
    clock = time.perf_counter

    def pairs(first, second) -> float:
        differences = []
        end = clock() + budget_s / 2
        while clock() < end or len(differences) < 50:
            flip = len(differences) % 2
            t0 = clock()
            (second if flip else first)()
            t1 = clock()
            (first if flip else second)()
            t2 = clock()
            one, other = (t2 - t1, t1 - t0) if flip else (t1 - t0, t2 - t1)
            differences.append(one - other)
        return float(np.median(differences)) * 1e6

    return pairs(a, b), abs(pairs(b, b))


def _cooldown(opt, name: str) -> float:
    """The spin-down wait of the candidate that serves `name` (ONNX Runtime's workers)."""
    return max(b.cooldown_s for b in opt.backends if b.name == name)


def markdown(results: list[dict]) -> dict:
    head = [
        "model", "batch", "infertune chose", "infertune ms", "fastest exact raw (ms)", "vs raw",
        "tuned at batch 1 only (ms)", "gain", "callable vs chosen runtime direct",
    ]  # fmt: skip
    rows = []
    for result in results:
        for row in result["rows"]:
            p50 = row["p50_ms"]
            rows.append(
                [
                    result["model"],
                    row["batch"],
                    row["chosen"],
                    f"{p50['infertune']:.3g}",
                    f"{p50[row['best_raw']]:.3g} ({row['best_raw']})",
                    f"{row['vs_best_raw']:.2f}x",
                    f"{p50['tuned at batch 1']:.3g} ({row['single_choice']})",
                    f"{row['gain_over_single']:.2f}x",
                    f"{row['dispatch_us']:+.2f} us ({row['dispatch_ratio']:.3f}x; "
                    f"resolution {row['dispatch_noise_us']:.2f} us)",
                ]
            )
    return harness.table(head, rows)


def check_targets(results: list[dict]) -> list[dict]:
    checks = []
    for r in results:
        for row in r["rows"]:
            where = f"{r['model']} at batch {row['batch']}"
            checks.append(
                harness.target(
                    f"{where}: speed against the fastest exact raw runtime",
                    f">= {TARGET}x",
                    row["vs_best_raw"],
                    row["vs_best_raw"] >= TARGET,
                    f"{where}: {row['vs_best_raw']:.2f}x the fastest exact raw runtime "
                    f"({row['best_raw']}), target {TARGET}x",
                )
            )
            checks.append(
                harness.target(
                    f"{where}: the callable over the chosen runtime called directly",
                    f"<= {1 + DISPATCH_REL:.2f}x or +{DISPATCH_US:g} us",
                    row["dispatch_ratio"],
                    row["dispatch_ratio"] <= 1 + DISPATCH_REL or row["dispatch_us"] <= DISPATCH_US,
                    f"{where}: the callable adds {row['dispatch_us']:.2f} us "
                    f"({row['dispatch_ratio']:.3f}x) over the chosen runtime called directly",
                )
            )
    return checks


def main() -> int:
    parser = harness.parser(__doc__, "--out", "--json")
    parser.add_argument("--models", default=",".join(_models()), help="comma-separated")
    parser.add_argument("--budget", type=float, default=6.0, help="seconds per batch size")
    args = parser.parse_args()
    names = harness.names_from(args.models, _models(), parser)
    results = [run_model(name, args.budget) for name in names]
    targets = check_targets(results)
    data = harness.results(
        BENCHMARK,
        about=harness.about(__doc__),
        notes="Median ms per call (p50), every column of a row timed in one interleaved run "
        "at that batch size; the callable against the chosen runtime called directly: the "
        "median difference of pairs of calls made back to back.",
        rows=[row for r in results for row in r["rows"]],
        tables=[markdown(results)],
        targets=targets,
        headline={
            f"{row['model']} at batch {row['batch']}: vs fastest exact raw": row["vs_best_raw"]
            for r in results
            for row in r["rows"]
        },
        models=[{k: v for k, v in r.items() if k != "rows"} for r in results],
    )
    harness.publish(data, args.out, args.json)
    return harness.exit_code(targets)


if __name__ == "__main__":
    sys.exit(main())
