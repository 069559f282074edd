"""NNCF's settings against the gate: which of them lets OpenVINO's int8 pass with fewer layers
kept in float32, and at what speed.

On the BERT-sized encoder of the precision benchmark NNCF's int8 quantized throughout fails
the gate (3.2 points lost by hand), and infertune's search passes it with five layers kept
in float32, 1.3-1.4x slower than throughout. Per model (trained, from the benchmark's cache:
run benchmarks/precision.py once first), this quantizes infertune's ONNX export with
`nncf.quantize` under each setting below (128 calibration samples, the transformer rules where
the graph has attention, as backends/openvino/quantize.py does), judges each on the gate split by
infertune's gate (infertune.accuracy.judge_metric: max_drop=0.01, 95% paired bootstrap bound)
and on the test split, counts the gate samples whose verdict changed, then times every one
at batch 1, interleaved with OpenVINO in float32 (infertune.pipeline.timing.measure_interleaved).
Layers kept are infertune's ranking's first (pipeline/precision.py `ranking_inputs`).
Besides NNCF's post-training quantization, int8 weights alone (`nncf.compress_weights`, no
calibration), with the activations in float32 or quantized by OpenVINO at every call
(`WEIGHTS_ONLY`): what a quantization that needs no calibrated activation ranges gives.
Timings: p50 in ms, against NNCF's int8 quantized throughout and OpenVINO in float32.

From the repository's root:

    python -m benchmarks.studies.nncf_settings --models bert-encoder \\
        [--settings "throughout,int8 weights"]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from benchmarks import bench_models
from benchmarks.bench_models import openvino_outputs, ranked_layers, target_of

SAMPLES = 128
# label -> (SmoothQuant alpha for MatMul, or None for NNCF's default; other nncf.quantize
# arguments; layers of the ranking kept in float32; OpenVINO's inference precision)
SETTINGS = {
    "throughout": (None, {}, 0, "f32"),
    "SmoothQuant 0.8": (0.8, {}, 0, "f32"),
    "SmoothQuant 0.5": (0.5, {}, 0, "f32"),
    "SmoothQuant off": (-1.0, {}, 0, "f32"),
    "full bias correction": (None, {"fast_bias_correction": False}, 0, "f32"),
    "1 kept": (None, {}, 1, "f32"),
    "1 kept, SmoothQuant off": (-1.0, {}, 1, "f32"),
    "1 kept, performance preset": (None, {"preset": "performance"}, 1, "f32"),
    "2 kept": (None, {}, 2, "f32"),
    "5 kept": (None, {}, 5, "f32"),
    "5 kept, the rest in bf16": (None, {}, 5, "bf16"),
}
# label -> OpenVINO's DYNAMIC_QUANTIZATION_GROUP_SIZE: int8 weights alone (nncf.compress_weights,
# asymmetric per channel, no calibration), the activations float32 (0) or quantized at every
# call in groups of that many values (the CPU plugin's dynamic quantization)
WEIGHTS_ONLY = {
    "int8 weights alone": 0,
    "int8 weights, activations per call in groups of 32": 32,
    "int8 weights, activations per call in groups of 128": 128,
}


def quantize(exported, feeds, alpha, extra: dict, keep: list[str], transformer: bool):
    import nncf
    import openvino
    from nncf.quantization.advanced_parameters import (
        AdvancedQuantizationParameters,
        AdvancedSmoothQuantParameters,
    )

    from infertune.precision.layers import keep_pattern

    arguments = dict(extra)
    if "preset" in arguments:
        arguments["preset"] = nncf.QuantizationPreset(arguments["preset"])
    if alpha is not None:
        smooth = AdvancedSmoothQuantParameters(matmul=alpha)
        arguments["advanced_parameters"] = AdvancedQuantizationParameters(
            smooth_quant_alphas=smooth
        )
    if keep:
        patterns = [f".*{keep_pattern(scope)}.*" for scope in keep]
        arguments["ignored_scope"] = nncf.IgnoredScope(patterns=patterns, validate=False)
    if transformer:
        arguments["model_type"] = nncf.ModelType.TRANSFORMER
    model = openvino.Core().read_model(exported.session_model())
    return nncf.quantize(model, nncf.Dataset(feeds), subset_size=len(feeds), **arguments)


def one_model(name: str, budget: float, cache: Path, chosen: list[str]) -> None:
    import logging

    os.environ.setdefault("NNCF_CI", "1")  # no telemetry
    import nncf
    import openvino
    import openvino.properties.hint as hints

    from infertune.accuracy import Accuracy, judge_metric
    from infertune.backends.openvino.quantize import transformer_shaped
    from infertune.export.onnx import convert_to_onnx
    from infertune.pipeline.timing import measure_interleaved
    from infertune.system.quiet import stdout_silenced

    nncf.set_log_level(logging.ERROR)
    model, data = bench_models.cached_model(name, cache)
    calibration = data.x("calibration")
    target = target_of(model, calibration[:1])
    target.calibration = [[calibration]]
    exported = convert_to_onnx(target)
    ranking = ranked_layers(target)
    core = openvino.Core()
    float_model = core.read_model(exported.session_model())
    transformer = transformer_shaped(float_model)
    f32 = {hints.inference_precision: openvino.Type.f32}
    reference = core.compile_model(float_model, "CPU", f32)
    gate_labels, test_labels = data.y("gate"), data.y("test")
    reference_gate, reference_test = (
        openvino_outputs(reference, data, "gate"),
        openvino_outputs(reference, data, "test"),
    )
    right = reference_gate.argmax(-1) == gate_labels
    rule = Accuracy((data.x("gate"), gate_labels), "accuracy", max_drop=bench_models.MAX_DROP)
    test_fp32 = bench_models.accuracy_of(reference_test, test_labels)
    print(f"{name}: the ranking's first layers: {', '.join(ranking[:5])}")
    feeds = [{exported.input_names[0]: calibration[i : i + 1]} for i in range(SAMPLES)]
    compiled = {"OpenVINO f32": reference}
    compressed = None
    for label in chosen:
        start, reused = time.perf_counter(), False
        with stdout_silenced():  # NNCF's progress bars
            if label in SETTINGS:
                alpha, extra, kept, inference = SETTINGS[label]
                quantized = quantize(exported, feeds, alpha, extra, ranking[:kept], transformer)
                wanted = {hints.inference_precision: getattr(openvino.Type, inference)}
            else:  # the weights compressed once, for every group size
                reused = compressed is not None
                if compressed is None:
                    compressed = nncf.compress_weights(core.read_model(exported.session_model()))
                quantized = compressed
                wanted = {**f32, "DYNAMIC_QUANTIZATION_GROUP_SIZE": str(WEIGHTS_ONLY[label])}
        seconds = time.perf_counter() - start
        made = "the weights compressed above" if reused else f"quantized in {seconds:.1f} s"
        compiled[label] = core.compile_model(quantized, "CPU", wanted)
        gate = openvino_outputs(compiled[label], data, "gate")
        verdict = judge_metric(rule, [gate_labels], [reference_gate], [gate])
        changed = int(((gate.argmax(-1) == gate_labels) != right).sum())
        test_outputs = openvino_outputs(compiled[label], data, "test")
        test = bench_models.accuracy_of(test_outputs, test_labels)
        print(
            f"  {label}: {made}; gate {verdict.metric:.4f} against "
            f"{verdict.reference_metric:.4f}, drop {100 * verdict.drop:+.2f} points, bound "
            f"{100 * verdict.drop_bound:+.2f} ({'passes' if verdict else 'fails'}), "
            f"{changed} samples changed; test {test:.4f} against {test_fp32:.4f}",
            flush=True,
        )
    sample = [data.x("gate")[:1]]
    measured = measure_interleaved(
        {label: (lambda c=c: c(sample)) for label, c in compiled.items()},
        budget_s=budget,
        min_rounds=5,
        race=False,
    )
    f32_p50 = measured.stats["OpenVINO f32"].p50
    throughout = measured.stats.get("throughout")
    for label, stats in measured.stats.items():
        against = f"{stats.p50 / throughout.p50:.2f}x throughout's time, " if throughout else ""
        print(
            f"  {label}: p50 {stats.p50:.3g} ms ({against}{f32_p50 / stats.p50:.2f}x faster "
            "than f32)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="bert-encoder")
    parser.add_argument("--budget", type=float, default=20.0, help="s of interleaved timing")
    parser.add_argument("--cache", type=Path, default=bench_models.DEFAULT_CACHE.expanduser())
    parser.add_argument(
        "--settings",
        help="comma-separated labels, or the start of labels (default all): "
        f"{list(SETTINGS) + list(WEIGHTS_ONLY)}",
    )
    args = parser.parse_args()
    known = list(SETTINGS) + list(WEIGHTS_ONLY)
    wanted = [w for w in args.settings.split(",") if w] if args.settings else [""]
    chosen = [label for label in known if any(label.startswith(w) for w in wanted)]
    if not chosen:
        parser.error(f"no setting starts with {wanted}; known: {known}")
    for name in args.models.split(","):
        one_model(name, args.budget, args.cache, chosen)


if __name__ == "__main__":
    main()
