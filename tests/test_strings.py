"""String inputs: numpy str, bytes and object arrays and tf.string tensors, wherever the model
takes them; verification on the sample's own tokens; save, load and the cache with them."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from preprocessing_models import SENTENCES, text_classifier, text_sample

import infertune
from infertune.errors import InputError
from infertune.model.inputs import (
    InputSignature,
    build_signature,
)


@pytest.fixture(scope="module")
def text_model():
    return text_classifier()


def _forms(x: np.ndarray) -> dict:
    import tensorflow as tf

    return {
        "str": x,
        "bytes": np.char.encode(x, "utf-8"),
        "object": x.astype(object),
        "tf.string": tf.constant(x),
    }


@pytest.mark.parametrize("form", ["str", "tf.string"])
def test_optimize_takes_string_samples_and_calls_of_every_form(text_model, form):
    x = text_sample(4)
    opt = infertune.optimize(
        text_model, _forms(x)[form], backends=["tf-function"], isolation="off", verbose=False
    )
    assert "shape (None, 1) string" in opt.report.signature
    expected = np.asarray(text_model(x))
    for name, value in _forms(x).items():
        # The same graph on the same ids: equal to float32 round-off of the same kernels.
        np.testing.assert_allclose(opt(value), expected, rtol=1e-6, atol=1e-7, err_msg=name)
    other = np.array([["the dog sat"], ["unknown words only"], ["cat"]])  # another batch size
    np.testing.assert_allclose(opt(other), np.asarray(text_model(other)), rtol=1e-6, atol=1e-7)
    assert opt.report.candidate("tf-function").status == "selected"


def test_fresh_inputs_recombine_the_samples_own_tokens():
    sample = np.array([["the cat sat"], ["a dog"], [b"my homework"]], dtype=object)
    signature, flat = build_signature(sample, None)
    spec = signature.specs[0]
    assert spec.is_string and flat[0].dtype == object
    assert (spec.low, spec.high) == (2, 3)  # the fewest and most tokens in one string
    drawn = signature.random_inputs(np.random.default_rng(0), batch=50)[0]
    assert drawn.shape == (50, 1) and drawn.dtype == object
    words = {w for s in drawn.ravel() for w in s.split()}
    assert words <= {"the", "cat", "sat", "a", "dog", "my", "homework"}
    assert len(words) >= 5  # recombined, not the sample repeated
    assert all(2 <= len(s.split()) <= 3 for s in drawn.ravel())


def test_verification_inputs_reach_the_vocabulary(text_model):
    """Fresh strings made of the sample's tokens map to vocabulary ids, not all to OOV (1)."""
    import keras

    signature, _ = build_signature(text_sample(6), None)
    drawn = signature.random_inputs(np.random.default_rng(0))[0]
    vectorize = next(
        layer for layer in text_model.layers if isinstance(layer, keras.layers.TextVectorization)
    )
    ids = np.asarray(vectorize(drawn))
    assert (ids > 1).mean() > 0.5 and set(np.unique(ids)) - {0, 1}


def test_the_samples_tokens_are_never_saved():
    signature, _ = build_signature(np.array([["private words here"]]), None)
    data = signature.to_dict()
    assert "private" not in repr(data) and data["inputs"][0]["dtype"] == "object"
    again = InputSignature.from_dict(data)
    assert again.specs == signature.specs  # tokens do not take part in comparisons
    assert again.random_inputs(np.random.default_rng(0))[0].dtype == object


def test_values_that_are_not_strings_are_refused_with_the_kinds_handled(text_model):
    with pytest.raises(InputError, match="not strings.*string inputs"):
        build_signature(np.array([[1], ["a"]], dtype=object), None)
    with pytest.raises(InputError, match=r"complex128.*bool, integer, float and string"):
        build_signature(np.zeros((2, 1), complex), None)
    opt = infertune.optimize(
        text_model, text_sample(2), backends=[], isolation="off", verbose=False
    )
    with pytest.raises(InputError, match="has dtype float32; expected string"):
        opt(np.zeros((2, 1), np.float32))
    with pytest.raises(InputError, match=r"<U3 \(strings\); expected int64"):
        build_signature({"a": np.array([["abc"]])}, {"a": _declared((None, 1), "int64")})


def _declared(shape, dtype):
    from infertune.model.inputs import DeclaredInput

    return DeclaredInput(shape, np.dtype(dtype))


def test_a_string_model_that_cannot_be_split_skips_the_converters_with_the_reason():
    import keras

    class Tagger(keras.Model):  # subclassed: no layer graph to cut
        def __init__(self):
            super().__init__()
            self.vectorize = keras.layers.TextVectorization(
                output_sequence_length=4, vocabulary=["cat", "dog"]
            )
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(keras.ops.cast(self.vectorize(x), "float32"))

    x = text_sample(4)
    opt = infertune.optimize(
        Tagger(), x, backends=["onnxruntime-cpu", "tf-function"], isolation="off", verbose=False
    )
    skipped = opt.report.candidate("onnxruntime-cpu")
    assert skipped.status == "skipped"
    assert "string inputs (x) that only TensorFlow runs" in skipped.reason
    assert "subclassed Keras model (Tagger) has no layer graph to cut" in skipped.reason
    assert opt.backend == "tf-function"
    assert any("only TensorFlow candidates run this model" in n for n in opt.report.notes)


def test_save_load_and_the_cache_with_strings(text_model, tmp_path, monkeypatch):
    x = text_sample(4)
    first = infertune.optimize(
        text_model, x, backends=["tf-function"], isolation="off", verbose=False,
        cache=tmp_path / "cache",
    )  # fmt: skip
    again = infertune.optimize(
        text_model, np.char.encode(x), backends=["tf-function"], isolation="off",
        verbose=False, cache=tmp_path / "cache",
    )  # fmt: skip
    assert again.report.from_cache and again.backend == first.backend
    path = first.save(tmp_path / "saved")
    loaded = infertune.load(path)
    np.testing.assert_allclose(loaded(x), np.asarray(text_model(x)), rtol=1e-6, atol=1e-7)
    assert loaded(np.array([[SENTENCES[0]]])).shape == (1, 3)
    # No TensorFlow where it is loaded (find_spec finds no module whose entry is None):
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    with pytest.raises(
        infertune.EnvironmentMismatchError,
        match=r"tensorflow is not installed.*string inputs \(x\), which only TensorFlow runs",
    ):
        infertune.load(path)
