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
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import by_hand
import numpy as np
import onnxruntime
from timing import ONNXRUNTIME_COOLDOWN_S, machine_description, write_results

import infertune
from infertune.demo import demo_model
from infertune.pipeline.timing import measure_interleaved
from infertune.system.environment import (
    collect_environment,
    usable_cores,
)

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


def per_caller(make):
    """A runner that gives each calling thread its own instance from make() (made on the
    thread's first call, which the measurement does not time)."""
    local = threading.local()

    def run():
        runner = getattr(local, "runner", None)
        if runner is None:
            runner = local.runner = make()
        return runner()

    return run


def openvino_requests(model_bytes: bytes, sample, hint: str):
    """OpenVINO f32 with a performance hint: one compiled model, an infer request a caller."""
    import openvino

    core = openvino.Core()
    compiled = core.compile_model(
        core.read_model(model_bytes),
        "CPU",
        {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": hint},
    )

    def make():
        request = compiled.create_infer_request()
        return lambda: [request.infer([sample])[port].copy() for port in compiled.outputs]

    return per_caller(make)


def by_hand_runners(model, sample) -> dict:
    runners = {"tf.function": by_hand.tf_function(model, sample)}
    model_bytes = by_hand.onnx_bytes(model, sample)
    one = onnxruntime.SessionOptions()
    one.intra_op_num_threads = 1
    runners["onnxruntime"] = by_hand.onnxruntime_session(model_bytes, sample)
    runners["onnxruntime threads=1"] = by_hand.onnxruntime_session(model_bytes, sample, one)
    content = by_hand.tflite_bytes(model, sample)
    for threads in sorted({1, usable_cores()}):
        runners[f"litert threads={threads}"] = per_caller(
            lambda t=threads: _litert(content, sample, t)
        )
    for hint in ("LATENCY", "THROUGHPUT"):
        runners[f"openvino {hint.lower()}"] = openvino_requests(model_bytes, sample, hint)
    return runners


def _litert(content: bytes, sample, threads: int):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=content, num_threads=threads)
    interpreter.allocate_tensors()
    index_in = interpreter.get_input_details()[0]["index"]
    index_out = interpreter.get_output_details()[0]["index"]

    def run():
        interpreter.set_tensor(index_in, sample)
        interpreter.invoke()
        return interpreter.get_tensor(index_out)

    return run


def run_model(name: str, callers: list[int], budget_s: float) -> list[dict]:
    model, x = MODELS[name]()
    batch = len(x)
    print(f"[concurrency] {name}: optimize() at {callers} callers", flush=True)
    tuned = {}
    for n in sorted({1, *callers}):
        start = time.perf_counter()
        tuned[n] = infertune.optimize(model, x, concurrency=n, verbose=False)
        print(f"  concurrency={n}: {tuned[n].backend} ({time.perf_counter() - start:.1f} s)")
    hand = by_hand_runners(model, x)
    rows = []
    for n in callers:
        runners = {"infertune": lambda o=tuned[n]: o(x)}
        if n != 1:
            runners["single-caller choice"] = lambda o=tuned[1]: o(x)
        runners.update(hand)
        cooldown = {label: ONNXRUNTIME_COOLDOWN_S for label in runners if "onnx" in label}
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
        print(
            f"  {n} callers: infertune {r['choice']} {rate['infertune']:,.0f} samples/s, "
            f"{r['vs_best_by_hand']:.2f}x the best by hand ({best} {hand_rates[best]:,.0f}), "
            f"{r['gain_over_single_caller_choice']:.2f}x the single-caller choice",
            flush=True,
        )
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| model | callers | infertune's choice | samples/s | single-caller choice | its "
        "samples/s | best by hand | its samples/s | vs best by hand | gain over single |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        rate = r["samples_per_s"]
        single = rate.get("single-caller choice", rate["infertune"])
        lines.append(
            f"| {r['model']} | {r['callers']} | {r['choice']} | {rate['infertune']:,.0f} | "
            f"{r['single_caller_choice']} | {single:,.0f} | {r['best_by_hand']} | "
            f"{rate[r['best_by_hand']]:,.0f} | {r['vs_best_by_hand']:.2f}x | "
            f"{r['gain_over_single_caller_choice']:.2f}x |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--callers", default="1,2,4,8")
    parser.add_argument("--budget", type=float, default=3.0, help="measurement s per run")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    env = collect_environment()
    print(machine_description(env))
    callers = [int(n) for n in args.callers.split(",")]
    if args.child:  # one model in this process: what a runtime leaves behind stays here
        args.child_out.write_text(json.dumps(run_model(args.child, callers, args.budget)))
        return 0
    rows = []
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "rows.json"
            subprocess.run(
                [sys.executable, __file__, "--child", name, "--child-out", str(out),
                 "--callers", args.callers, "--budget", str(args.budget)],
                check=True,
            )  # fmt: skip
            rows += json.loads(out.read_text())
    text = table(rows)
    print(text)
    targets = [
        f"{'PASS' if r['vs_best_by_hand'] >= 1 / TARGET else 'FAIL'} {r['model']} at "
        f"{r['callers']} callers: {r['vs_best_by_hand']:.2f}x the best by hand "
        f"(>= {1 / TARGET:.2f})"
        for r in rows
    ]
    print("\n".join(targets))
    if args.out:
        write_results(args.out, text, env, rows, targets)
    return 1 if any(t.startswith("FAIL") for t in targets) else 0


if __name__ == "__main__":
    raise SystemExit(main())
