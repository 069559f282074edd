"""Reduced precision judged by the task: calibrated int8 and bf16 candidates on a trained tiny
classifier, the gate (a metric on labelled data with a margin, or agreement with the model),
layers kept in float32 where quantization breaks one, and the clear errors before any long
work. Real training (scikit-learn's digits, bundled offline), real quantizers, real runtimes."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers import needs_litert, needs_onnxruntime, needs_openvino

import infertune
from infertune.accuracy import Accuracy, judge_agreement, judge_metric
from infertune.errors import InputError, OptionError

INT8 = ("fp32", "int8")


@pytest.fixture(scope="module")
def digits():
    """The 8x8 handwritten digits in [0, 1]: 1,797 images, split for training,
    calibration and the gate."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.images[..., None] / 16.0).astype("float32")
    y = data.target.astype("int32")
    return {
        "train": (x[:1000], y[:1000]),
        "calibration": x[1000:1200],
        "validation": (x[1200:1600], y[1200:1600]),
    }


def _trained(layers, x, y, epochs=12):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 1)), *layers])
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile("adam", loss)
    model.fit(x, y, epochs=epochs, batch_size=64, verbose=0)
    return model


@pytest.fixture(scope="module")
def classifier(digits):
    """A small CNN trained to about 90% on the digits."""
    import keras

    layers = [
        keras.layers.Conv2D(16, 3, activation="relu", name="conv_a"),
        keras.layers.Conv2D(32, 3, activation="relu", name="conv_b"),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu", name="hidden"),
        keras.layers.Dense(10, name="head"),
    ]
    return _trained(layers, *digits["train"])


@pytest.fixture(scope="module")
def dense_classifier(digits):
    """An MLP on the same digits (Dense only: what dynamic int8 is for)."""
    import keras

    layers = [
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu", name="hidden"),
        keras.layers.Dense(10, name="head"),
    ]
    return _trained(layers, *digits["train"])


def _accuracy(model, x, y) -> float:
    return float(np.mean(np.argmax(model.predict(x, verbose=0), axis=-1) == y))


def _by_name(opt):
    return {c.name: c for c in opt.report.candidates}


# -- every candidate on a trained classifier -------------------------------------------------
@pytest.mark.slow
@needs_onnxruntime
@needs_openvino
@needs_litert
def test_each_int8_candidate_quantizes_and_passes_the_task(classifier, digits):
    """Two batch sizes served: every reduced candidate is judged (at one, only those that
    can still be chosen: test_a_reduced_candidate_slower_than_one_verified_is_not_judged)."""
    x, y = digits["validation"]
    int8 = ["onnxruntime-cpu-int8-static", "openvino-cpu-int8", "litert-int8"]
    opt = infertune.optimize(
        classifier, x[:1], backends=["onnxruntime-cpu", *int8, "litert-dynamic-int8"],
        precision=INT8, calibration=digits["calibration"], batch_sizes=[1, 8],
        accuracy=Accuracy((x, y), "accuracy", max_drop=0.02), verbose=False,
    )  # fmt: skip
    found = _by_name(opt)
    reference = _accuracy(classifier, x, y)
    assert reference > 0.8  # trained (chance is 0.1): the gate decides on a real task
    for name in [*int8, "litert-dynamic-int8"]:
        c = found[name]
        assert c.status in ("ok", "selected"), f"{name}: {c.status} {c.reason}"
        assert c.metric_drop_bound <= 0.02 and c.gate.startswith("accuracy")
        assert c.reference_metric == pytest.approx(reference, abs=1e-9)
        assert c.metric == pytest.approx(reference - c.metric_drop)
        assert c.precision == "int8" and c.quantization
    assert "reduced precision, judged by accuracy" in str(opt.report)
    # The model's predictions on the labelled data beyond its first batch: by the fastest
    # float32 candidate verified (the model itself is slower), the same accuracy (above).
    notes = [n for n in opt.report.notes if "labelled data" in n]
    assert notes and "labelled data by onnxruntime-cpu (verified" in notes[0], opt.report.notes
    # An int8 candidate's outputs really are quantized: off the model by more than rtol.
    assert found["onnxruntime-cpu-int8-static"].max_rel_err > 1e-3


@pytest.mark.slow
@needs_litert
def test_litert_dynamic_range_is_not_tried_beside_full_int8_on_a_large_convolutional_model():
    """On a convolutional model of at least LARGE_FLOPS a call, LiteRT's dynamic-range int8 is
    slower than its full int8 (benchmarks/litert_dynamic_range.py): not tried where full int8
    is, with the reason; tried where it is the only int8 candidate, or without calibration."""
    import keras

    from infertune.backends.litert.int8 import LARGE_FLOPS

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((64, 64, 16)),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(4),
        ]
    )
    rng = np.random.default_rng(0)
    calibration = rng.random((16, 64, 64, 16), dtype=np.float32)
    both = ["litert-int8", "litert-dynamic-int8"]
    options = dict(precision=INT8, verbose=False)
    opt = infertune.optimize(
        model, calibration[:1], backends=both, calibration=calibration, **options
    )
    dynamic, full = _by_name(opt)["litert-dynamic-int8"], _by_name(opt)["litert-int8"]
    assert dynamic.status == "skipped", (dynamic.status, dynamic.reason)
    flops = opt.report.diagnosis.flops
    assert flops >= LARGE_FLOPS
    assert f"a convolutional model of {flops / 1e9:.2g} GFLOP a call" in dynamic.reason
    assert "slower than full int8 (litert-int8, tried here)" in dynamic.reason
    assert full.status in ("ok", "selected"), (full.status, full.reason)
    # Alone, or without calibration (no full int8 beside it): tried.
    alone = infertune.optimize(
        model, calibration[:1], backends=both[1:], calibration=calibration, **options
    )
    uncalibrated = infertune.optimize(model, calibration[:1], backends=both, **options)
    for opt in (alone, uncalibrated):
        assert _by_name(opt)["litert-dynamic-int8"].status in ("ok", "selected")


