"""Candidates that run only the sample's exact input shapes, and verification at other sizes
of the free dimensions.

A GRU or a masked attention model over a free length does not convert to TFLite with that
length free, but does at the sample's exact shapes: LiteRT then serves calls of exactly those
shapes (a fast path), and every other call goes to the choice among the candidates that run
any shape. A candidate that is wrong only at another length is rejected, since every
candidate is verified at other sizes of the free dimensions too.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from helpers import forced, needs_litert

import infertune
from infertune.backends.tf_function import TfFunction
from infertune.report import CandidateResult, Report

# The callable against model(x): XNNPACK and ONNX Runtime sum in other orders than
# TensorFlow, float32 round-off near 1e-7 relative on outputs of order 1; 1e-5 leaves 100x
# room and is still 100x below optimize()'s rtol=1e-3, so a wrong runtime cannot hide.
FP32_RTOL = 1e-5
# GRU and attention outputs pass through zero: ten float32 ulps at magnitude 1 there.
FP32_ATOL = 1e-6


def gru(features: int = 4):
    import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((None, features)), keras.layers.GRU(8)])


def sequences(batch: int, length: int, features: int = 4, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed + 100 * batch + length)
    return rng.standard_normal((batch, length, features)).astype("float32")


def masked_attention():
    """Token ids and a padding mask of any length, in a dict: attention under the mask,
    masked mean pooling. The mask's `[:, None, :]` is a strided slice adding an axis, which
    TFLite converts only where the length is known."""
    import keras
    from keras import layers, ops

    keras.utils.set_random_seed(0)
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    mask = keras.Input((None,), dtype="int32", name="padding_mask")
    x = layers.Embedding(30, 8)(ids)
    x = x + layers.MultiHeadAttention(2, 4)(x, x, attention_mask=ops.cast(mask, "bool")[:, None, :])
    weights = ops.cast(mask, "float32")[:, :, None]
    pooled = ops.sum(x * weights, axis=1) / ops.maximum(ops.sum(weights, axis=1), 1.0)
    return keras.Model({"token_ids": ids, "padding_mask": mask}, layers.Dense(3)(pooled))


def padded_tokens(batch: int, length: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed + 100 * batch + length)
    valid = rng.integers(1, length + 1, batch)
    valid[0] = length  # one full row: the sample's range of ids and mask values is complete
    mask = (np.arange(length)[None, :] < valid[:, None]).astype(np.int32)
    return {"token_ids": rng.integers(1, 30, (batch, length)).astype(np.int32) * mask,
            "padding_mask": mask}  # fmt: skip


def backend_named(opt, name: str):
    return next(b for b in opt.backends if b.name == name)


def assert_close(got, expected) -> None:
    np.testing.assert_allclose(got, np.asarray(expected), rtol=FP32_RTOL, atol=FP32_ATOL)


# -- the fast path -------------------------------------------------------------------------
@pytest.mark.slow
@needs_litert
def test_a_gru_is_served_by_litert_at_the_sample_shape_and_by_the_general_choice_elsewhere():
    model, sample = gru(), sequences(2, 6)
    opt = infertune.optimize(
        model, sample, backends=["litert", "tf-function"], batch_sizes=[1, 8], verbose=False
    )
    report = opt.report
    litert = report.candidate("litert")
    # The conversion with a free length fails (the GRU's TensorList ops); the one at the
    # sample's exact shape serves.
    assert litert.exact_shapes == [[2, 6, 4]], str(report)
    assert "free dimensions failed" in litert.exact_reason
    # LiteRT at a fixed shape runs a tiny GRU in tens of microseconds, tf.function and the
    # eager model in hundreds: the fast path is taken, and the rest goes to the general choice.
    assert opt.backend == "litert" and litert.status == "selected", str(report)
    assert opt.general_backend in ("tf-function", "keras-eager")
    assert report.general_backend == opt.general_backend
    assert set(opt.backends_by_batch.values()) <= {"tf-function", "keras-eager"}
    # At another batch size LiteRT was neither measured nor eligible.
    at_8 = next(b for b in report.batches if b.batch_size == 8)
    assert "litert" not in at_8.latency
    assert "litert" in next(b for b in report.batches if b.batch_size == 2).latency
    text = str(report)
    assert "litert: serves only the sample's shapes (2, 6, 4)" in text
    assert f"every other shape: {opt.general_backend}" in text
    assert "random input at other sizes of the free dimensions (2, 38, 4)" in text

    exact, general = backend_named(opt, "litert"), backend_named(opt, opt.general_backend)
    x = sequences(2, 6, seed=1)
    assert_close(opt(x), model(x))
    np.testing.assert_array_equal(opt(x), exact.run([x])[0])  # LiteRT's own numbers
    for other in (sequences(2, 11, seed=2), sequences(3, 6, seed=3), sequences(8, 3, seed=4)):
        assert_close(opt(other), model(other))
        np.testing.assert_array_equal(opt(other), general.run([other])[0])
    with pytest.raises(ValueError, match="runs only the input shapes"):
        exact.run([sequences(2, 11)])


@pytest.mark.slow
@needs_litert
def test_dict_inputs_take_the_fast_path_at_the_sample_shapes_only():
    model, sample = masked_attention(), padded_tokens(2, 7)
    opt = infertune.optimize(model, sample, backends=["litert", "tf-function"], verbose=False)
    litert = opt.report.candidate("litert")
    assert litert.exact_shapes == [[2, 7], [2, 7]], str(opt.report)
    assert opt.backend == "litert", str(opt.report)
    exact, general = backend_named(opt, "litert"), backend_named(opt, opt.general_backend)
    flat = opt.input_signature.flatten  # the dict as the backends take it: flat, in order
    x = padded_tokens(2, 7, seed=1)
    assert_close(opt(x), model(x))
    np.testing.assert_array_equal(opt(x), exact.run(flat(x))[0])
    for other in (padded_tokens(2, 12, seed=2), padded_tokens(4, 7, seed=3)):
        assert_close(opt(other), model(other))
        np.testing.assert_array_equal(opt(other), general.run(flat(other))[0])


@pytest.mark.slow
@needs_litert
def test_save_load_and_cache_keep_the_fast_path(tmp_path):
    model, sample = gru(), sequences(2, 6)
    opt = infertune.optimize(
        model, sample, backends=["litert", "onnxruntime-cpu"], cache=tmp_path / "cache",
        verbose=False,
    )  # fmt: skip
    assert opt.backend == "litert", str(opt.report)
    saved = opt.save(tmp_path / "saved")
    manifest = json.loads((saved / "manifest.json").read_text())
    assert manifest["choice"]["exact_shape"] == {"backend": "litert", "shapes": [[2, 6, 4]]}
    assert manifest["choice"]["general"] == opt.general_backend
    entry = next(e for e in manifest["backends"] if e["name"] == "litert")
    assert entry["dir"] == "exact-shape"
    assert not (saved / "exact-shape" / "model.tflite").exists()  # no free-length model

    loaded = infertune.load(saved, verbose=False)
    assert (loaded.backend, loaded.general_backend) == (opt.backend, opt.general_backend)
    inputs = [sequences(2, 6, seed=1), sequences(2, 9, seed=2), sequences(5, 6, seed=3)]
    for x in inputs:
        np.testing.assert_array_equal(loaded(x), opt(x))  # the same runtimes, the same numbers

    again = infertune.optimize(
        model, sample, backends=["litert", "onnxruntime-cpu"], cache=tmp_path / "cache",
        verbose=False,
    )  # fmt: skip
    assert again.report.from_cache
    assert (again.backend, again.general_backend) == (opt.backend, opt.general_backend)
    for x in inputs:
        np.testing.assert_array_equal(again(x), opt(x))

    # Without TensorFlow: LiteRT and ONNX Runtime load from their files alone. The eager
    # model may be measured faster than ONNX Runtime here (then loading needs TensorFlow), so
    # this half forces the pair.
    opt = forced(model, sample, "onnxruntime-cpu", exact_shape="litert")
    saved = opt.save(tmp_path / "saved-without-tensorflow")
    np.savez(tmp_path / "inputs.npz", *inputs)
    code = (
        "import sys, numpy as np, infertune\n"
        f"opt = infertune.load({str(saved)!r}, verbose=False)\n"
        "with np.load(sys.argv[1]) as stored:\n"
        "    np.savez(sys.argv[2], *[opt(stored[k]) for k in sorted(stored.files)])\n"
        "assert 'tensorflow' not in sys.modules, 'load imported tensorflow'\n"
        "print(opt.backend, opt.general_backend)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "inputs.npz"), str(tmp_path / "out.npz")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["litert", "onnxruntime-cpu"]
    with np.load(tmp_path / "out.npz") as outputs:
        for key, x in zip(sorted(outputs.files), inputs):
            np.testing.assert_array_equal(outputs[key], opt(x))

    export = opt.export_triton(tmp_path / "repo", "gru")
    assert export.backend == "onnxruntime"
    assert any("exact shapes (2, 6, 4) with litert" in note for note in export.notes)


# -- verification at other sizes of the free dimensions ---------------------------------------
class WrongAtOtherLengths(TfFunction):
    """A real tf.function of the model whose outputs are 1% off at any length but the
    sample's: right on the sample, the fresh inputs and the other batch size."""

    name = "wrong-at-other-lengths"

    def prepare(self, target):
        super().prepare(target)
        self._length = target.signature.sample_shapes[0][1]

    def run(self, inputs):
        outputs = super().run(inputs)
        if inputs[0].shape[1] == self._length:
            return outputs
        return [output * np.float32(1.01) for output in outputs]


