"""The report tells every candidate's fate and numbers; the selected one really is the fastest."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import dense_model

import infertune
from infertune.pipeline.timing import clearly_slower
from infertune.report import STATUSES, CandidateResult, Report


@pytest.fixture(scope="module")
def report():
    sample = np.random.default_rng(0).standard_normal((16, 6)).astype("float32")
    return infertune.optimize(dense_model(), sample, verbose=False).report


@pytest.mark.slow
def test_every_candidate_has_a_status_and_measured_numbers(report):
    from infertune.backends.registry import BACKENDS

    # Every candidate infertune knows, those that cannot run here too (with their reason).
    assert [c.name for c in report.candidates] == ["keras-eager", *BACKENDS]
    runnable = set(infertune.available_backends())
    for c in report.candidates:
        assert (c.status != "unavailable") == (c.name in runnable), (c.name, c.reason)
    for c in report.candidates:
        assert c.status in STATUSES
        if c.status in ("ok", "selected"):
            assert c.p50 > 0 and c.p90 >= c.p50 and c.p99 >= c.p90 and c.mean > 0 and c.n >= 5
            assert c.throughput == pytest.approx(16 / (c.mean / 1e3))
            assert c.first_call_ms > 0 and c.prepare_s >= 0 and c.max_rel_err is not None
            if c.status == "ok":
                assert c.reason  # why it was not chosen


def test_selected_candidate_is_fastest_beyond_noise(report):
    chosen = report.candidate(report.selected)
    assert chosen.status == "selected"
    measured = [c for c in report.candidates if c.status == "ok"]
    for other in measured:  # it lost: slower in the paired rounds than someone, tied, or
        # (too erratic for the rounds to tell) more than 5% slower in the median
        assert not clearly_slower(chosen.latency, other.latency)
        beaten = any(clearly_slower(other.latency, c.latency) for c in [*measured, chosen])
        assert beaten or "within noise" in other.reason or other.p50 > chosen.p50


def test_table_and_json(report, tmp_path):
    table = str(report)
    for c in report.candidates:
        assert c.name in table and c.status in table
    assert f"selected: {report.selected}" in table
    data = json.loads(report.to_json(tmp_path / "report.json"))
    assert data == json.loads((tmp_path / "report.json").read_text())
    keys = {"name", "status", "reason", "prepare_s", "first_call_ms", "p50", "p90", "p99",
            "mean", "n", "throughput", "max_abs_err", "max_rel_err"}  # fmt: skip
    assert keys <= set(data["candidates"][0])
    env = data["environment"]
    assert env["packages"]["tensorflow"] and env["packages"]["onnxruntime"] and env["python"]
    assert env["cpu"]["logical_cores"] >= 1 and "threads" in env


def _unavailable(name: str, reason: str) -> CandidateResult:
    return CandidateResult(name, "unavailable", reason=reason)


def test_a_reason_shared_by_many_candidates_is_said_once():
    """Seven GPU candidates on a machine without a GPU take one line, not seven rows and seven
    reasons; a clause several reasons share is said once; every reason stays in to_dict()."""
    no_gpu = "no NVIDIA GPU here (the driver lists none)"
    gpu = [_unavailable(f"gpu-{i}", f"{no_gpu}; also runtime {i} is missing") for i in range(7)]
    left = "measured 2 rounds: more than 1.5x slower than another in each, it left the rest"
    slow = [
        CandidateResult("slow-a", "ok", reason=f"3.10x slower than fast; {left}"),
        CandidateResult("slow-b", "ok", reason=f"2.50x slower than fast; {left}"),
    ]
    report = Report(
        model="m", signature="x", batch_size=1, objective="latency", rtol=1e-3, atol=1e-5,
        candidates=[CandidateResult("fast", "selected"), *slow, *gpu], environment={},
        selected="fast", selection_reason="fastest", total_s=1.0,
    )  # fmt: skip
    text = str(report)
    assert text.count(no_gpu) == 1 and "unavailable here (7): gpu-0, gpu-1" in text
    assert not any(line.startswith("gpu-") for line in text.splitlines())  # no table rows
    assert text.count(left) == 1 and f"slow-a, slow-b: {left}" in text
    assert "slow-a: 3.10x slower than fast" in text and "slow-b: 2.50x slower than fast" in text
    reasons = {c["name"]: c["reason"] for c in report.to_dict()["candidates"]}
    assert reasons["gpu-3"] == f"{no_gpu}; also runtime 3 is missing"  # whole, in the JSON