@pytest.mark.slow
@needs_onnxruntime
def test_dynamic_int8_is_kept_for_dense_models_and_skipped_for_convolutions(
    classifier, dense_classifier, digits
):
    x, y = digits["validation"]
    options = dict(backends=["onnxruntime-cpu-int8"], precision=INT8, verbose=False)
    accuracy = Accuracy((x, y), max_drop=0.02)
    on_dense = infertune.optimize(dense_classifier, x[:1], accuracy=accuracy, **options)
    assert _by_name(on_dense)["onnxruntime-cpu-int8"].status in ("ok", "selected")
    on_cnn = infertune.optimize(classifier, x[:1], accuracy=accuracy, **options)
    skipped = _by_name(on_cnn)["onnxruntime-cpu-int8"]
    assert skipped.status == "skipped" and "ConvInteger" in skipped.reason


@needs_openvino
def test_bf16_is_judged_by_agreement_without_accuracy(classifier, digits):
    from infertune.system.environment import (
        BF16_FLAGS,
        precision_instructions,
    )

    opt = infertune.optimize(
        classifier, digits["validation"][0][:2], backends=["openvino-cpu-bf16"],
        precision=("fp32", "bf16"), calibration=digits["calibration"], verbose=False,
    )  # fmt: skip
    bf16 = _by_name(opt)["openvino-cpu-bf16"]
    if not any(flag in precision_instructions() for flag in BF16_FLAGS):
        assert bf16.status == "skipped" and "no bf16 units" in bf16.reason
        return
    assert bf16.status in ("ok", "selected"), bf16.reason
    assert bf16.gate.startswith("agreement") and "top-1 agreement" in bf16.reason


def test_static_int8_without_calibration_is_skipped_saying_why(classifier, digits):
    x, y = digits["validation"]
    opt = infertune.optimize(
        classifier, x[:1], backends=["onnxruntime-cpu-int8-static", "litert-int8"],
        precision=INT8, accuracy=Accuracy((x, y)), verbose=False,
    )  # fmt: skip
    for c in opt.report.candidates[1:]:
        assert c.status == "skipped" and "needs calibration=" in c.reason


# -- layers kept in float32 ------------------------------------------------------------------
@pytest.fixture(scope="module")
def broken_by_one_layer(digits):
    """The MLP with one channel of its hidden layer scaled 5000x and the head's weights for
    it zeroed: float32 gives the same answers, but per-tensor int8 of that layer's output
    spends its range on the huge channel and flattens the others to zero."""
    import keras

    x, y = digits["train"]
    layers = [
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu", name="hidden"),
        keras.layers.Dense(32, activation="relu", name="wide"),
        keras.layers.Dense(10, name="head"),
    ]
    model = _trained(layers, x, y)
    kernel, bias = model.get_layer("wide").get_weights()
    kernel[:, 0] *= 5000.0
    bias[0] = 5000.0
    model.get_layer("wide").set_weights([kernel, bias])
    head_kernel, head_bias = model.get_layer("head").get_weights()
    head_kernel[0, :] = 0.0
    model.get_layer("head").set_weights([head_kernel, head_bias])
    return model


@pytest.mark.slow
@needs_onnxruntime
def test_a_layer_quantization_breaks_is_kept_in_float32(broken_by_one_layer, digits):
    x, y = digits["validation"]
    model = broken_by_one_layer
    # Only the model's own call competes: on a model this small int8 is no faster than
    # ONNX Runtime in float32, which would end the search (rightly) before it passes.
    opt = infertune.optimize(
        model, x[:1], backends=["onnxruntime-cpu-int8-static"],
        precision=INT8, calibration=digits["calibration"],
        accuracy=Accuracy((x, y), max_drop=0.02), verbose=False,
    )  # fmt: skip
    static = _by_name(opt)["onnxruntime-cpu-int8-static"]
    assert static.status in ("ok", "selected"), static.reason
    kept = [k["layer"] for k in static.kept_fp32]
    assert any("wide" in layer for layer in kept), kept
    assert "kept in float32" in static.quantization and "wide" in static.quantization
    assert static.metric_drop_bound <= 0.02
    assert "kept" in str(opt.report)


def _litert_int8(model, digits, max_drop: float):
    """optimize() with LiteRT's full int8 alone, gated on the digits' validation split."""
    x, y = digits["validation"]
    return infertune.optimize(
        model, x[:1], backends=["litert-int8"], precision=INT8,
        calibration=digits["calibration"], accuracy=Accuracy((x, y), max_drop=max_drop),
        verbose=False,
    )  # fmt: skip


