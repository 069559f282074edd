"""Every kind of model the API takes: optimized outputs match the model's own on fresh inputs
at the sample's batch size and at two others, and every candidate verifies."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from helpers import assert_matches_model, dense_model, dict_model, dict_sample

import infertune

# Float32 round-off between graph runtimes (fused kernels, other summation orders) on
# outputs of order 1: 1e-4 relative is ample, and far below any real conversion error.
RTOL = 1e-4


def _check_all_batches(opt, model_call, make_input):
    for batch in (4, 1, 7):  # the sample's batch size and two others
        x = make_input(batch)
        assert_matches_model(model_call(x), opt(x), rtol=RTOL)


def _assert_every_candidate_verified(opt):
    # Every fp32 candidate that can run here (GPU ones are `unavailable` on a CPU machine).
    # Not verified: those that do not apply to this model or to one caller, each said why.
    not_applicable = ("not applicable: ", "a variant for several callers")
    statuses = {
        c.name: c.status
        for c in opt.report.candidates
        if c.precision == "fp32"
        and c.status != "unavailable"
        and not c.reason.startswith(not_applicable)
    }
    assert all(s in ("ok", "selected") for s in statuses.values()), str(opt.report)
    assert set(statuses) >= {"tf-function", "tf-xla", "onnxruntime-cpu"}


@pytest.mark.slow
def test_sequential_model(rng):
    model = dense_model()
    opt = infertune.optimize(model, rng.standard_normal((4, 6)).astype("float32"), verbose=False)
    _assert_every_candidate_verified(opt)
    _check_all_batches(opt, model, lambda b: rng.standard_normal((b, 6)).astype("float32"))


@pytest.mark.slow
def test_functional_model_with_dict_inputs_and_outputs(rng):
    model = dict_model()
    opt = infertune.optimize(model, dict_sample(rng), verbose=False)
    _assert_every_candidate_verified(opt)
    _check_all_batches(opt, model, lambda b: dict_sample(rng, b))


@pytest.mark.slow
def test_functional_model_with_list_inputs_and_outputs(rng):
    import keras

    a, b = keras.Input((3,)), keras.Input((2,))
    merged = keras.layers.Concatenate()([a, b])
    model = keras.Model([a, b], [keras.layers.Dense(2)(merged), keras.layers.Dense(4)(merged)])

    def make(batch):
        return [rng.random((batch, 3), dtype=np.float32), rng.random((batch, 2), dtype=np.float32)]

    opt = infertune.optimize(model, make(4), verbose=False)
    _assert_every_candidate_verified(opt)
    out = opt(make(4))
    assert isinstance(out, list) and [o.shape for o in out] == [(4, 2), (4, 4)]
    _check_all_batches(opt, model, make)


@pytest.mark.slow
def test_subclassed_model(rng):
    import keras

    class Residual(keras.Model):
        def __init__(self):
            super().__init__()
            self.inner = keras.layers.Dense(5, activation="relu")
            self.outer = keras.layers.Dense(5)

        def call(self, x):
            return x + self.outer(self.inner(x))

    model = Residual()
    opt = infertune.optimize(model, rng.standard_normal((4, 5)).astype("float32"), verbose=False)
    _assert_every_candidate_verified(opt)
    _check_all_batches(opt, model, lambda b: rng.standard_normal((b, 5)).astype("float32"))


class Affine(tf.Module):
    def __init__(self):
        super().__init__()
        self.w = tf.Variable(np.random.default_rng(0).standard_normal((3, 2)).astype("float32"))

    @tf.function(input_signature=[tf.TensorSpec((None, 3), tf.float32)])
    def __call__(self, x):
        return tf.nn.sigmoid(tf.matmul(x, self.w))


@pytest.mark.slow
def test_tf_module_with_tf_function(rng):
    module = Affine()
    opt = infertune.optimize(module, rng.standard_normal((4, 3)).astype("float32"), verbose=False)
    assert opt.report.candidates[0].name == "original"
    _assert_every_candidate_verified(opt)
    _check_all_batches(opt, module, lambda b: rng.standard_normal((b, 3)).astype("float32"))


def test_saved_model_directory(tmp_path, rng):
    module = Affine()
    tf.saved_model.save(module, str(tmp_path / "affine"))
    opt = infertune.optimize(
        str(tmp_path / "affine"), rng.standard_normal((4, 3)).astype("float32"), verbose=False
    )
    _assert_every_candidate_verified(opt)
    _check_all_batches(opt, module, lambda b: rng.standard_normal((b, 3)).astype("float32"))


@pytest.mark.slow
def test_keras_export_saved_model(tmp_path, rng):
    model = dense_model()
    model.export(str(tmp_path / "exported"), verbose=False)
    opt = infertune.optimize(
        tmp_path / "exported", rng.random((4, 6), dtype=np.float32), verbose=False
    )
    _assert_every_candidate_verified(opt)
    _check_all_batches(opt, model, lambda b: rng.random((b, 6), dtype=np.float32))


@pytest.mark.slow
def test_keras_file(tmp_path, rng):
    model = dict_model()
    path = tmp_path / "model.keras"
    model.save(path)
    opt = infertune.optimize(str(path), dict_sample(rng), verbose=False)
    _assert_every_candidate_verified(opt)
    _check_all_batches(opt, model, lambda b: dict_sample(rng, b))


@pytest.mark.slow
def test_tensor_inputs_accepted(rng):
    model = dense_model()
    sample = tf.constant(rng.standard_normal((4, 6)).astype("float32"))
    opt = infertune.optimize(model, sample, verbose=False)
    x = tf.constant(rng.standard_normal((2, 6)).astype("float32"))
    assert_matches_model(model(x), opt(x), rtol=RTOL)


@pytest.mark.slow
def test_integer_inputs_stay_in_sample_range(rng):
    """Token ids drawn for verification stay inside the sample's range (else Embedding fails)."""
    import keras

    keras.utils.set_random_seed(0)
    tokens = keras.Input((6,), dtype="int32")
    model = keras.Model(
        tokens, keras.layers.Dense(2)(keras.layers.Flatten()(keras.layers.Embedding(10, 4)(tokens)))
    )
    sample = rng.integers(0, 10, (4, 6)).astype("int32")
    opt = infertune.optimize(model, sample, verbose=False)
    _assert_every_candidate_verified(opt)
    for draw in opt.input_signature.random_inputs(np.random.default_rng(0), 64):
        assert draw.min() >= sample.min() and draw.max() <= sample.max()
