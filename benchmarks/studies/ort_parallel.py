"""ONNX Runtime's parallel execution mode against its default (sequential), on a chain of
layers and on a model with parallel branches: what infertune's `onnxruntime-cpu:parallel`
candidate is worth, and why it is not tried on a graph without parallel branches.

Each model's ONNX export is run by two sessions that differ only in execution_mode, timed in
one interleaved run (infertune's measurement engine), median ms per call.

From the repository's root:

    python -m benchmarks.studies.ort_parallel [--budget 5]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import onnxruntime

from benchmarks import harness
from infertune.demo import demo_model
from infertune.export.onnx import parallel_width


def branches(seed: int = 0):
    """Four parallel Dense towers over one input, concatenated (an Inception-like block)."""
    keras.utils.set_random_seed(seed)
    x = keras.Input((256,))
    towers = [keras.layers.Dense(512, activation="relu")(x) for _ in range(4)]
    return keras.Model(x, keras.layers.Dense(10)(keras.layers.Concatenate()(towers)))


def models():
    cnn, cnn_x = demo_model("small-cnn")
    rng = np.random.default_rng(0)
    yield "small-cnn (chain), batch 1", cnn, cnn_x
    yield "four towers (branches), batch 32", branches(), rng.random((32, 256), np.float32)


def session(model_bytes: bytes, sample, mode: str):
    options = onnxruntime.SessionOptions()
    options.execution_mode = getattr(onnxruntime.ExecutionMode, mode)
    return harness.onnxruntime_session(model_bytes, sample, options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=5.0, help="measurement s per model")
    args = parser.parse_args()
    print(harness.machine_description())
    print("| model | parallel width | sequential ms | parallel ms | parallel / sequential |")
    print("|---|---|---|---|---|")
    for label, model, sample in models():
        model_bytes = harness.onnx_bytes(model, sample)
        import onnx

        width = parallel_width(onnx.load_from_string(model_bytes).graph)
        runners = {
            "sequential": session(model_bytes, sample, "ORT_SEQUENTIAL"),
            "parallel": session(model_bytes, sample, "ORT_PARALLEL"),
        }
        cooldown = dict.fromkeys(runners, harness.onnxruntime_cooldown_s())
        stats = harness.measure_runners(runners, budget_s=args.budget, cooldown_s=cooldown).stats
        seq, par = stats["sequential"].p50, stats["parallel"].p50
        print(f"| {label} | {width} | {seq:.4f} | {par:.4f} | {par / seq:.2f}x |")


if __name__ == "__main__":
    main()
