"""Many callers at once: infertune tuned for N concurrent callers against the single-caller
choice and every runtime called by hand with each thread setting, all measured under the
same N callers in one interleaved run (infertune's measurement engine, `callers=N`).

Each model runs in a child process of its own: what one model's runtimes leave behind in a
process (OpenVINO's stream threads, by-hand interpreters) must not slow the next one's
measurement (it did: the transformer's 2-thread LiteRT ran 1.7x slower after two other
models in the same process). For each model and N in 1, 2, 4, 8,
optimize(model, x, concurrency=N) is timed against the result of optimize(model, x) (one
caller) and the by-hand runtimes: ONNX Runtime with its default threads and with one thread
(one session shared by the callers: its run() is thread-safe), LiteRT with one and with
every core's threads (an interpreter per caller: one runs one call at a time), OpenVINO f32
with the LATENCY and the THROUGHPUT hint (one compiled model, an infer request per caller)
and tf.function. The figure is samples per second in total. Target: at every N, infertune
within 1.05x of the best by hand.

    python benchmarks/concurrency.py [--models small-cnn,mobilenet-v2-96,transformer]
                                     [--callers 1,2,4,8] [--budget 3] [--out DIR]

Results: docs/benchmarks/concurrency/<date>/ (--out).
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import harness
import numpy as np
import onnxruntime

import infertune
from infertune.demo import demo_model
from infertune.pipeline.timing import measure_interleaved
from infertune.system.environment import usable_cores

BENCHMARK = "concurrency"
TARGET = 1.05  # infertune at most this much below the best by-hand runtime, in samples/s


def mobilenet_v2_96():
    import keras

    keras.utils.set_random_seed(0)
    model = keras.applications.MobileNetV2(input_shape=(96, 96, 3), weights=None)
    x = np.random.default_rng(0).random((1, 96, 96, 3), dtype=np.float32)
    return model, x


MODELS = {
    "small-cnn": lambda: demo_model("small-cnn"),
    "mobilenet-v2-96": mobilenet_v2_96,
    "transformer": lambda: demo_model("transformer"),
}


def by_hand_runners(model, sample) -> dict:
    """tf.function; ONNX Runtime with its default threads and with one (one session shared
    by the callers); LiteRT with one thread and with every core's (an interpreter per
    caller); OpenVINO f32 with the LATENCY and the THROUGHPUT hint (an infer request per
    caller)."""
    runners = {"tf.function": harness.tf_function(model, sample)}
    model_bytes = harness.onnx_bytes(model, sample)
    one = onnxruntime.SessionOptions()
    one.intra_op_num_threads = 1
    runners["onnxruntime"] = harness.onnxruntime_session(model_bytes, sample)
    runners["onnxruntime threads=1"] = harness.onnxruntime_session(model_bytes, sample, one)
    content = harness.tflite_bytes(model, sample)
    for threads in sorted({1, usable_cores()}):
        runners[f"litert threads={threads}"] = harness.per_caller(
            lambda t=threads: harness.litert_interpreter(model, sample, content, threads=t)
        )
    for hint in ("LATENCY", "THROUGHPUT"):
        runners[f"openvino {hint.lower()}"] = harness.openvino_per_caller(model_bytes, sample, hint)
    return runners


def run_model(name: str, callers: list[int], budget_s: float) -> list[dict]:
    model, x = MODELS[name]()
    batch = len(x)
    harness.log("concurrency", f"{name}: optimize() at {callers} callers")
    tuned = {}
    for n in sorted({1, *callers}):
        start = time.perf_counter()
        tuned[n] = infertune.optimize(model, x, concurrency=n, verbose=False)
        seconds = time.perf_counter() - start
        harness.log("concurrency", f"  concurrency={n}: {tuned[n].backend} ({seconds:.1f} s)")
    hand = by_hand_runners(model, x)
    rows = []
    for n in callers:
        runners = {"infertune": lambda o=tuned[n]: o(x)}
        if n != 1:
            runners["single-caller choice"] = lambda o=tuned[1]: o(x)
        runners.update(hand)
        cooldown = {label: harness.onnxruntime_cooldown_s() for label in runners if "onnx" in label}
        for label, opt in (("infertune", tuned[n]), ("single-caller choice", tuned[1])):
            cooldown[label] = opt.backends[0].cooldown_s
        stats = measure_interleaved(
            runners, budget_s=budget_s, callers=n, cooldown_s=cooldown, min_rounds=5
        ).stats
        rate = {label: s.samples_per_s(batch) for label, s in stats.items()}
        hand_rates = {label: r for label, r in rate.items() if label in hand}
        best = max(hand_rates, key=hand_rates.get)
        single = rate.get("single-caller choice", rate["infertune"])
        rows.append(
            {
                "model": name,
                "callers": n,
                "choice": tuned[n].backend,
                "single_caller_choice": tuned[1].backend,
                "samples_per_s": rate,
                "best_by_hand": best,
                "vs_best_by_hand": rate["infertune"] / hand_rates[best],
                "gain_over_single_caller_choice": rate["infertune"] / single,
            }
        )
        r = rows[-1]
        harness.log(
            "concurrency",
            f"  {n} callers: infertune {r['choice']} {rate['infertune']:,.0f} samples/s, "
            f"{r['vs_best_by_hand']:.2f}x the best by hand ({best} {hand_rates[best]:,.0f}), "
            f"{r['gain_over_single_caller_choice']:.2f}x the single-caller choice",
        )
    return rows


def table(rows: list[dict]) -> dict:
    head = [
        "model", "callers", "infertune's choice", "samples/s", "single-caller choice",
        "its samples/s", "best by hand", "its samples/s", "vs best by hand", "gain over single",
    ]  # fmt: skip
    cells = []
    for r in rows:
        rate = r["samples_per_s"]
        single = rate.get("single-caller choice", rate["infertune"])
        cells.append(
            [
                r["model"],
                r["callers"],
                r["choice"],
                f"{rate['infertune']:,.0f}",
                r["single_caller_choice"],
                f"{single:,.0f}",
                r["best_by_hand"],
                f"{rate[r['best_by_hand']]:,.0f}",
                f"{r['vs_best_by_hand']:.2f}x",
                f"{r['gain_over_single_caller_choice']:.2f}x",
            ]
        )
    return harness.table(head, cells)


def check_targets(rows: list[dict], failed: list[dict]) -> list[dict]:
    checks = [
        harness.target(
            f"{r['model']} at {r['callers']} callers: samples/s against the best by hand",
            f">= {1 / TARGET:.2f}x",
            r["vs_best_by_hand"],
            r["vs_best_by_hand"] >= 1 / TARGET,
            f"{r['model']} at {r['callers']} callers: {r['vs_best_by_hand']:.2f}x the best by "
            f"hand (>= {1 / TARGET:.2f})",
        )
        for r in rows
    ]
    checks += [
        harness.target(f"{f['model']}: runs", "no error", None, False,
                       f"{f['model']}: {f['error']}")
        for f in failed
    ]  # fmt: skip
    return checks


def main() -> int:
    parser = harness.parser(__doc__, "--out", "--json", child=True)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--callers", default="1,2,4,8")
    parser.add_argument("--budget", type=float, default=3.0, help="measurement s per run")
    args = parser.parse_args()
    callers = [int(n) for n in args.callers.split(",")]
    if args.child:  # one model in this process: what a runtime leaves behind stays here
        rows = run_model(args.child, callers, args.budget)
        harness.write_child_result(args.child_out, {"model": args.child, "rows": rows})
        return 0
    names = harness.names_from(args.models, MODELS, parser)
    rows, failed = [], []
    for name in names:
        child_args = ["--callers", args.callers, "--budget", str(args.budget)]
        result = harness.run_in_child(__file__, name, child_args)
        if "error" in result:
            failed.append(result)
        else:
            rows += result["rows"]
    targets = check_targets(rows, failed)
    data = harness.results(
        BENCHMARK,
        about=harness.about(__doc__),
        notes="Samples per second in total under N callers, every runtime of a row measured "
        "in one interleaved run with N callers (infertune's engine, `callers=N`).",
        rows=rows,
        tables=[table(rows)],
        targets=targets,
        headline={
            f"{r['model']} at {r['callers']} callers: vs best by hand": r["vs_best_by_hand"]
            for r in rows
        },  # fmt: skip
        failed=failed,
    )
    harness.publish(data, args.out, args.json)
    return harness.exit_code(targets)


if __name__ == "__main__":
    sys.exit(main())