@pytest.mark.slow
@needs_litert
def test_litert_keeps_the_broken_layer_in_float32_calibrating_once(
    broken_by_one_layer, digits, monkeypatch
):
    """LiteRT's full int8 with the huge-range layer kept in float32 passes; every search step
    quantizes the ranges the first calibration measured (backends/litert/quantize.py `_calibrated`):
    the
    model runs on the samples once, not once or twice per step."""
    from infertune.backends.litert import quantize as tflite

    calibrations = []
    measure = tflite._ranged

    def counted(*args, **kwargs):
        calibrations.append(1)
        return measure(*args, **kwargs)

    monkeypatch.setattr(tflite, "_ranged", counted)
    opt = _litert_int8(broken_by_one_layer, digits, max_drop=0.02)
    quantized = _by_name(opt)["litert-int8"]
    assert quantized.status in ("ok", "selected"), quantized.reason
    kept = [k["layer"] for k in quantized.kept_fp32]
    assert any("wide" in layer for layer in kept), kept
    assert quantized.metric_drop_bound <= 0.02
    assert len(calibrations) == 1, len(calibrations)


@needs_onnxruntime
def test_static_int8_keeping_layers_reads_the_first_calibrations_ranges(
    classifier, digits, monkeypatch
):
    """ONNX Runtime's static int8 with layers kept in float32 (a search step) reads the ranges
    its first calibration with that method found (backends/onnxruntime/quantize.py): the same
    model, byte
    for byte, as quantizing afresh with those layers kept, and the model runs on the samples
    once per method, not once per step."""
    import dataclasses
    import importlib

    from helpers import target_for

    from infertune.backends.onnxruntime.quantize import quantize_static_int8
    from infertune.export.onnx import convert_to_onnx
    from infertune.precision.layers import layer_scopes

    quantize = importlib.import_module("onnxruntime.quantization.quantize")  # the module
    calibrations = []
    create = quantize.create_calibrator

    def counted(*args, **kwargs):
        calibrations.append(kwargs.get("calibrate_method"))
        return create(*args, **kwargs)

    monkeypatch.setattr(quantize, "create_calibrator", counted)
    x = digits["calibration"]
    exported = convert_to_onnx(target_for(classifier, x[:1]))
    feeds = [{exported.input_names[0]: x[i : i + 1]} for i in range(16)]
    scopes = list(layer_scopes(exported))
    for method in ("minmax", "percentile"):
        calibrations.clear()
        quantize_static_int8(exported, feeds, method)
        steps = [quantize_static_int8(exported, feeds, method, tuple(scopes[:n])) for n in (1, 2)]
        assert len(calibrations) == 1, (method, calibrations)
        fresh = dataclasses.replace(exported, derived={})  # nothing kept: calibrates anew
        again = quantize_static_int8(fresh, feeds, method, tuple(scopes[:2]))
        assert again.model_bytes == steps[1].model_bytes, method
        assert steps[0].model_bytes != steps[1].model_bytes
        assert not steps[0].derived  # the float32 export's ranges are not the int8 model's
    other = [dict(feed) for feed in feeds[:8]]  # other calibration data: calibrated again
    calibrations.clear()
    quantize_static_int8(exported, other, "minmax", tuple(scopes[:1]))
    assert len(calibrations) == 1


@pytest.mark.slow
@needs_onnxruntime
@pytest.mark.parametrize("memory_tight", [False, True], ids=["all-held", "memory-tight"])
def test_a_reduced_candidate_slower_than_one_verified_is_not_judged(
    broken_by_one_layer, digits, monkeypatch, memory_tight
):
    """On this MLP ONNX Runtime in float32 takes about 10 us a call, its QDQ int8 form several
    times that: serving one batch size, the int8 one cannot be chosen and is not judged
    (gates took 41 of 135 s on ResNet50); serving two, it is judged (a candidate slower at
    one batch size may win at another), fails (its huge-range layer), and its search, which
    only slows it, is not made. The same where memory is tight, where each candidate is
    judged and searched as it comes, never timed with the others before: its gate, and its
    search, begin by timing it against them."""
    if memory_tight:
        monkeypatch.setenv("INFERTUNE_HOLD_ALL_BYTES", "1")  # for any model
    x, y = digits["validation"]
    options = dict(
        backends=["onnxruntime-cpu", "onnxruntime-cpu-int8-static"], precision=INT8,
        calibration=digits["calibration"], accuracy=Accuracy((x, y), max_drop=0.002),
        verbose=False,
    )  # fmt: skip
    one = infertune.optimize(broken_by_one_layer, x[:1], **options)
    static = _by_name(one)["onnxruntime-cpu-int8-static"]
    assert static.status == "skipped", (static.status, static.reason)
    assert static.reason.startswith("not judged: onnxruntime-cpu is verified"), static.reason
    assert static.metric is None and one.report.selected == "onnxruntime-cpu"

    two = infertune.optimize(broken_by_one_layer, x[:1], batch_sizes=[1, 16], **options)
    static = _by_name(two)["onnxruntime-cpu-int8-static"]
    assert static.status == "mismatch", (static.reason, static.kept_fp32, static.quantization)
    assert static.metric_drop_bound > 0.002  # judged, and failed
    assert "not searched further: onnxruntime-cpu is verified" in static.reason, static.reason
    assert "percentile" not in static.reason  # no other calibration method tried
    assert not static.kept_fp32
    if memory_tight:  # the search's own timing stopped it
        assert "quantized throughout, timed together" in static.reason, static.reason


def _attention_model():
    """A one-block attention classifier of (8, 16) sequences: NNCF's transformer rules apply."""
    import keras

    tokens = keras.Input((8, 16))
    attended = keras.layers.MultiHeadAttention(2, 8, name="attention")(tokens, tokens)
    flat = keras.layers.Flatten()(keras.layers.LayerNormalization()(attended + tokens))
    return keras.Model(tokens, keras.layers.Dense(10, name="head")(flat))


