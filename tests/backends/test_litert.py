"""LiteRT: the TFLite conversion run by ai-edge-litert, verified against the model."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from helpers import (
    assert_matches_model,
    conv_model,
    dense_model,
    dict_model,
    dict_sample,
    flatten_cnn,
    needs_litert,
    prepared_backend,
    target_for,
)

import infertune
from infertune.backends.litert.backend import LiteRT
from infertune.backends.litert.convert import input_order
from infertune.backends.litert.pool import output_order as _output_order
from infertune.model.target import Target
from infertune.system.environment import install_hint

# XNNPACK's float32 kernels sum in another order than TensorFlow's: round-off near 1e-7
# relative on outputs of order 1. 1e-5 leaves 100x room for that and is still 100x below
# optimize()'s rtol=1e-3, so a wrong conversion or a swapped output cannot hide under it.
FP32_RTOL = 1e-5
# Outputs near zero (a ReLU/tanh network's) have no meaningful relative error: 1e-6 absolute
# is ten float32 ulps at magnitude 1, still far below any real conversion error.
FP32_ATOL = 1e-6


def prepared(model, sample):
    return prepared_backend(LiteRT(), model, sample)


@needs_litert
@pytest.mark.parametrize("make_model, shape", [(dense_model, (4, 6)), (conv_model, (4, 12, 12, 3))])
def test_litert_is_verified(make_model, shape):
    sample = np.random.default_rng(0).standard_normal(shape).astype("float32")
    opt = infertune.optimize(make_model(), sample, backends=[LiteRT()], verbose=False)
    result = opt.report.candidate("litert")
    assert result.status in ("ok", "selected"), str(opt.report)
    assert result.max_rel_err < FP32_RTOL


@needs_litert
def test_two_inputs_and_dict_outputs_are_verified():
    # float features and int32 token ids in; outputs of different widths (probs 3, score 1)
    # out, so a swapped output order would fail verification on shape.
    model = dict_model()
    sample = dict_sample(np.random.default_rng(0))
    opt = infertune.optimize(model, sample, backends=[LiteRT()], verbose=False)
    result = opt.report.candidate("litert")
    assert result.status in ("ok", "selected"), str(opt.report)
    assert result.max_rel_err < FP32_RTOL
    assert_matches_model(model(sample), opt(sample), rtol=FP32_RTOL, atol=FP32_ATOL)


def _dense_input(batch: int) -> np.ndarray:
    return np.random.default_rng(batch).standard_normal((batch, 6)).astype("float32")


def _dense_expected(model, x: np.ndarray) -> list:
    return [model(x)]


def _dict_expected(model, x: dict) -> list:
    expected = model(x)
    return [expected["probs"], expected["score"]]  # flat order: dict keys sorted


@needs_litert
@pytest.mark.parametrize(
    "make_model, make_input, expected",
    [
        (dense_model, _dense_input, _dense_expected),  # one input, one output: run's fast path
        (
            dict_model,
            lambda batch: dict_sample(np.random.default_rng(batch), batch),
            _dict_expected,
        ),
    ],
)
def test_any_batch_size_resizes_only_when_it_changes(make_model, make_input, expected):
    model = make_model()
    backend, signature = prepared(model, make_input(4))
    resizes = []
    session = backend._free.idle[-1]  # the sample's shape runs the fixed one
    resize = session.resize

    def counting_resize(index, shape):
        resizes.append(tuple(shape))
        return resize(index, shape)

    session.resize = counting_resize
    calls_per_batch = {}
    for batch in (4, 1, 9, 9, 9):  # the sample's size, two others, then the steady state
        x = make_input(batch)
        flat = signature.flatten(x)  # inputs in signature order
        before = len(resizes)
        got = backend.run(flat)
        calls_per_batch[batch] = calls_per_batch.get(batch, 0) + len(resizes) - before
        assert_matches_model(expected(model, x), got, rtol=FP32_RTOL, atol=FP32_ATOL)
    inputs = len(signature.specs)
    # Where a model converted at the sample's shape runs the sample's batch, that batch never
    # resizes. The free-batch model's first call resizes from its converted batch of 1 (one
    # resize per input), each new size resizes once, and the repeated size never does.
    at_sample = 0 if backend._fixed_run is not None else inputs
    assert calls_per_batch == {4: at_sample, 1: inputs, 9: inputs}


@needs_litert
def test_xnnpack_runs_the_float_ops():
    # The interpreter lists the XNNPACK partition as one DELEGATE node (a private but stable
    # listing of the execution plan); with the default op resolver it is the only delegate.
    backend, _ = prepared(conv_model(), np.zeros((2, 12, 12, 3), "float32"))
    ops = [op["op_name"] for op in backend._interpreter._get_ops_details()]
    assert "DELEGATE" in ops, ops


@needs_litert
def test_the_sample_shape_runs_a_model_converted_at_that_shape(tmp_path):
    from infertune.model.structure import flatten

    model = flatten_cnn()
    sample = np.random.default_rng(0).random((4, 8, 8, 1), dtype=np.float32)
    backend, signature = prepared(model, sample)

    def ops(interpreters):
        return [op["op_name"] for op in interpreters.idle[0].interpreter._get_ops_details()]

    # With a free batch, Flatten's target shape is computed at run time, outside XNNPACK;
    # at the sample's shape the converter folds it into a constant.
    assert "SHAPE" in ops(backend._free) and "SHAPE" not in ops(backend._fixed_run)
    for batch in (4, 2, 4):
        x = np.random.default_rng(batch).random((batch, 8, 8, 1), dtype=np.float32)
        got = backend.run(signature.flatten(x))
        np.testing.assert_allclose(got[0], model(x), rtol=FP32_RTOL, atol=FP32_ATOL)
    assert backend._fixed_run.idle[0].shapes == [(4, 8, 8, 1)]  # never resized
    # Both models are saved, and a loaded backend runs each at its shapes.
    settings = backend.save_artifact(tmp_path)
    assert (tmp_path / "model-fixed.tflite").is_file()
    target = Target(None, signature, flatten(np.zeros(1))[1], [np.dtype("float32")])
    loaded = LiteRT.load_artifact(tmp_path, settings, target)
    assert loaded._fixed_run is not None
    for batch in (4, 3):
        x = signature.flatten(np.random.default_rng(batch).random((batch, 8, 8, 1), "float32"))
        np.testing.assert_array_equal(loaded.run(x)[0], backend.run(x)[0])


@needs_litert
def test_a_fixed_conversion_with_the_same_operators_is_dropped():
    # Dense layers need no shape arithmetic: both conversions are the same graph, and a
    # second copy of the weights would buy nothing.
    backend, _ = prepared(dense_model(), np.ones((4, 6), "float32"))
    assert backend._fixed is None and backend._fixed_run is None


@needs_litert
def test_outputs_are_copies():
    backend, _ = prepared(dense_model(), np.ones((2, 6), "float32"))
    first = backend.run([np.ones((2, 6), "float32")])[0].copy()
    kept = backend.run([np.ones((2, 6), "float32")])[0]
    backend.run([np.zeros((2, 6), "float32")])
    np.testing.assert_array_equal(kept, first)  # the next call did not overwrite it


@needs_litert
def test_op_without_a_builtin_fails_instead_of_using_tensorflow_kernels():
    import tensorflow as tf

    # MatrixInverse has no TFLite builtin: only SELECT_TF_OPS (TensorFlow's own kernel in the
    # interpreter) would run it, and the backend does not ask for that.
    fn = tf.function(tf.linalg.inv, input_signature=[tf.TensorSpec([None, 3, 3], tf.float32)])
    sample = (np.eye(3, dtype="float32") * 2)[None].repeat(4, axis=0)
    opt = infertune.optimize(fn, sample, backends=[LiteRT()], verbose=False)
    result = opt.report.candidate("litert")
    assert result.status == "failed"
    assert result.reason.startswith("conversion:"), result.reason
    # Inverting 2*I is exact in float32: any working fallback returns exactly I/2.
    np.testing.assert_array_equal(opt(sample), sample / 4)


def test_inputs_are_matched_by_name_not_position():
    details = [
        {"name": "serving_default_in_10:0", "index": 7},
        {"name": "serving_default_in_1:0", "index": 5},
        *({"name": f"in_{i}", "index": 100 + i} for i in (0, *range(2, 10))),
    ]
    order = input_order(details, 11)
    assert order[:3] == [100, 5, 102] and order[10] == 7
    with pytest.raises(RuntimeError, match="not in_0"):
        input_order(details[:2], 2)  # in_1 and in_10, no in_0
    with pytest.raises(RuntimeError, match="unexpected TFLite input name"):
        input_order([{"name": "x", "index": 0}], 1)


def test_outputs_are_matched_to_the_functions_order():
    details = [{"name": "Identity_1", "index": 22}, {"name": "Identity", "index": 24}]
    assert _output_order(details, ("Identity", "Identity_1")) == [24, 22]
    with pytest.raises(RuntimeError, match="not the function's outputs"):
        _output_order(details, ("Identity", "Identity_2"))


def test_unavailable_without_litert(monkeypatch):
    # Stands for a machine without ai-edge-litert: a None entry in sys.modules makes
    # importlib.util.find_spec (what available() asks) report the package missing.
    monkeypatch.setitem(sys.modules, "ai_edge_litert", None)
    reason = LiteRT().available()
    assert reason is not None and install_hint("litert") in reason
    sample = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    model = dense_model()
    opt = infertune.optimize(model, sample, backends=[LiteRT()], verbose=False)
    assert opt.report.candidate("litert").status == "unavailable"
    # The reference runs the same Keras model: the same float32 result up to round-off.
    assert_matches_model(model(sample), opt(sample), rtol=FP32_RTOL, atol=FP32_ATOL)


@needs_litert
def test_the_conversion_is_the_converters_own_byte_for_byte():
    # tflite.convert freezes without the ConcreteFunction TensorFlow's converter rebuilds;
    # a model with captured constants (an adapted Normalization: captures that freezing
    # turns into constants) and two inputs of two dtypes checks the inputs it passes on.
    import keras
    import tensorflow as tf

    from infertune.backends.litert import convert as tflite
    from infertune.model.source import tensor_specs

    sample = dict_sample(np.random.default_rng(0))
    base = dict_model()
    normalization = keras.layers.Normalization()
    normalization.adapt(sample["features"])
    features = keras.Input((4,), name="features")
    tokens = keras.Input((5,), dtype="int32", name="tokens")
    outputs = base({"features": normalization(features), "tokens": tokens})
    model = keras.Model({"features": features, "tokens": tokens}, outputs)
    target = target_for(model, sample)

    ours = tflite.convert(target).content
    specs = tensor_specs(target.signature)
    function = tf.function(target.source.graph_function(target.signature), input_signature=specs)
    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [function.get_concrete_function()], function
    )
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    converter.exclude_conversion_metadata = True  # as tflite.convert (no metadata round trip)
    assert ours == converter.convert()

    # On these versions the shortcut is taken: TensorFlow's private freezing functions are
    # where tflite._frozen looks (if they move, it freezes the slow way, and this fails).
    def slow_way():
        raise AssertionError("tflite._frozen fell back to the converter's own freezing")

    graph_def, inputs, outputs, _ = tflite._frozen(target.traced()[1], slow_way)
    assert [t.name for t in inputs] == ["in_0:0", "in_1:0"] and len(outputs) == 2
