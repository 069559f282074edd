"""What LiteRT's call path costs: public interpreter methods, native calls, infertune's callable.

From the repository's root:

    python -m benchmarks.studies.litert_calls [--model small-cnn] [--budget 15]

One process, one TFLite conversion at the sample's shape, one thread, timed in interleaved
rounds by infertune's engine:

* "public": set_tensor / invoke / get_tensor, as written by hand (benchmarks/harness.py);
* "native": the same calls on another interpreter of the same model, made on its pybind
  wrapper, as infertune's LiteRT backend makes them (no Python frames, no refcount check);
* "opt(x)": infertune's callable for `litert:threads=1` (its input check, then its runner).

Prints each one's median and its speed relative to "public" (the median of the per-round
ratios: above 1 is faster).
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

import infertune
from benchmarks import harness
from infertune.demo import demo_model
from infertune.pipeline.timing import measure_interleaved, warm_up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="small-cnn")
    parser.add_argument("--budget", type=float, default=15.0, help="measurement seconds")
    args = parser.parse_args()
    from ai_edge_litert.interpreter import Interpreter

    model, sample = demo_model(args.model)
    flatbuffer = harness.tflite_bytes(model, sample)  # one conversion for both interpreters
    public = harness.litert_interpreter(model, sample, flatbuffer)
    opt = infertune.optimize(model, sample, backends=["litert:threads=1"], verbose=False)
    interpreter = Interpreter(model_content=flatbuffer, num_threads=1)
    interpreter.allocate_tensors()
    first_input = interpreter.get_input_details()[0]["index"]
    first_output = interpreter.get_output_details()[0]["index"]
    wrapper = interpreter._interpreter

    def native():
        wrapper.SetTensor(first_input, sample)
        wrapper.Invoke()
        return wrapper.GetTensor(first_output)

    runners = {"public": public, "native": native, "opt(x)": lambda: opt(sample)}
    reference = public()
    for name, runner in runners.items():
        np.testing.assert_array_equal(runner(), reference, err_msg=name)
    estimates = {name: warm_up(runner) for name, runner in runners.items()}
    result = measure_interleaved(
        runners, budget_s=args.budget, per_call_estimate_s=estimates, min_rounds=30
    )
    base = np.asarray(result.stats["public"].round_medians)
    print(f"{args.model}, sample {sample.shape}, {result.stats['public'].rounds} rounds")
    for name, stats in result.stats.items():
        speed = float(np.median(base / np.asarray(stats.round_medians)))
        print(f"{name:8s} p50 {stats.p50 * 1e3:8.2f} us   {speed:.3f}x public")


if __name__ == "__main__":
    main()
