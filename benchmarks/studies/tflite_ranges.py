"""LiteRT's full int8 ranges: TFLite's calibrator against infertune's range pass.

`litert-int8` quantizes the float32 TFLite conversion on activation ranges measured on the
first 32 calibration samples (backends/litert/quantize.py `_calibrated`). TFLite's calibrator runs
the
model one sample at a time in its interpreter, on one core; infertune's range pass runs it
with XNNPACK, every tensor an op reads or writes made an output (`_ranged`). Per model of the
precision benchmark (trained, from its cache: run benchmarks/precision.py once first), this
times the two on the same float32 conversion, interleaved over the rounds, then quantizes each
and reports the int8 model's accuracy and its relative error against the float32 model on the
gate and test splits:

From the repository's root:

    python -m benchmarks.studies.tflite_ranges --models digits-cnn,tokens-transformer,resnet50-224
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from benchmarks import bench_models
from benchmarks.bench_models import target_of

WAYS = ("calibrator", "range pass")


def ranged(flatbuffer: bytes, samples, way: str) -> tuple[bytes, float]:
    """The flatbuffer with its ranges measured `way`, and the seconds it took."""
    from infertune.backends.litert import quantize as tflite

    measure = tflite._ranged if way == "range pass" else tflite._calibrator_ranged
    start = time.perf_counter()
    content = measure(flatbuffer, samples)
    return content, time.perf_counter() - start


def int8_predictions(content: bytes, xs: np.ndarray) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=content, num_threads=2)
    feed = interpreter.get_input_details()[0]["index"]
    out = interpreter.get_output_details()[0]["index"]
    rows = []
    for i in range(len(xs)):
        if i == 0:
            interpreter.resize_tensor_input(feed, xs[:1].shape)
            interpreter.allocate_tensors()
        interpreter.set_tensor(feed, xs[i : i + 1])
        interpreter.invoke()
        rows.append(interpreter.get_tensor(out).copy())
    return np.concatenate(rows)


def one_model(name: str, rounds: int, cache: Path) -> None:
    from tensorflow.lite.python import convert, lite

    from infertune.backends.litert import quantize as tflite
    from infertune.precision.data import calibration_batches

    model, data = bench_models.cached_model(name, cache)
    sample = data.x("test")[:1]
    model(sample)
    target = target_of(model, sample)
    float32 = tflite.convert_free(target)
    flatbuffer = float32.content
    batches = calibration_batches(data.x("calibration"), target.signature)
    rows = np.concatenate([b[0] for b in batches])[: tflite.CALIBRATION_SAMPLES]

    def samples():
        return ([row[None]] for row in rows)

    seconds: dict[str, list[float]] = {w: [] for w in WAYS}
    made: dict[str, bytes] = {}
    for _ in range(rounds):
        for way in WAYS:
            made[way], s = ranged(flatbuffer, samples, way)
            seconds[way].append(s)
    for way in WAYS:
        with tflite._quiet_converter():
            quantized = lite._deduplicate_readonly_buffers(convert.mlir_quantize(made[way]))
        line = [f"{name:20s} {way:10s} ranges {min(seconds[way]):6.2f}-{max(seconds[way]):.2f} s"]
        for split in ("gate", "test"):
            xs, ys = data.x(split), data.y(split)
            reference = model.predict(xs, batch_size=32, verbose=0)
            predicted = int8_predictions(quantized, xs)
            accuracy = float(np.mean(predicted.argmax(-1) == ys))
            error = float(np.linalg.norm(predicted - reference) / np.linalg.norm(reference))
            fp32 = float(np.mean(reference.argmax(-1) == ys))
            line.append(
                f"{split} accuracy {accuracy:.4f} (fp32 {fp32:.4f}), relative error {error:.4f}"
            )
        print(" | ".join(line), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="digits-cnn,shapes-mobilenetv2,tokens-transformer")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=bench_models.DEFAULT_CACHE)
    args = parser.parse_args()
    for name in args.models.split(","):
        one_model(name, args.rounds, args.cache.expanduser())


if __name__ == "__main__":
    main()