def _scope(exported, layer: str) -> str:
    """A layer's name scope in the ONNX export, as the search names it: "sequential_3/conv_b_1"."""
    import onnx

    names = [n.name for n in onnx.load_from_string(exported.model_bytes).graph.node]
    parts = next(n for n in names if f"/{layer}_" in n).split("/")
    return "/".join(parts[: next(i for i, p in enumerate(parts) if p.startswith(layer)) + 1])


@needs_openvino
def test_layers_kept_in_float32_reuse_the_statistics_nncf_collected(
    classifier, digits, monkeypatch
):
    """A search step of OpenVINO's int8 (layers kept in float32) quantizes the export again
    from the statistics NNCF collected on its first quantization, without running the model
    on the calibration samples: the same model, to the last bit, as quantizing afresh with
    those layers ignored; on a CNN and on an attention model (NNCF's SmoothQuant step too:
    its output projection kept).
    Where keeping a layer moves a quantizer to points with no statistics (the attention's
    own layer), the model runs on the calibration samples for those points alone: the same
    model again."""
    import dataclasses

    import openvino
    from helpers import target_for
    from nncf.quantization.algorithms import pipeline

    from infertune.backends.openvino.quantize import quantize_for_openvino
    from infertune.export.onnx import convert_to_onnx

    attention = _attention_model()
    sequences = np.random.default_rng(0).standard_normal((24, 8, 16)).astype("float32")
    core = openvino.Core()

    def outputs(quantized, x):
        compiled = core.compile_model(quantized.model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        return np.concatenate([compiled(x[i : i + 1])[0] for i in range(len(x))])

    original = pipeline.collect_statistics
    collected = []  # the statistic points of each collection (a run on the samples)

    def counting(points, *args, **kwargs):
        collected.append(sum(len(p) for p in points.values()))
        return original(points, *args, **kwargs)

    monkeypatch.setattr(pipeline, "collect_statistics", counting)
    for model, x, layer, collects_some in (
        (classifier, digits["calibration"], "conv_b", False),
        (attention, sequences, "attention_output", False),
        (attention, sequences, "attention", True),
    ):
        exported = convert_to_onnx(target_for(model, x[:1]))
        feeds = [{exported.input_names[0]: x[i : i + 1]} for i in range(16)]
        collected.clear()
        whole = quantize_for_openvino(exported, feeds)
        everything = max(collected)  # the most points one of its steps measured
        collected.clear()
        keep = (_scope(exported, layer),)
        kept = quantize_for_openvino(exported, feeds, keep)
        if collects_some:  # one run, for the points the first quantization did not measure
            assert len(collected) == 1 and 0 < collected[0] < everything, (collected, everything)
        else:
            assert not collected, (layer, collected)
        afresh = quantize_for_openvino(dataclasses.replace(exported, derived={}), feeds, keep)
        np.testing.assert_array_equal(outputs(kept, x[:8]), outputs(afresh, x[:8]))
        assert not np.array_equal(outputs(kept, x[:8]), outputs(whole, x[:8]))
        assert "kept in float32" in kept.settings


@needs_openvino
def test_an_attention_model_is_quantized_without_smoothquant_as_the_other_method(
    classifier, digits, tmp_path
):
    """On an attention model OpenVINO's int8 has a second calibration method, what the search
    tries where the default fails the gate: NNCF's transformer rules without SmoothQuant
    (which rescales the MatMuls' inputs into their weights before quantizing: another model);
    a step keeping layers from it starts from its own statistics (the model quantized afresh,
    to the last bit). A CNN has one way only. A result quantized so is saved and loaded as
    it was, its settings saying how."""
    import dataclasses

    import openvino
    from helpers import target_for

    from infertune.backends.openvino.cpu import OpenVinoCpuInt8
    from infertune.backends.openvino.quantize import (
        SMOOTH_QUANT_OFF,
        SMOOTH_QUANT_ON,
        quantize_for_openvino,
    )
    from infertune.export.onnx import convert_to_onnx

    attention = _attention_model()
    x = np.random.default_rng(0).standard_normal((24, 8, 16)).astype("float32")
    core = openvino.Core()

    def outputs(quantized):
        compiled = core.compile_model(quantized.model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        return np.concatenate([compiled(x[i : i + 1])[0] for i in range(8)])

    exported = convert_to_onnx(target_for(attention, x[:1]))
    feeds = [{exported.input_names[0]: x[i : i + 1]} for i in range(16)]
    smoothed = quantize_for_openvino(exported, feeds)
    plain = quantize_for_openvino(exported, feeds, smooth_quant=False)
    assert smoothed.transformer and plain.transformer
    assert SMOOTH_QUANT_OFF in plain.settings and SMOOTH_QUANT_OFF not in smoothed.settings
    assert not np.array_equal(outputs(plain), outputs(smoothed))
    keep = (_scope(exported, "attention_output"),)  # its output projection
    kept = quantize_for_openvino(exported, feeds, keep, smooth_quant=False)
    afresh = quantize_for_openvino(
        dataclasses.replace(exported, derived={}), feeds, keep, smooth_quant=False
    )
    np.testing.assert_array_equal(outputs(kept), outputs(afresh))
    assert not np.array_equal(outputs(kept), outputs(plain))

    def methods(model, sample, calibration):
        target = target_for(model, sample)
        target.calibration = [[calibration]]
        backend = OpenVinoCpuInt8()
        backend.prepare(target)
        try:
            return backend.calibration_methods
        finally:
            backend.close()

    assert methods(attention, x[:1], x[:16]) == (SMOOTH_QUANT_ON, SMOOTH_QUANT_OFF)
    assert methods(classifier, digits["calibration"][:1], digits["calibration"][:16]) == ()

    labels = attention.predict(x[16:], verbose=0).argmax(axis=1)  # a budget it meets
    opt = infertune.optimize(
        attention, x[:1], backends=[OpenVinoCpuInt8(method=SMOOTH_QUANT_OFF)],
        precision=("int8",), calibration=x[:16],
        accuracy=Accuracy((x[16:], labels), max_drop=0.5), verbose=False,
    )  # fmt: skip
    assert opt.backend == "openvino-cpu-int8", str(opt.report)
    assert SMOOTH_QUANT_OFF in opt.report.candidate(opt.backend).quantization
    loaded = infertune.load(opt.save(tmp_path / "smoothquant-off"))
    np.testing.assert_array_equal(loaded(x[:5]), opt(x[:5]))
    assert SMOOTH_QUANT_OFF in loaded.report.candidate(opt.backend).quantization


def test_the_models_predictions_come_from_a_float32_candidate_only_where_it_agrees():
    """The gate's reference predictions: by a verified float32 candidate where it gives the
    model's own on the first labelled rows (made by the model before any long work), else by
    the model."""
    from infertune.precision.data import LabelledBatch
    from infertune.precision.gate import (
        FIRST_ROWS,
        PrecisionData,
    )

    rng = np.random.default_rng(0)
    x, y = rng.random((24, 3)), np.arange(24) % 3
    batches = [LabelledBatch([x[i : i + 10]], y[i : i + 10]) for i in (0, 10, 20)]
    calls = []

    def model(flat):
        calls.append(len(flat[0]))
        return [flat[0] * 2.0]

    def fresh():
        data = PrecisionData(accuracy=Accuracy((x, y)), labelled=batches, reference_call=model)
        data.first = model([x[:FIRST_ROWS]])[0]
        calls.clear()
        return data

    agreeing = fresh()
    agreeing.complete(lambda flat: [flat[0] * 2.0 * (1 + 1e-6)], "fast")
    assert agreeing.predicted_by == "fast" and not calls and len(agreeing.predictions) == 3
    differing = fresh()
    differing.complete(lambda flat: [flat[0] * 3.0], "wrong")
    assert differing.predicted_by == "the model" and calls == [10, 10, 4]
    np.testing.assert_allclose(differing.predictions[2], x[20:] * 2.0)
    failing = fresh()
    failing.complete(lambda flat: 1 / 0, "broken")
    assert failing.predicted_by == "the model" and len(failing.predictions) == 3


@needs_onnxruntime
@needs_litert
def test_the_models_predictions_are_made_beside_the_conversions(classifier, digits):
    """Once ONNX Runtime in float32 is verified, it makes the model's predictions on the
    labelled data in a thread of its own while the TFLite int8 conversion runs (timed apart,
    in the background); the gate's verdict is the one the model's own predictions give."""
    x, y = digits["validation"]
    opt = infertune.optimize(
        classifier, x[:1], backends=["onnxruntime-cpu", "litert-int8"], precision=INT8,
        calibration=digits["calibration"], accuracy=Accuracy((x, y)), verbose=False,
    )  # fmt: skip
    stages = opt.report.stages.to_dict()
    assert "accuracy reference" in stages["background_s"]["onnxruntime-cpu"], stages
    assert "accuracy reference" not in stages["shared_s"], stages
    assert any("predictions on the labelled data by onnxruntime-cpu" in n for n in opt.report.notes)
    quantized = _by_name(opt)["litert-int8"]
    assert quantized.status in ("ok", "selected"), (quantized.status, quantized.reason)
    assert quantized.reference_metric == pytest.approx(_accuracy(classifier, x, y))


@needs_onnxruntime
def test_the_predictions_beside_the_conversions_are_made_by_a_runtime_that_sleeps():
    """A session whose threads spin between calls holds both cores that the quantizers beside
    it need (benchmarks/predictions_beside.py): the predictions go to the fastest candidate
    that sleeps where it is within QUIET_WITHIN of the fastest, else to the fastest."""
    from infertune.backends.registry import BACKENDS
    from infertune.pipeline.context import Candidate
    from infertune.pipeline.judging import QUIET_WITHIN, quiet_maker
    from infertune.report import CandidateResult

    def candidate(name):
        return Candidate(BACKENDS[name](), CandidateResult(name, "ok"))

    spinning, sleeping = candidate("onnxruntime-cpu"), candidate("onnxruntime-cpu:nospin")
    assert spinning.backend.cooldown_s and not sleeping.backend.cooldown_s
    both = [spinning, sleeping]
    close = {spinning.name: 1.0, sleeping.name: QUIET_WITHIN * 0.99}
    assert quiet_maker(both, close) is sleeping
    far = {spinning.name: 1.0, sleeping.name: QUIET_WITHIN * 1.01}
    assert quiet_maker(both, far) is spinning
    assert quiet_maker([spinning], {spinning.name: 1.0}) is spinning


def _converters_int8(target, calibration) -> bytes:
    """TensorFlow's converter's own full int8 of the target's trace, calibrated by its own
    calibrator on the samples infertune's calibration takes."""
    import tensorflow as tf

    from infertune.backends.litert import quantize as tflite

    converter, _, _ = tflite._converter(target)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    rows = np.concatenate([batch[0] for batch in calibration])[: tflite.CALIBRATION_SAMPLES]
    converter.representative_dataset = lambda: ([row[None]] for row in rows)
    return converter.convert()


def _graph(flatbuffer: bytes):
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model_from_bytearray(bytearray(flatbuffer))
    return model, model.subgraphs[0]


@needs_litert
def test_tflite_full_int8_is_the_converters_own(classifier, digits, monkeypatch):
    """backends/litert/quantize.py quantizes the shared float32 conversion itself (calibrated once,
    for
    every search step). With TFLite's calibrator (where infertune's range pass does not apply)
    the flatbuffer is the one TensorFlow's converter makes from the same trace with the same
    representative dataset, byte for byte; with the range pass, the same operators, tensors
    and int8 weights, and activation scales within 1e-4 (the pass runs XNNPACK's arithmetic,
    the calibrator the reference kernels). A TensorFlow that changes its post-training path
    breaks this test rather than infertune's int8 results silently."""
    from helpers import target_for

    from infertune.backends.litert import quantize as tflite
    from infertune.precision.data import calibration_batches

    x = digits["validation"][0]
    target = target_for(classifier, x[:1])
    calibration = calibration_batches(digits["calibration"], target.signature)
    theirs = _converters_int8(target, calibration)
    ours = tflite.convert_int8(target, calibration)
    assert ours.content != theirs  # the range pass was used (a byte-identical one: checked below)
    model, graph = _graph(ours.content)
    their_model, their_graph = _graph(theirs)
    assert [op.opcodeIndex for op in graph.operators] == [
        op.opcodeIndex for op in their_graph.operators
    ]
    assert len(graph.tensors) == len(their_graph.tensors)
    for mine, other in zip(graph.tensors, their_graph.tensors, strict=True):
        assert (mine.name, mine.type) == (other.name, other.type)
        if mine.quantization is None or mine.quantization.scale is None:
            continue
        np.testing.assert_allclose(mine.quantization.scale, other.quantization.scale, rtol=1e-4)
        weights = model.buffers[mine.buffer].data
        if weights is not None and len(weights) and mine.type == 9:  # INT8 constants
            np.testing.assert_array_equal(weights, their_model.buffers[other.buffer].data)

    monkeypatch.setattr(tflite, "_ranged", lambda flatbuffer, samples: None)
    target = target_for(classifier, x[:1])
    assert tflite.convert_int8(target, calibration).content == theirs


@needs_litert
def test_tflite_ranges_are_the_values_the_tensors_take():
    """The range pass (backends/litert/quantize.py `_ranged`) records each tensor's own values, the
    tensors TFLite's calibrator records: on a residual block, the branch's convolution output
    spans what that convolution gives, not the sum's range that the calibrator logs after an
    ADD run in place over it; a NaN is a clear error; control flow is left to the
    calibrator."""
    import keras
    import tensorflow as tf

    from infertune.backends.litert import quantize as tflite

    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 4))
    branch = keras.layers.Conv2D(4, 3, padding="same", name="branch")(inputs)
    summed = keras.layers.ReLU()(keras.layers.Add()([inputs, branch]))
    pooled = keras.layers.GlobalAveragePooling2D()(summed)
    model = keras.Model(inputs, keras.layers.Dense(3)(pooled))
    rows = np.random.default_rng(0).normal(size=(8, 1, 8, 8, 4)).astype("float32")
    flatbuffer = tf.lite.TFLiteConverter.from_keras_model(model).convert()

    def samples():
        return ([row] for row in rows)

    _, graph = _graph(tflite._ranged(flatbuffer, samples))
    _, their_graph = _graph(tflite._calibrator_ranged(flatbuffer, samples))

    def ranges(tensors):
        return {
            t.name.decode(): (float(t.quantization.min[0]), float(t.quantization.max[0]))
            for t in tensors
            if t.quantization is not None and t.quantization.min is not None
        }

    ours, theirs = ranges(graph.tensors), ranges(their_graph.tensors)
    assert set(ours) == set(theirs)
    name = next(n for n in ours if "branch" in n and "Add" not in n and "Relu" not in n)
    values = keras.Model(inputs, branch).predict(rows[:, 0], verbose=0)
    np.testing.assert_allclose(ours[name], (values.min(), values.max()), rtol=1e-5)
    for tensor, (low, high) in theirs.items():  # elsewhere the two agree
        if tensor != name:
            np.testing.assert_allclose(ours[tensor], (low, high), rtol=1e-5, atol=1e-6)

    # Two inputs of different shapes, fed by name (in_0, in_1) as LiteRT's candidates feed them.
    from helpers import target_for

    pair = [keras.Input((6,)), keras.Input((3,))]
    joined = keras.layers.Concatenate()([keras.layers.Dense(4)(pair[0]), pair[1]])
    two = keras.Model(pair, keras.layers.Dense(2)(joined))
    rng = np.random.default_rng(1)
    feeds = [[rng.normal(size=(1, 6)).astype("float32"), rng.random((1, 3), "float32")]] * 4
    two_flat = tflite.convert_free(target_for(two, feeds[0])).content
    mine = ranges(_graph(tflite._ranged(two_flat, lambda: iter(feeds)))[1].tensors)
    logged = ranges(_graph(tflite._calibrator_ranged(two_flat, lambda: iter(feeds)))[1].tensors)
    assert mine.keys() == logged.keys()
    for tensor, bounds in logged.items():
        np.testing.assert_allclose(mine[tensor], bounds, rtol=1e-5, atol=1e-6)

    with pytest.raises(ValueError, match="NaN on a calibration sample"):
        tflite._ranged(flatbuffer, lambda: iter([[np.full((1, 8, 8, 4), np.nan, "float32")]]))

    @tf.function(input_signature=[tf.TensorSpec((1, 4), tf.float32)])
    def looped(x):
        return tf.while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, y * 2.0), (0, x))[1]

    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [looped.get_concrete_function()], looped
    )
    assert tflite._ranged(converter.convert(), lambda: iter([[np.ones((1, 4), "float32")]])) is None


