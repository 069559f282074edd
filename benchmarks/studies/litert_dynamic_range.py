"""LiteRT's dynamic-range int8 against its full int8 and float32, by model.

Dynamic-range int8 (`litert-dynamic-int8`) keeps the activations in float32 and quantizes each
quantized op's input at every call; full int8 (`litert-int8`) runs int8 from the input to the
output on calibrated ranges. Which is faster depends on the model: this converts each model the
way infertune does (backends/litert/convert.py: the float32 conversion, the dynamic-range one, full
int8
calibrated on 32 samples) and times the three with XNNPACK on every core, batch 1, interleaved
over the rounds; p50 per call and the ratios. The precision benchmark's trained models come
from its cache (run benchmarks/precision.py once first); `resnet50-224-random` and
`mobilenetv2-224-random` are Keras' applications with random weights (speed only: the
arithmetic is what counts), with their arithmetic per call as infertune counts it:

From the repository's root:

    python -m benchmarks.studies.litert_dynamic_range --rounds 5
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from benchmarks import bench_models, harness
from benchmarks.bench_models import target_of

WAYS = ("float32", "dynamic-range int8", "full int8")
MODELS = (
    "digits-cnn",
    "shapes-mobilenetv2",
    "tokens-transformer",
    "mobilenetv2-224-random",
    "resnet50-224-random",
)
CALLS = 30  # per way and round


def model_and_inputs(name: str, cache: Path):
    """The model and its calibration inputs (the precision benchmark's split, or random)."""
    if name.endswith("-random"):
        import keras

        keras.utils.set_random_seed(0)
        make = (
            keras.applications.ResNet50
            if name.startswith("resnet")
            else keras.applications.MobileNetV2
        )
        model = make(weights=None, input_shape=(224, 224, 3))
        rng = np.random.default_rng(0)
        return model, rng.random((32, 224, 224, 3), dtype=np.float32)
    model, data = bench_models.cached_model(name, cache)
    return model, data.x("calibration")[:32]


def conversions(model, calibration: np.ndarray) -> tuple[dict[str, bytes], float | None]:
    """Each way's flatbuffer, made as infertune makes it, and the model's GFLOP per call."""
    from infertune.backends.litert.convert import convert_free
    from infertune.backends.litert.quantize import convert_int8
    from infertune.pipeline.diagnosis import trace_and_count

    target = target_of(model, calibration[:1])
    target.calibration = [[calibration]]
    flops = trace_and_count(target.source.graph_function(target.signature), [calibration[:1]])[0]
    flatbuffers = {
        "float32": convert_free(target).content,
        "dynamic-range int8": convert_int8(target, None).content,
        "full int8": convert_int8(target, target.calibration).content,
    }
    return flatbuffers, flops / 1e9 if flops else None


def one_model(name: str, rounds: int, cache: Path) -> None:
    from ai_edge_litert.interpreter import Interpreter

    model, calibration = model_and_inputs(name, cache)
    flatbuffers, gflops = conversions(model, calibration)
    x = calibration[:1]
    calls = {}
    for way, content in flatbuffers.items():
        interpreter = Interpreter(model_content=content, num_threads=2)
        interpreter.allocate_tensors()
        feed = interpreter.get_input_details()[0]["index"]
        interpreter.set_tensor(feed, x)
        interpreter.invoke()
        calls[way] = interpreter
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    for _ in range(rounds):
        for way in WAYS:
            interpreter = calls[way]
            for _ in range(CALLS):
                start = time.perf_counter()
                interpreter.invoke()
                times[way].append(time.perf_counter() - start)
    p50 = {way: float(np.median(times[way])) * 1e3 for way in WAYS}
    size = f"{gflops:.3g} GFLOP a call" if gflops is not None else "arithmetic not counted"
    print(
        f"| {name} | {size} | {p50['float32']:.4g} | {p50['dynamic-range int8']:.4g} | "
        f"{p50['full int8']:.4g} | {p50['dynamic-range int8'] / p50['full int8']:.2f}x |",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cache", type=Path, default=bench_models.DEFAULT_CACHE.expanduser())
    args = parser.parse_args()
    harness.warm_up_optimize(("fp32", "bf16", "int8"), bench_models.MAX_DROP)
    print(f"LiteRT {WAYS}, p50 ms at batch 1, XNNPACK on 2 threads, {args.rounds} rounds")
    print("| model | arithmetic | float32 | dynamic-range int8 | full int8 | dynamic / full |")
    print("|---|---|---|---|---|---|")
    for name in args.models.split(","):
        one_model(name, args.rounds, args.cache)


if __name__ == "__main__":
    main()
