"""Verification as a stage of its own (pipeline/verifying.py): the first call timed apart, the
outputs compared with the reference on every check, a candidate that differs rejected with
the check it failed on."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import dense_model, target_for

from infertune.backends.tf_function import TfFunction
from infertune.options import Options
from infertune.pipeline.budget import Budget
from infertune.pipeline.context import Candidate, Preparation
from infertune.pipeline.isolation import Isolation
from infertune.pipeline.reference import Check
from infertune.pipeline.verifying import Mismatch, checks_for, first_call_and_verify
from infertune.report import CandidateResult
from infertune.report.progress import Progress


class _Scaled(TfFunction):
    """tf-function with its outputs scaled: a candidate that computes something else."""

    name = "scaled"

    def __init__(self, factor: float):
        self.factor = factor

    def run(self, inputs):
        return [output * self.factor for output in super().run(inputs)]


def _run_stage(state, run, stage, text, fn):
    return fn()


def _preparation(model, rng, batches=(4, 4, 2)):
    """A Preparation with checks at `batches` (the first the sample), as tune.py builds it."""
    inputs = [rng.standard_normal((n, 6)).astype("float32") for n in batches]
    target = target_for(model, inputs[0])
    checks = [Check(f"input {i}", [x], [np.asarray(model(x))]) for i, x in enumerate(inputs)]
    options = Options.checked(isolation="off")
    isolation = Isolation("off", None)
    return Preparation(target, checks, options, Progress(False), isolation, Budget(None))


def _candidate(backend, run):
    backend.prepare(run.target)
    result = CandidateResult(name=backend.name, status="ok", precision=backend.precision)
    return Candidate(backend, result)


def test_a_candidate_that_reproduces_the_model_is_verified(rng):
    run = _preparation(dense_model(), rng)
    state = _candidate(TfFunction(), run)
    first_call_and_verify(state, run, run.isolation, _run_stage)
    assert state.result.first_call_ms > 0
    assert state.result.max_rel_err < 1e-5  # float32 round-off of one graph against eager
    # Its calls at the sample's shapes (after the first) are its warm-up: their time is kept.
    assert run.call_estimates["tf-function"] > 0


@pytest.mark.parametrize("factor", [1.01, 1e-6])
def test_a_candidate_that_differs_is_rejected_naming_the_check(rng, factor):
    run = _preparation(dense_model(), rng)
    state = _candidate(_Scaled(factor), run)
    with pytest.raises(Mismatch, match="on input 0"):
        first_call_and_verify(state, run, run.isolation, _run_stage)
    # Its errors are in its result, for the report.
    assert state.result.max_rel_err == pytest.approx(abs(1 - factor), rel=1e-3)


def test_an_exact_shape_candidate_runs_only_the_checks_of_its_shapes(rng):
    run = _preparation(dense_model(), rng)
    backend = TfFunction()
    backend.exact_shapes = [(4, 6)]
    assert [c.label for c in checks_for(backend, run.checks)] == ["input 0", "input 1"]
    backend.exact_shapes = [(2, 6)]  # not the sample's: it could serve no call
    with pytest.raises(ValueError, match="not the sample's"):
        checks_for(backend, run.checks)