@pytest.mark.slow
@needs_litert
def test_tflite_int8_made_in_a_worker_process_is_the_one_made_here(classifier, digits, monkeypatch):
    """A worker process (pipeline/tf_worker.py) makes TFLite's full int8 conversion from the
    calibration samples this process writes for it: the result computes what the conversion
    made here computes, bit for bit. (On ResNet50 224 that conversion took 15-19 s with
    TFLite's calibrator on one core, 8-10 s since the range pass; a worker runs it beside this
    process's ONNX export and quantizations where it is expected to take 15 s or more.)"""
    from helpers import target_for

    from infertune.backends.litert.quantize import convert_int8
    from infertune.precision.data import calibration_batches

    monkeypatch.setenv("INFERTUNE_TF_WORKER", "always")  # a tiny model's too
    # A budget the whole conversion passes: a layer kept in float32 would be converted here.
    opt = _litert_int8(classifier, digits, max_drop=0.05)
    x = digits["validation"][0]
    assert any("tflite-int8 conversion was made in a worker" in n for n in opt.report.notes)
    worker = opt.report.stages.background["(shared)"]
    assert worker["TFLite full int8 conversion in a worker process"] > 0
    quantized = _by_name(opt)["litert-int8"]
    assert opt.backend == "litert-int8" and not quantized.kept_fp32, quantized.reason
    target = target_for(classifier, x[:1])
    here = convert_int8(target, calibration_batches(digits["calibration"], target.signature))
    interpreter = here.interpreter()
    interpreter.resize_tensor_input(interpreter.get_input_details()[0]["index"], (8, 8, 8, 1))
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x[:8])
    interpreter.invoke()
    expected = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
    np.testing.assert_array_equal(opt(x[:8]), expected)


