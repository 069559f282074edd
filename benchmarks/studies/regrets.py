"""Three cases where infertune once chose a slower runtime than one written by hand.

Found in November 2026 by checking infertune against raw runtimes written independently of
it:

* gru-varlen: a GRU over a variable sequence length (batch 2, length 25, 16 features, GRU 32)
  chose tf-xla at 615 us while ONNX Runtime by hand ran 528 us (1.17x);
* cnn-free-hw: a CNN with free height and width (Input((None, None, 3)), 64x64, batch 1)
  chose onnxruntime-cpu at 205 us against 186 us by hand (1.10x);
* py-function: a model with a tf.py_function layer chose tf-function at 1458 us against 1322
  us for a plain tf.function(model) (1.10x).

For each, in one run: optimize() with every candidate, then the callable and every raw
runtime by hand (tf.function; ONNX Runtime, and LiteRT converted at the sample's shapes,
where the model converts) timed in one interleaved measurement; repeated `--repeats` times
(a new optimize() each time) to see whether the choice and the ratio hold. Target: the
callable within 5% of the fastest raw runtime in every repeat.

From the repository's root:

    python -m benchmarks.studies.regrets [--cases gru-varlen,cnn-free-hw,py-function] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

import infertune
from benchmarks import harness

TARGET = 0.95


def _case(name: str):
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    if name == "gru-varlen":
        model = keras.Sequential([keras.Input((None, 16)), keras.layers.GRU(32)])
        return model, rng.standard_normal((2, 25, 16)).astype("float32")
    if name == "cnn-free-hw":
        inputs = keras.Input((None, None, 3))
        h = keras.layers.Conv2D(16, 3, activation="relu")(inputs)
        h = keras.layers.Conv2D(16, 3, activation="relu")(h)
        h = keras.layers.GlobalAveragePooling2D()(h)
        model = keras.Model(inputs, keras.layers.Dense(10)(h))
        return model, rng.uniform(0, 255, (1, 64, 64, 3)).astype("float32")
    if name == "py-function":

        class Doubled(keras.layers.Layer):
            """A Python function inside the graph: no converter takes it."""

            def call(self, x):
                y = tf.py_function(lambda t: t * 2.0, [x], tf.float32)
                y.set_shape(x.shape)
                return y

        model = keras.Sequential(
            [
                keras.Input((32,)),
                keras.layers.Dense(64, activation="relu"),
                Doubled(),
                keras.layers.Dense(8),
            ]
        )
        return model, rng.standard_normal((4, 32)).astype("float32")
    raise ValueError(f"unknown case {name!r}")


CASES = ("gru-varlen", "cnn-free-hw", "py-function")


def run(name: str, budget_s: float) -> dict:
    model, x = _case(name)
    opt = infertune.optimize(model, x, verbose=False)
    runners = {"infertune": lambda: opt(x), "tf.function": harness.tf_function(model, x)}
    try:
        runners["onnxruntime"] = harness.onnxruntime_session(harness.onnx_bytes(model, x), x)
    except Exception as exc:  # the py_function model does not convert: said in the output
        print(f"  {name}: onnxruntime by hand: {type(exc).__name__}", file=sys.stderr)
    try:  # converted at the sample's shapes, as infertune's exact-shape LiteRT is
        runners["litert"] = harness.litert_interpreter(model, x)
    except Exception as exc:
        print(f"  {name}: litert by hand: {type(exc).__name__}", file=sys.stderr)
    cooldown = {
        "onnxruntime": harness.onnxruntime_cooldown_s(),
        "infertune": max(b.cooldown_s for b in opt.backends),
    }
    measured = harness.measure_runners(runners, budget_s=budget_s, cooldown_s=cooldown)
    p50 = {label: s.p50 * 1e3 for label, s in measured.stats.items()}  # us
    raw = {label: v for label, v in p50.items() if label != "infertune"}
    best = min(raw, key=raw.get)
    return {
        "case": name,
        "chosen": opt.backend,
        "p50_us": p50,
        "best_raw": best,
        "ratio": raw[best] / p50["infertune"],
        "fates": {c.name: c.status for c in opt.report.candidates},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget", type=float, default=4.0, help="seconds of timing per run")
    args = parser.parse_args()
    misses = 0
    print("| case | repeat | infertune chose | infertune us | fastest raw (us) | vs raw |")
    print("|---|---|---|---|---|---|")
    for name in args.cases.split(","):
        for repeat in range(args.repeats):
            r = run(name, args.budget)
            p50 = r["p50_us"]
            print(
                f"| {name} | {repeat + 1} | {r['chosen']} | {p50['infertune']:.0f} | "
                f"{p50[r['best_raw']]:.0f} ({r['best_raw']}) | {r['ratio']:.2f}x |",
                flush=True,
            )
            misses += r["ratio"] < TARGET
    print(f"{misses} run(s) below {TARGET}x the fastest raw runtime")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
