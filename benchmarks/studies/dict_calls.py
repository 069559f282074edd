"""What the call path costs on a model of many dict inputs: opt(x) against its own runtime.

From the repository's root:

    python -m benchmarks.studies.dict_calls [--model recommender|two-tower] [--ids int64|int32]
                                            [--budget 15] [--quick]

`recommender`: the production benchmark's recommender (bench_models.py; four dict inputs:
three int64 id tensors and thirteen float32 features; two named heads; without its
multi-hot part),
tuned on ONNX Runtime's CPU candidates only. `two-tower`: its two-tower model (four dict
inputs, int64 ids and history, float32 item features; one output), tuned on LiteRT's
candidates only. In one process, timed in interleaved rounds by infertune's engine:

* "chosen session" (recommender): the session infertune chose, its public `run(None,
  feed)` on the feed infertune builds (the same arrays, cast where the model declares
  another dtype);
* "chosen run": the chosen backend's `run` on the flat arrays, already checked (what
  infertune's own measurement times);
* "by hand": the runtime's defaults by hand (harness.py) on the caller's own arrays: ONNX
  Runtime's session on a tf2onnx export, or a LiteRT interpreter;
* "opt(x)": infertune's callable on the caller's dict.

`--ids int32` declares the recommender's ids int32 while the caller still passes int64 (as
numpy makes them): each call then casts three arrays. Prints each one's median and opt(x)'s
time relative to each (the median of the per-round ratios: below 1.05 is the target).
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

import infertune
from benchmarks import bench_models, harness
from infertune.pipeline.timing import (
    measure_interleaved,
    warm_up,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("recommender", "two-tower"), default="recommender")
    parser.add_argument("--ids", choices=("int64", "int32"), default="int64")
    parser.add_argument("--budget", type=float, default=15.0, help="measurement seconds")
    parser.add_argument("--quick", action="store_true", help="the tiny model, 2 s measuring")
    args = parser.parse_args()
    import keras

    sizes = bench_models.QUICK if args.quick else bench_models.FULL
    budget = 2.0 if args.quick else args.budget
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    if args.model == "two-tower":
        model = bench_models.two_tower(sizes)
        sample = bench_models.two_tower_inputs(rng, 1, sizes)
        prefix = "litert"
    else:
        model = bench_models.recommender(sizes, multi_hot=False)
        if args.ids == "int32":  # the same layers on int32 inputs
            model = _with_int32_ids(model)
        sample = bench_models.recommender_inputs(rng, 1, sizes)
        prefix = "onnxruntime-cpu"
    backends = [n for n in infertune.available_backends() if n.startswith(prefix)]
    backends = [n for n in backends if "int8" not in n]
    opt = infertune.optimize(model, sample, backends=backends, verbose=False)
    chosen = opt.backends[0]
    flat = opt.input_signature.flatten(sample)
    runners = {"chosen run": lambda: chosen.run(flat)}
    if args.model == "two-tower":
        raw = harness.litert_interpreter(model, sample)
    else:
        session = chosen._session
        feed = dict(zip(chosen._input_names, flat))
        runners["chosen session"] = lambda: session.run(None, feed)
        raw = harness.onnxruntime_session(harness.onnx_bytes(model, sample), sample)
    runners.update({"by hand": raw, "opt(x)": lambda: opt(sample)})
    reference = raw()
    reference = reference if isinstance(reference, list) else [reference]
    for name, runner in runners.items():
        out = runner()
        out = [out[key] for key in sorted(out)] if isinstance(out, dict) else out
        out = out if isinstance(out, list) else [out]
        for got, want in zip(out, reference):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)
    estimates = {name: warm_up(runner) for name, runner in runners.items()}
    result = measure_interleaved(
        runners,
        budget_s=budget,
        per_call_estimate_s=estimates,
        cooldown_s={name: chosen.cooldown_s for name in runners},
        min_rounds=30,
    )
    ours = np.asarray(result.stats["opt(x)"].round_medians)
    print(
        f"{args.model}, ids {args.ids} in the model, int64 passed; chose {opt.backend}; "
        f"{result.stats['opt(x)'].rounds} rounds"
    )
    for name, stats in result.stats.items():
        theirs = np.asarray(stats.round_medians)
        both = min(len(ours), len(theirs))  # a runner 1.5x behind leaves the rounds early
        ratio = float(np.median(ours[:both] / theirs[:both]))
        print(
            f"{name:15s} p50 {stats.p50 * 1e3:8.2f} us   opt(x) takes {ratio:.3f}x its time "
            f"({both} rounds)"
        )


def _with_int32_ids(model):
    """The model behind int32 id inputs (a cast to int64 inside, as Keras makes it)."""
    import keras

    inputs = {
        name: keras.Input(tensor.shape[1:], dtype="int32" if name != "features" else "float32",
                          name=name)
        for name, tensor in model.input.items()
    }  # fmt: skip
    return keras.Model(inputs, model(inputs), name="recommender_int32")


if __name__ == "__main__":
    main()
