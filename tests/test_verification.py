"""A candidate whose outputs differ from the model's is rejected, whatever the output scale."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from conftest import dense_model

import infertune
from infertune.backends import Backend
from infertune.models import tensor_specs
from infertune.verify import compare_outputs


class PerturbedTfFunction(Backend):
    """A real tf.function of the model whose outputs are scaled by (1 + error): a wrong backend."""

    name = "perturbed"

    def __init__(self, error: float):
        self.error = error

    def prepare(self, target):
        self._fn = tf.function(
            target.source.graph_function(target.signature),
            input_signature=tensor_specs(target.signature),
        )

    def run(self, inputs):
        return [t.numpy() * np.float32(1 + self.error) for t in self._fn(*inputs)]


def test_perturbed_candidate_is_rejected_with_its_error():
    sample = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    opt = infertune.optimize(
        dense_model(), sample, backends=[PerturbedTfFunction(0.01)], verbose=False
    )
    bad = opt.report.candidate("perturbed")
    assert bad.status == "mismatch"
    assert bad.max_rel_err == pytest.approx(0.01, rel=1e-3)  # the error it was given
    assert "rtol=0.001" in bad.reason
    assert opt.backend != "perturbed"


def test_small_error_within_tolerance_is_accepted():
    sample = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    # 1e-5 relative is a float32-sized error, well inside rtol=1e-3.
    opt = infertune.optimize(
        dense_model(), sample, backends=[PerturbedTfFunction(1e-5)], verbose=False
    )
    assert opt.report.candidate("perturbed").status in ("ok", "selected")


def test_tiny_outputs_do_not_let_a_wrong_candidate_through_atol():
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4)])
    model.layers[0].kernel.assign(model.layers[0].kernel * 1e-12)  # outputs around 1e-12
    sample = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    assert np.abs(model(sample)).max() < 1e-10
    opt = infertune.optimize(model, sample, backends=[PerturbedTfFunction(0.5)], verbose=False)
    # Every element is within atol=1e-5 of the model; the relative error is 50%.
    assert opt.report.candidate("perturbed").status == "mismatch"
    assert "relative error" in opt.report.candidate("perturbed").reason


def test_compare_rules():
    ref = np.array([1.0, 2.0, 3.0], "float32")
    assert compare_outputs([ref + 1e-6], [ref], rtol=1e-3, atol=1e-5)
    assert not compare_outputs([ref * 1.01], [ref], rtol=1e-3, atol=1e-5)
    assert not compare_outputs([ref[:2]], [ref], rtol=1e-3, atol=1e-5)  # shape
    assert not compare_outputs([ref.astype("float64")], [ref], rtol=1e-3, atol=1e-5)  # dtype
    assert not compare_outputs([ref, ref], [ref], rtol=1e-3, atol=1e-5)  # structure
    with_nan = ref.copy()
    with_nan[1] = np.nan
    found = compare_outputs([with_nan], [ref], rtol=1e-3, atol=1e-5)
    assert not found and "NaN/Inf" in found.reason
    assert compare_outputs(
        [with_nan], [with_nan], rtol=1e-3, atol=1e-5
    )  # NaN where the model has it
    ints = np.array([1, 2, 3])
    assert not compare_outputs([ints + np.array([0, 1, 0])], [ints], rtol=1e-3, atol=1e-5)
    zeros = np.zeros(3, "float32")
    assert compare_outputs(
        [zeros + 1e-7], [zeros], rtol=1e-3, atol=1e-5
    )  # zero reference: atol rules