def test_the_gate_rejects_a_drop_beyond_the_budget_and_accepts_one_within():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, 1000)
    reference = np.eye(10)[labels] + 0.01 * rng.standard_normal((1000, 10))
    worse = reference.copy()
    worse[:50] = np.roll(worse[:50], 1, axis=1)  # 5% of the answers wrong
    accuracy = Accuracy((None, None), "accuracy", max_drop=0.02)
    rejected = judge_metric(accuracy, [labels], [reference], [worse])
    assert not rejected and rejected.drop == pytest.approx(0.05) and rejected.drop_bound > 0.05
    lenient = judge_metric(Accuracy((None, None), max_drop=0.08), [labels], [reference], [worse])
    # Accepted on the margin's upper end (95% bootstrap): 0.05 measured, below 0.08.
    assert lenient and 0.05 < lenient.drop_bound < 0.08
    relative = Accuracy((None, None), max_drop=0.04, relative=True)
    assert not judge_metric(relative, [labels], [reference], [worse])  # 5% of 1.0


def test_a_metric_function_may_return_scores_per_sample_or_one_number():
    rng = np.random.default_rng(1)
    y = rng.standard_normal((400, 3))
    close, far = y + 0.01 * rng.standard_normal(y.shape), y + 0.5 * rng.standard_normal(y.shape)

    def per_sample(y_true, y_pred):
        return -np.mean((y_true - y_pred) ** 2, axis=1)

    def one_number(y_true, y_pred):
        return float(-np.mean((y_true - y_pred) ** 2))

    for metric in (per_sample, one_number):
        accuracy = Accuracy((None, None), metric, max_drop=0.01)
        assert judge_metric(accuracy, [y], [y], [close])
        assert not judge_metric(accuracy, [y], [y], [far])
    # A named error metric knows that lower is better.
    assert judge_metric(Accuracy((None, None), "mse", max_drop=0.01), [y], [y], [close])
    assert not judge_metric(Accuracy((None, None), "mse", max_drop=0.01), [y], [y], [far])


