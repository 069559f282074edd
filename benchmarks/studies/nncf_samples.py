"""NNCF's calibration samples: the time of `openvino-cpu-int8`'s quantization and the int8
model's accuracy, by the number of samples it collects statistics on.

infertune gives NNCF the first 32 calibration samples on a graph without attention and 128
on a transformer-shaped one (backends/openvino/quantize.py). Per model of the precision benchmark
(trained, from its cache: run benchmarks/precision.py once first), this quantizes infertune's
ONNX export with each count, every sample given used (backends/openvino/quantize.py
`quantize_for_openvino`, nothing recorded between them), interleaved over the rounds, and
reports the seconds and the int8 model's accuracy on the gate and test splits (OpenVINO with
f32 inference precision, as the candidates compile it; batches of 32):

From the repository's root:

    python -m benchmarks.studies.nncf_samples --models resnet50-224,bert-encoder --samples 32,128
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from benchmarks import bench_models
from benchmarks.bench_models import openvino_outputs, target_of


def accuracy(compiled, data, split: str) -> float:
    return bench_models.accuracy_of(openvino_outputs(compiled, data, split), data.y(split))


def one_model(name: str, counts: list[int], rounds: int, cache: Path) -> None:
    import openvino
    import openvino.properties.hint as hints

    from infertune.backends.openvino import quantize as openvino_int8
    from infertune.export.onnx import convert_to_onnx

    model, data = bench_models.cached_model(name, cache)
    calibration = data.x("calibration")
    exported = convert_to_onnx(target_of(model, calibration[:1]))
    core = openvino.Core()
    # OpenVINO computes in bf16 on a CPU with bf16 units unless told otherwise
    f32 = {hints.inference_precision: openvino.Type.f32}
    reference = core.compile_model(core.read_model(exported.session_model()), "CPU", f32)
    gate, test = accuracy(reference, data, "gate"), accuracy(reference, data, "test")
    print(f"{name}: float32 gate {gate:.4f}, test {test:.4f}")
    for round_ in range(rounds):
        for count in counts:
            feeds = [{exported.input_names[0]: calibration[i : i + 1]} for i in range(count)]
            exported.derived.clear()  # no statistics recorded by the count before
            # every sample given is used, attention or not (infertune's own cut, lifted)
            openvino_int8.SAMPLES_WITHOUT_ATTENTION = count
            start = time.perf_counter()
            quantized = openvino_int8.quantize_for_openvino(exported, feeds)
            seconds = time.perf_counter() - start
            compiled = core.compile_model(quantized.model, "CPU", f32)
            print(
                f"{name} round {round_ + 1}, {count} samples given ({quantized.settings}): "
                f"{seconds:.1f} s, gate {accuracy(compiled, data, 'gate'):.4f}, "
                f"test {accuracy(compiled, data, 'test'):.4f}",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="digits-cnn,shapes-mobilenetv2,resnet50-224")
    parser.add_argument("--samples", default="32,128")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--cache", type=Path, default=bench_models.DEFAULT_CACHE.expanduser())
    args = parser.parse_args()
    counts = [int(c) for c in args.samples.split(",")]
    for name in args.models.split(","):
        one_model(name, counts, args.rounds, args.cache)


if __name__ == "__main__":
    main()
