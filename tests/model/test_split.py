"""Split execution: preprocessing layers near the inputs run as a TensorFlow head, the body goes
to every converting candidate as `tf-head+<candidate>`, verified end to end against the whole
model, measured as a whole; save, load and the cache of a chosen chain."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from helpers import dense_model, needs_litert
from preprocessing_models import tabular_model, tabular_sample, text_classifier, text_sample

import infertune
from infertune.model.inputs import build_signature
from infertune.model.source import load_model
from infertune.model.splitting import find_split


def _split(model, sample):
    source = load_model(model)
    signature, flat = build_signature(sample, source.declared_inputs, source.default_float)
    return find_split(source, signature, flat)


def _close(opt, model, x):
    # A converted body against the TensorFlow model: float32 round-off of other kernels.
    np.testing.assert_allclose(opt(x), np.asarray(model(x)), rtol=1e-5, atol=1e-6)


def test_the_text_classifier_is_split_after_its_text_vectorization():
    split, why = _split(text_classifier(), text_sample())
    assert why is None
    assert split.head_layers == ["vectorize (TextVectorization)"]
    assert split.body_signature.describe() == "vectorize: shape (None, 8) int64"


def test_the_tabular_model_keeps_its_normalization_in_the_body():
    split, why = _split(tabular_model(), tabular_sample())
    assert why is None
    assert split.head_layers == ["lookup (IntegerLookup)"]
    # Normalization is plain arithmetic and Discretization converts through an exact rewrite
    # (export/rewrites.py): their raw float inputs go straight to the body.
    assert split.body_signature.describe() == (
        "age: shape (None, 1) float32; amount: shape (None, 3) float32; "
        "lookup: shape (None, 6) float32"
    )


def test_models_that_cannot_or_need_not_be_split_say_why():
    import keras

    assert _split(dense_model(), np.zeros((2, 6), np.float32)) == (None, None)

    class Doubled(keras.layers.Layer):  # the user's own, traced: nothing a converter rejects
        def call(self, x):
            return 2.0 * x

    x = keras.Input((3,))
    plain = keras.Model(x, keras.layers.Dense(1)(Doubled()(x)))
    assert _split(plain, np.zeros((2, 3), np.float32)) == (None, None)
    # Nothing after the preprocessing: the output is the lookup's own.
    ids = keras.Input((1,), dtype="int64")
    encode = keras.layers.IntegerLookup(vocabulary=[1, 2, 3], output_mode="one_hot")
    split, why = _split(keras.Model(ids, encode(ids)), np.array([[1], [2]], np.int64))
    assert split is None and "comes from its preprocessing layers alone" in why

    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.lookup = keras.layers.IntegerLookup(vocabulary=[1, 2, 3], output_mode="one_hot")
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(self.lookup(x))

    split, why = _split(Subclassed(), np.array([[1], [2]], np.int64))
    assert split is None
    assert "preprocessing layers (IntegerLookup)" in why and "no layer graph to cut" in why


def test_a_sequential_model_is_split_and_its_chain_chosen():
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((1,), dtype="int64"),
            keras.layers.IntegerLookup(vocabulary=[3, 5, 7, 9], output_mode="one_hot"),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dense(2),
        ]
    )
    x = np.array([[3], [5], [7], [4]], np.int64)
    opt = infertune.optimize(model, x, backends=["onnxruntime-cpu"], isolation="off", verbose=False)
    names = [c.name for c in opt.report.candidates]
    # The head holds what no converter takes (tf2onnx rejects the lookup): the chain replaces
    # the whole model's candidate.
    assert names == ["keras-eager", "tf-head+onnxruntime-cpu"]
    assert opt.report.candidate("tf-head+onnxruntime-cpu").status == "selected"
    _close(opt, model, x)


def test_the_text_classifiers_chains_are_verified_end_to_end():
    model, x = text_classifier(), text_sample(4)
    opt = infertune.optimize(
        model, x, backends=["tf-function", "onnxruntime-cpu", "tf-xla"], verbose=False
    )
    report = opt.report
    for name in ("tf-head+onnxruntime-cpu", "tf-head+tf-xla"):
        result = report.candidate(name)
        assert result.status in ("selected", "ok"), result.reason
        assert result.max_rel_err < 1e-5  # the body converted exactly: float32 round-off
    split_note = next(n for n in report.notes if "split after its preprocessing" in n)
    assert "vectorize (TextVectorization) run in TensorFlow" in split_note
    assert "the body from vectorize: shape (None, 8) int64" in split_note
    # With strings no converter takes the whole model: only the chains are tried.
    assert "onnxruntime-cpu" not in [c.name for c in report.candidates]
    # The body was rehearsed in the child process first (isolation="process", the default).
    background = report.stages.background["tf-head+onnxruntime-cpu"]
    assert "rehearsal in the child process" in background
    # Verified on the sample and fresh strings made of its tokens, at another batch size too.
    assert any("random input at batch 1" in n for n in report.notes)
    _close(opt, model, x)
    _close(opt, model, np.array([["the cat"], ["a fox ate the mat again"]]))


@needs_litert
def test_the_tabular_models_chains_run_its_dict_of_inputs():
    model, x = tabular_model(), tabular_sample(8)
    opt = infertune.optimize(
        model, x, backends=["onnxruntime-cpu", "litert"], isolation="off", verbose=False
    )
    for name in ("tf-head+onnxruntime-cpu", "tf-head+litert"):
        result = opt.report.candidate(name)
        assert result.status in ("selected", "ok"), result.reason
    names = [c.name for c in opt.report.candidates]
    assert "onnxruntime-cpu" not in names and "litert" not in names  # chains replace them
    assert opt.backend.startswith("tf-head+")  # keras-eager's call is ~5x slower
    _close(opt, model, x)
    _close(opt, model, tabular_sample(3))


def test_a_chosen_chain_saves_loads_and_is_cached(tmp_path, monkeypatch):
    model, x = text_classifier(), text_sample(4)
    first = infertune.optimize(
        model, x, backends=["onnxruntime-cpu"], isolation="off", verbose=False,
        cache=tmp_path / "cache",
    )  # fmt: skip
    assert first.backend == "tf-head+onnxruntime-cpu"  # keras-eager is ~8x slower
    again = infertune.optimize(
        model, x, backends=["onnxruntime-cpu"], isolation="off", verbose=False,
        cache=tmp_path / "cache",
    )  # fmt: skip
    assert again.report.from_cache and again.backend == first.backend
    _close(again, model, x)
    path = first.save(tmp_path / "saved")
    assert (path / "head.savedmodel" / "saved_model.pb").exists()
    assert (path / "body" / "model.onnx").exists()
    loaded = infertune.load(path)
    assert loaded.backend == "tf-head+onnxruntime-cpu"
    _close(loaded, model, x)
    _close(loaded, model, np.array([["hello cat"]]))
    with pytest.raises(infertune.ExportError, match="no one Triton backend does"):
        loaded.export_triton(tmp_path / "triton", "text")
    export = loaded.export_triton(tmp_path / "triton", "text", backend="python")
    assert "TYPE_STRING" in export.config
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # a deploy machine without it
    with pytest.raises(
        infertune.EnvironmentMismatchError,
        match=r"its head \(the model's preprocessing layers.*runs in TensorFlow: tensorflow "
        r"is not installed",
    ):
        infertune.load(path)


def test_a_string_and_a_float_input_the_float_going_straight_to_the_body():
    import keras

    keras.utils.set_random_seed(0)
    colors = keras.layers.StringLookup(
        vocabulary=["red", "green", "blue"], output_mode="one_hot", name="colors"
    )
    inputs = {
        "color": keras.Input((1,), dtype="string", name="color"),
        "size": keras.Input((2,), name="size"),
    }
    hidden = keras.layers.Concatenate()([colors(inputs["color"]), inputs["size"]])
    model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    x = {
        "color": np.array([["red"], ["blue"], ["green"], ["pink"]]),
        "size": np.random.default_rng(0).random((4, 2)).astype("float32"),
    }
    opt = infertune.optimize(model, x, backends=["onnxruntime-cpu"], isolation="off", verbose=False)
    assert opt.report.candidate("tf-head+onnxruntime-cpu").status == "selected"
    note = next(n for n in opt.report.notes if "split after" in n)
    assert "colors (StringLookup) run in TensorFlow" in note
    assert "colors: shape (None, 4) float32; size: shape (None, 2) float32" in note
    _close(opt, model, x)
    _close(opt, model, {"color": np.array([[b"blue"]], dtype=object), "size": x["size"][:1]})


def test_a_body_that_crashes_in_its_rehearsal_fails_its_chain_not_optimize():
    from crashing_backends import SegfaultsAtFirstCall

    model, x = tabular_model(), tabular_sample(4)
    opt = infertune.optimize(model, x, backends=[SegfaultsAtFirstCall()], verbose=False)
    chain = opt.report.candidate("tf-head+segfaults-at-first-call")
    assert chain.status == "failed" and "killed the child process" in chain.reason
    assert opt.backend == "keras-eager"


def _buckets_layer():
    """A layer of the user's own whose graph hashes strings, which no converter takes."""
    import keras
    import tensorflow as tf

    class Buckets(keras.layers.Layer):
        def call(self, x):
            text = tf.strings.as_string(tf.cast(x * 4, tf.int64))
            ids = tf.strings.to_hash_bucket_fast(text, 4)
            return tf.reshape(tf.one_hot(ids, 4), (-1, 4))

    return Buckets(name="my_buckets")


def test_a_users_layer_with_an_op_a_converter_rejects_goes_in_the_head():
    import keras

    keras.utils.set_random_seed(0)
    x = keras.Input((1,), name="x")
    model = keras.Model(x, keras.layers.Dense(2)(_buckets_layer()(x)))
    sample = np.random.default_rng(0).random((4, 1)).astype("float32")
    opt = infertune.optimize(
        model, sample, backends=["onnxruntime-cpu"], isolation="off", verbose=False
    )
    assert opt.report.candidate("tf-head+onnxruntime-cpu").status == "selected"
    note = "my_buckets (Buckets: StringToHashBucketFast) run in TensorFlow"
    assert any(note in n for n in opt.report.notes)
    _close(opt, model, sample)