def test_the_agreement_rule_bounds_the_error_and_the_clear_decisions_flipped():
    rng = np.random.default_rng(2)
    logits = 10 * rng.standard_normal((300, 100))
    assert judge_agreement([[logits]], [[logits + 1e-3]])
    # Five rows' top two classes swapped: 98.3% of clear decisions kept, though the outputs
    # are within 1% of the model's (a relative error bound alone would pass it).
    flipped = logits.copy()
    rows = np.arange(5)
    top = np.argsort(logits[rows], axis=1)[:, -2:]
    flipped[rows, top[:, 0]], flipped[rows, top[:, 1]] = (
        logits[rows, top[:, 1]],
        logits[rows, top[:, 0]],
    )
    verdict = judge_agreement([[logits]], [[flipped]])
    assert not verdict and verdict.details["relative_error"] < 0.01, verdict.reason
    # Near-ties flipped by the error itself are noise: untrained random logits pass.
    near = rng.standard_normal((300, 10)) * 1e-3
    assert judge_agreement([[near]], [[near + 1e-5 * rng.standard_normal(near.shape)]])
    embedding = rng.standard_normal((4, 16, 32))
    assert judge_agreement([[embedding]], [[embedding * 1.01]])
    assert not judge_agreement([[embedding]], [[embedding * 1.2]])  # 20% off


