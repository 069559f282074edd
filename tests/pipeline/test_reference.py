"""The reference: the model's eager call, or its traced graph where the user asks for it, and
the report's word on how far the two are apart."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import dense_model

import infertune
from infertune.errors import OptionError


def uint8_resizing_model():
    """A serving model that takes raw image bytes: Keras' Resizing rounds its output to uint8
    when called eagerly and returns float32 inside a traced graph (Rescaling after it makes
    both float32, ~2e-3 apart): every traced candidate differs from model(x)."""
    import keras

    keras.utils.set_random_seed(0)
    pixels = keras.Input((32, 32, 3), dtype="uint8")
    x = keras.layers.Rescaling(1 / 255)(keras.layers.Resizing(16, 16)(pixels))
    x = keras.layers.Flatten()(keras.layers.Conv2D(4, 3)(x))
    return keras.Model(pixels, keras.layers.Dense(3)(x))


def image_sample():
    return np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)


def optimize(model, sample, **options):
    # tf-function is the traced graph itself: the one candidate these tests need.
    return infertune.optimize(
        model, sample, backends=["tf-function"], isolation="off", verbose=False, **options
    )


def test_eager_reference_keeps_model_call_and_warns_where_the_trace_differs():
    model, sample = uint8_resizing_model(), image_sample()
    opt = optimize(model, sample)
    report = opt.report
    assert opt.backend == "keras-eager"
    assert report.candidate("tf-function").status == "mismatch"
    note = report.notes[0]
    assert note.startswith("reference: the model's eager call model(x) (reference='eager')")
    assert "WARNING" in note
    assert "'resizing' (Resizing): it returns uint8 called eagerly and float32 traced" in note
    assert "reference='traced'" in note and "reference='traced'" in report.selection_reason
    # opt(x) is model(x): the same eager call, so exactly equal.
    np.testing.assert_array_equal(opt(sample), model(sample).numpy())


def test_traced_reference_chooses_a_compiled_candidate_and_says_what_it_computes():
    import tensorflow as tf

    model, sample = uint8_resizing_model(), image_sample()
    opt = optimize(model, sample, reference="traced")
    report = opt.report
    assert opt.backend == "tf-function"
    eager = report.candidate("keras-eager")
    assert eager.status == "mismatch" and "not the reference" in eager.reason
    note = report.notes[0]
    assert note.startswith("reference: the model's traced graph (reference='traced'")
    assert "WARNING: model(x) differs from it" in note and "max abs diff" in note
    # opt(x) is the traced graph's output (what model.predict() computes); within rtol=1e-3
    # of it, as verified, and 1e-6 apart at most here, float32 round-off of one graph.
    traced = tf.function(model)(sample).numpy()
    np.testing.assert_allclose(opt(sample), traced, rtol=0, atol=1e-6)


def test_traced_reference_is_kept_by_the_tuning_cache(tmp_path):
    model, sample = uint8_resizing_model(), image_sample()
    first = optimize(model, sample, reference="traced", cache=tmp_path)
    again = optimize(model, sample, reference="traced", cache=tmp_path)
    # Checked on the sample against the traced graph it was tuned against, not model(x).
    assert again.report.from_cache and again.backend == first.backend == "tf-function"
    # The eager reference is another entry: tuned again, and the model's call chosen.
    eager = optimize(model, sample, cache=tmp_path)
    assert not eager.report.from_cache and eager.backend == "keras-eager"


def test_a_model_whose_trace_agrees_is_unaffected():
    sample = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    opt = optimize(dense_model(), sample)
    assert opt.backend in ("keras-eager", "tf-function")
    assert opt.report.candidate("tf-function").status in ("ok", "selected")
    note = opt.report.notes[0]
    assert note.startswith("reference: the model's eager call model(x)")
    assert "agrees with it" in note and "WARNING" not in note
    assert "WARNING" not in opt.report.selection_reason


def test_reference_option_is_checked():
    with pytest.raises(OptionError, match="reference must be one of"):
        optimize(dense_model(), np.zeros((1, 6), "float32"), reference="predict")


def test_a_model_that_cannot_be_traced_says_so():
    import keras

    class ValueDependent(keras.Model):  # Python control flow on a tensor's value
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x) * (2.0 if float(keras.ops.max(x)) > 0 else 1.0)

    model, sample = ValueDependent(), np.ones((2, 4), "float32")
    opt = optimize(model, sample)
    assert opt.backend == "keras-eager"
    assert "WARNING: its traced graph" in opt.report.notes[0]
    assert "failed on the sample" in opt.report.notes[0]
    assert "reference='traced'" not in opt.report.selection_reason
    with pytest.raises(infertune.ModelError, match="reference='traced' needs"):
        optimize(model, sample, reference="traced")


def augmenting_model():
    """An image classifier with augmentation left inside, as Keras' image classification
    guides build it: RandomFlip, RandomRotation and RandomZoom are active under model(x) (their
    call defaults to training=True) and inactive in inference mode; Dropout before the head."""
    import keras

    keras.utils.set_random_seed(0)
    image = keras.Input((16, 16, 3))
    x = keras.layers.Rescaling(1 / 255)(image)
    x = keras.layers.RandomFlip("horizontal")(x)
    x = keras.layers.RandomRotation(0.1)(x)
    x = keras.layers.RandomZoom(0.1)(x)
    x = keras.layers.Conv2D(4, 3, activation="relu")(x)
    x = keras.layers.Dropout(0.5)(keras.layers.GlobalAveragePooling2D()(x))
    return keras.Model(image, keras.layers.Dense(3)(x))


@pytest.mark.slow
def test_a_model_with_augmentation_inside_is_tuned_in_inference_mode(tmp_path):
    model = augmenting_model()
    x = np.random.default_rng(0).uniform(0, 255, (2, 16, 16, 3)).astype("float32")
    # Under model(x) the random layers are active: two calls differ.
    assert not np.allclose(np.asarray(model(x)), np.asarray(model(x)))
    opt = infertune.optimize(
        model, x, backends=["tf-function", "onnxruntime-cpu", "litert"], verbose=False
    )
    fresh = np.random.default_rng(1).uniform(0, 255, (3, 16, 16, 3)).astype("float32")
    expected = model.predict(fresh, verbose=0)
    np.testing.assert_allclose(opt(fresh), expected, rtol=1e-4, atol=1e-5)
    by_name = {c.name: c for c in opt.report.candidates}
    assert all(by_name[n].status in ("ok", "selected") for n in by_name), str(opt.report)
    note = next(n for n in opt.report.notes if "training=False" in n)
    for layer in ("RandomFlip", "RandomRotation", "RandomZoom"):
        assert layer in note, note
    assert "Dropout" not in note  # inactive under model(x) too: its call defaults to False
    # The model's own call, saved and loaded, is called in inference mode too.
    eager = infertune.optimize(model, x, backends=[], isolation="off", verbose=False)
    loaded = infertune.load(eager.save(tmp_path / "eager"))
    np.testing.assert_allclose(loaded(fresh), expected, rtol=1e-4, atol=1e-5)


def test_a_model_random_in_inference_mode_still_gets_the_clear_error():
    import keras

    class Noisy(keras.layers.Layer):
        def call(self, x):
            return x + keras.random.normal(keras.ops.shape(x))

    inputs = keras.Input((4,))
    model = keras.Model(inputs, Noisy()(inputs))
    with pytest.raises(infertune.ModelError, match="does not reproduce its own outputs"):
        optimize(model, np.ones((2, 4), "float32"))