def conv1d_over_a_free_length():
    import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((None, 4)),
            keras.layers.Conv1D(4, 3, padding="same", activation="relu"),
            keras.layers.GlobalAveragePooling1D(),
        ]
    )


def test_a_candidate_wrong_only_at_another_length_is_rejected():
    opt = infertune.optimize(
        conv1d_over_a_free_length(), sequences(2, 6), backends=[WrongAtOtherLengths()],
        verbose=False,
    )  # fmt: skip
    wrong = opt.report.candidate("wrong-at-other-lengths")
    assert wrong.status == "mismatch", str(opt.report)
    assert "on random input at other sizes of the free dimensions (2, 38, 4)" in wrong.reason
    assert wrong.max_rel_err == pytest.approx(0.01, rel=1e-3)  # the error it was given


def test_a_model_that_refuses_other_sizes_is_verified_without_them(capsys):
    import keras
    import tensorflow as tf

    class AtMostEightSteps(keras.layers.Layer):
        def call(self, x):
            tf.debugging.assert_less_equal(tf.shape(x)[1], 8, message="at most 8 steps")
            return x

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((None, 4)), AtMostEightSteps(), keras.layers.GlobalAveragePooling1D()]
    )
    opt = infertune.optimize(model, sequences(2, 6), backends=["tf-function"])
    assert "the model raised on random input at other sizes" in capsys.readouterr().err
    verified = next(n for n in opt.report.notes if n.startswith("verified on"))
    assert "other sizes" not in verified and "random input at batch 1" in verified
    assert opt.report.candidate("tf-function").status in ("ok", "selected")


def test_the_report_round_trips_the_exact_shape_path():
    result = CandidateResult(
        "litert", "selected", exact_shapes=[[2, 6, 4]], exact_reason="its conversion failed"
    )
    report = Report(
        model="m", signature="x", batch_size=2, objective="latency", rtol=1e-3, atol=1e-5,
        candidates=[result], environment={}, selected="litert", selection_reason="fast",
        total_s=1.0, general_backend="onnxruntime-cpu", general_reason="general",
    )  # fmt: skip
    again = Report.from_dict(json.loads(report.to_json()))
    assert again.general_backend == "onnxruntime-cpu"
    assert again.candidates[0].exact_shapes == [[2, 6, 4]]
    assert again.backends_by_batch == {2: "onnxruntime-cpu"}
    assert "every other shape: onnxruntime-cpu (general)" in str(again)
