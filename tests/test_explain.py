"""explain(): overhead-bound or compute-bound, retracing, predict: each with measured numbers."""

from __future__ import annotations

import numpy as np
import pytest

import infertune
from infertune.demo import demo_model
from infertune.report import Report


@pytest.fixture(scope="module")
def cnn_diagnosis():
    model, sample = demo_model("small-cnn")  # batch 1
    return infertune.explain(model, sample, backends=["tf-function"], verbose=False)


@pytest.mark.slow
def test_small_cnn_at_batch_1_is_overhead_bound(cnn_diagnosis):
    d = cnn_diagnosis
    assert d.verdict == "overhead-bound"
    # One call is about 0.5 MFLOP; model(x) takes milliseconds: far under 10% of peak.
    assert 3e5 < d.flops < 1e6
    assert d.reference.share_of_peak < 0.10 and d.peak_gflops > 1
    assert "overhead-bound" in str(d)


def test_predict_and_retracing_are_measured(cnn_diagnosis):
    d = cnn_diagnosis
    assert d.predict_ms > d.model_call_ms > 0  # predict builds a pipeline per call
    assert d.retracing.batch_sizes == [1, 2, 4, 8]
    assert d.retracing.traces_plain == 4  # one trace per new batch size
    assert d.retracing.traces_with_signature == 1
    assert any("model.predict" in tip for tip in d.advice)
    assert any("input_signature" in tip for tip in d.advice)
    assert len(d.advice) <= 3


@pytest.mark.slow
def test_one_big_matrix_product_is_compute_bound():
    model, sample = demo_model("matmul")  # 1000x1000 weights, batch 1000: 2 GFLOP per call
    opt = infertune.optimize(model, sample, backends=["tf-function"], verbose=False)
    d = opt.report.diagnosis
    assert d.flops == 2 * 1000**3
    assert d.verdict == "compute-bound", str(d)


def test_retracing_count_follows_the_batch_sizes():
    import tensorflow as tf

    class Scale(tf.Module):
        @tf.function
        def __call__(self, x):
            return x * 3.0

    sample = np.ones((2, 5), "float32")
    d = infertune.explain(
        Scale(), sample, batch_sizes=[1, 3, 5, 7, 9], backends=["tf-function"], verbose=False
    )
    assert d.retracing.traces_plain == 5 and d.retracing.traces_with_signature == 1
    assert d.predict_ms is None  # not a Keras model: no predict() to time


def test_report_carries_the_diagnosis_through_json(tmp_path, cnn_diagnosis):
    model, sample = demo_model("mlp")
    opt = infertune.optimize(model, sample, backends=["tf-function"], verbose=False)
    assert "diagnosis:" in str(opt.report) and "verdict:" in str(opt.report)
    opt.report.to_json(tmp_path / "r.json")
    again = Report.from_json(tmp_path / "r.json")
    assert again.diagnosis.verdict == opt.report.diagnosis.verdict
    assert again.diagnosis.flops == opt.report.diagnosis.flops
    assert str(again) == str(opt.report)
