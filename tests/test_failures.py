"""A candidate that fails to export, compile or run is reported `failed`; optimize() goes on."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from helpers import dense_model

import infertune
from infertune.backends import Backend


def _py_function_model():
    import keras

    class WithPyFunction(keras.Model):
        """tf.py_function runs Python in the graph: XLA cannot compile it,
        tf2onnx cannot convert it."""

        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(3)

        def call(self, x):
            y = tf.py_function(lambda t: t * 2.0, [x], tf.float32)
            y.set_shape(x.shape)
            return self.dense(y)

    return WithPyFunction()


def test_unconvertible_layer_is_isolated():
    model = _py_function_model()
    sample = np.random.default_rng(0).standard_normal((4, 5)).astype("float32")
    opt = infertune.optimize(model, sample, verbose=False)
    statuses = {c.name: c.status for c in opt.report.candidates}
    assert statuses["tf-xla"] == "failed"
    assert statuses["onnxruntime-cpu"] == "failed"
    for name in ("tf-xla", "onnxruntime-cpu"):
        reason = opt.report.candidate(name).reason
        assert reason and "\n" not in reason and len(reason) < 300
    assert opt.backend in ("keras-eager", "tf-function")
    x = np.random.default_rng(1).standard_normal((2, 5)).astype("float32")
    np.testing.assert_allclose(opt(x), model(x).numpy(), rtol=1e-5)


class Broken(Backend):
    """Fails at the stage it is told to, like a runtime with a bug."""

    def __init__(self, name, stage):
        self.name, self.stage = name, stage

    def prepare(self, target):
        if self.stage == "prepare":
            raise RuntimeError("compiler crashed\nwith a long native traceback")

    def run(self, inputs):
        raise MemoryError("out of memory in the runtime")


def test_failing_custom_backends_are_reported_and_skipped():
    sample = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    opt = infertune.optimize(
        dense_model(), sample, backends=[Broken("a", "prepare"), Broken("b", "run")], verbose=False
    )
    a, b = opt.report.candidate("a"), opt.report.candidate("b")
    assert (a.status, a.reason) == ("failed", "prepare: RuntimeError: compiler crashed")
    assert (b.status, b.reason) == (
        "failed",
        "first call: MemoryError: out of memory in the runtime",
    )
    assert opt.backend == "keras-eager"


def test_time_budget_skips_candidates_not_reached():
    sample = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    opt = infertune.optimize(dense_model(), sample, time_budget_s=1e-6, verbose=False)
    statuses = {c.name: c.status for c in opt.report.candidates}
    assert statuses["keras-eager"] == "selected"  # the reference always runs
    assert {statuses[n] for n in ("tf-function", "tf-xla", "onnxruntime-cpu")} == {"skipped"}
    assert "time_budget_s" in opt.report.candidate("tf-xla").reason