# -- bad input, before any long work ---------------------------------------------------------
def test_bad_reduced_precision_input_is_a_clear_error(classifier, digits):
    x, y = digits["validation"]
    options = dict(precision=INT8, backends=["onnxruntime-cpu-int8-static"], verbose=False)
    with pytest.raises(OptionError, match="applies to reduced-precision candidates"):
        infertune.optimize(classifier, x[:1], calibration=x, verbose=False)
    with pytest.raises(OptionError, match="labels of shape"):
        infertune.optimize(classifier, x[:1], accuracy=Accuracy((x, y[:, None, None])), **options)
    with pytest.raises(OptionError, match="one label"):
        infertune.optimize(classifier, x[:1], accuracy=Accuracy((x, y[:10])), **options)
    with pytest.raises(OptionError, match="NaN"):
        nan = Accuracy((x, y), lambda t, p: np.full(len(t), np.nan))
        infertune.optimize(classifier, x[:1], accuracy=nan, **options)
    with pytest.raises(InputError, match="calibration"):
        infertune.optimize(classifier, x[:1], calibration=x[:, :4], **options)
    with pytest.raises(OptionError, match="must be one of"):
        Accuracy((x, y), "f1")


# -- saved without TensorFlow ----------------------------------------------------------------
@pytest.mark.slow
@needs_onnxruntime
@needs_litert
def test_an_int8_result_saved_loads_without_tensorflow(classifier, digits, tmp_path):
    x, y = digits["validation"]
    for name in ("onnxruntime-cpu-int8-static", "litert-int8"):
        opt = infertune.optimize(
            classifier, x[:1], backends=[name], precision=("int8",),
            calibration=digits["calibration"], accuracy=Accuracy((x, y), max_drop=0.02),
            verbose=False,
        )  # fmt: skip
        # Only the model's own call competes (4 ms a call against microseconds).
        assert opt.backend == name, str(opt.report)
        saved = opt.save(tmp_path / name)
        np.save(tmp_path / "x.npy", x[:5])
        np.save(tmp_path / "expected.npy", opt(x[:5]))
        script = textwrap.dedent(
            f"""
            import sys, numpy as np
            sys.modules["tensorflow"] = None  # importing it fails
            sys.modules["keras"] = None
            import infertune
            opt = infertune.load({str(saved)!r})
            got = opt(np.load({str(tmp_path / "x.npy")!r}))
            np.testing.assert_array_equal(got, np.load({str(tmp_path / "expected.npy")!r}))
            assert opt.backend == {name!r}
            """
        )
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.slow
@needs_onnxruntime
def test_a_quantized_result_is_cached_and_exported_for_triton(classifier, digits, tmp_path):
    x, y = digits["validation"]
    name = "onnxruntime-cpu-int8-static"

    def tuned(max_drop: float):
        return infertune.optimize(
            classifier, x[:1], backends=[name], precision=("int8",),
            calibration=digits["calibration"], accuracy=Accuracy((x, y), max_drop=max_drop),
            cache=tmp_path / "cache", verbose=False,
        )  # fmt: skip

    first = tuned(0.02)
    assert first.backend == name and not first.report.from_cache, str(first.report)
    again = tuned(0.02)
    assert again.report.from_cache and again.backend == name  # checked by agreement on a hit
    np.testing.assert_array_equal(again(x[:7]), first(x[:7]))
    other = tuned(0.03)  # the accuracy settings are in the key
    assert not other.report.from_cache
    export = first.export_triton(tmp_path / "repository", "digits")
    assert export.backend == "onnxruntime"
    # The exported model is the quantized one: QDQ nodes in it.
    import onnx

    ops = {node.op_type for node in onnx.load(export.version_dir / "model.onnx").graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops


@pytest.mark.slow
@needs_onnxruntime
def test_a_quantized_result_is_judged_again_at_every_batch_size_it_serves(classifier, digits):
    x, y = digits["validation"]
    opt = infertune.optimize(
        classifier, x[:1], backends=["onnxruntime-cpu-int8-static"], precision=INT8,
        calibration=digits["calibration"], accuracy=Accuracy((x, y), max_drop=0.02),
        batch_sizes=[1, 16], verbose=False,
    )  # fmt: skip
    static = _by_name(opt)["onnxruntime-cpu-int8-static"]
    assert static.status in ("ok", "selected"), static.reason
    assert "at batch size 16 too" in static.reason


def test_calibration_data_is_taken_in_every_form(digits):
    import tensorflow as tf

    from infertune.model.inputs import build_signature
    from infertune.precision.data import calibration_batches

    x = digits["calibration"]
    signature, _ = build_signature(x[:1], None, np.dtype("float32"))
    as_array = calibration_batches(x, signature)
    as_list = calibration_batches([x[:50], x[50:120], x[120:]], signature)  # batches
    as_dataset = calibration_batches(tf.data.Dataset.from_tensor_slices(x).batch(64), signature)
    as_generator = calibration_batches((x[i : i + 10] for i in range(0, 200, 10)), signature)
    for batches in (as_array, as_list, as_dataset, as_generator):
        np.testing.assert_array_equal(np.concatenate([b[0] for b in batches]), x)
        assert max(len(b[0]) for b in batches) <= 32  # one big array is not one call
    capped = calibration_batches(np.concatenate([x, x, x]), signature)
    assert sum(len(b[0]) for b in capped) == 512  # at most what calibration needs
