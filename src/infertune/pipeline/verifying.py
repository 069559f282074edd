"""Verify a prepared candidate: its first call timed apart, then its outputs on every check
against the reference (model/tolerance.py's rule under rtol/atol); a candidate that differs is
`mismatch` (`Mismatch`, with the reason and its errors in its result).

A reduced-precision candidate (bf16, int8) is judged by the gate instead of rtol/atol
(precision/gate.py, accuracy.py): its outputs on the checks must still have the model's structure,
shapes and dtypes and no NaN where the model has none; then the task's metric on the user's
labelled data, or the agreement rule, decides (the `gate` stage: `judge_candidate`, which the
scheduler may call once every candidate is verified, preparing.py).

Which checks a candidate runs: all of them, or for one that runs only the sample's exact
shapes (`Backend.exact_shapes`), those of its shapes (`checks_for`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..accuracy import Judgement
from ..backends import Backend
from ..model.tolerance import (
    Comparison,
    compare_outputs,
)
from ..options import REFERENCE_NAMES
from ..precision.gate import (
    PrecisionData,
    describe,
    judge,
)
from ..report import CandidateResult
from .reference import Check

if TYPE_CHECKING:
    from .context import Candidate, Preparation
    from .isolation import Isolation

__all__ = [
    "Mismatch",
    "checks_for",
    "first_call_and_verify",
    "judge_candidate",
    "split_by_batch",
]

# How a stage of the candidate is run and timed: (state, run, stage, text, fn) -> fn().
StageRunner = Callable[["Candidate", "Preparation", str, str, Callable[[], Any]], Any]


class Mismatch(Exception):
    """Verification rejected the candidate (its result already holds the errors); for a
    reduced-precision candidate, the gate's verdict (`judgement`)."""

    def __init__(self, reason: str, judgement: Judgement | None = None):
        super().__init__(reason)
        self.judgement = judgement


def checks_for(backend: Backend, checks: list[Check]) -> list[Check]:
    """The checks a candidate runs: all of them, or for one that runs only the sample's exact
    shapes (`Backend.exact_shapes`), those of its shapes. Raises ValueError for a candidate
    whose exact shapes are not the sample's (the first check's): it could serve no call."""
    if backend.exact_shapes is None:
        return checks
    shapes = [tuple(shape) for shape in backend.exact_shapes]
    if shapes != checks[0].shapes:
        raise ValueError(
            f"it runs only the input shapes {shapes}, which are not the sample's {checks[0].shapes}"
        )
    return [check for check in checks if check.shapes == shapes]


def split_by_batch(checks: list[Check], batches: frozenset[int]) -> tuple[list[Check], list[Check]]:
    """The checks whose inputs are not all at one of `batches`, and those that are."""
    now, later = [], []
    for check in checks:
        (later if check.batch in batches else now).append(check)
    return now, later


def first_call_and_verify(
    state: Candidate,
    run: Preparation,
    isolation: Isolation,
    stage: StageRunner,
) -> None:
    """Time the first call, verify on every check (raises Mismatch on a mismatch); each is a
    stage run by `stage` (this thread's timeline or the background's). A reduced-precision
    candidate's outputs on the checks are kept in `state.checked`, for the gate the caller
    runs (`judge_candidate`) once it knows the candidate can be chosen."""
    backend, result = state.backend, state.result
    name, deadline = backend.name, state.deadline
    checks = checks_for(backend, run.checks)
    if run.deferred_batches and backend.compiles_per_shape:
        checks, run.deferred_checks[name] = split_by_batch(checks, run.deferred_batches)
    if name in REFERENCE_NAMES and run.options.reference == "eager":
        # The model's own call made every check's reference: run again, it shows only
        # whether it is deterministic, which the checks at the sample's shapes show (the
        # batch of 3 took ResNet50 128's eager call 0.24 s, the sample 0.15 s).
        checks = [check for check in checks if check.shapes == checks[0].shapes]
    if backend.exact_shapes is not None:
        result.exact_shapes = [list(shape) for shape in backend.exact_shapes]
        result.exact_reason = backend.exact_reason
    start = time.perf_counter()
    outputs = stage(
        state,
        run,
        "first call",
        f"{name}: first call",
        lambda: isolation.call(lambda: backend.run(checks[0].inputs), deadline, "first call"),
    )
    result.first_call_ms = 1e3 * (time.perf_counter() - start)
    result.runs_on = backend.runs_on or None

    reduced = backend.precision != "fp32"
    # A reduced-precision candidate's errors are measured, not judged, by rtol/atol.
    rtol, atol = (math.inf, math.inf) if reduced else (run.options.rtol, run.options.atol)
    checked: list[tuple[list[np.ndarray], list[np.ndarray]]] = []

    def verify() -> Comparison:
        comparison = Comparison(True, "")
        at_sample_shapes = []
        found_outputs = outputs
        for check in checks:
            if check is not checks[0]:
                t0 = time.perf_counter()
                found_outputs = isolation.call(
                    lambda c=check: backend.run(c.inputs), deadline, "verification"
                )
                if check.shapes == checks[0].shapes:
                    at_sample_shapes.append(time.perf_counter() - t0)
            found = compare_outputs(found_outputs, check.reference, rtol, atol)
            checked.append((found_outputs, check.reference))
            if not found:
                found = Comparison(
                    False, f"on {check.label}: {found.reason}", found.max_abs_err, found.max_rel_err
                )
            comparison = comparison.merged(found)
        if at_sample_shapes:
            run.call_estimates[name] = float(np.median(at_sample_shapes))
        return comparison

    comparison = stage(
        state, run, "verification", f"{name}: verifying on {len(checks)} inputs", verify
    )
    result.max_abs_err, result.max_rel_err = comparison.max_abs_err, comparison.max_rel_err
    if not comparison:
        raise Mismatch(comparison.reason)
    if reduced:
        state.checked = checked
        run.progress.say(f"{name}: verified, before its gate")
        return
    only = ""
    if run.deferred_checks.get(name):
        only = (
            f", on {len(checks)} inputs: it compiles for each shape, and is verified at the "
            f"other tuned batch sizes where it is timed there"
        )
    elif len(checks) < len(run.checks):
        only = (
            f", on the {len(checks)} inputs at the sample's shapes: it runs only those "
            f"({backend.exact_reason})"
        )
    run.progress.say(f"{name}: verified (relative error {comparison.max_rel_err:.1e}{only})")


def judge_candidate(
    state: Candidate, run: Preparation, isolation: Isolation, stage: StageRunner
) -> None:
    """The gate's verdict on a verified reduced-precision candidate, in its result (raises
    Mismatch, with the judgement, where it fails)."""
    backend, result = state.backend, state.result
    data = run.precision or PrecisionData()
    judgement = stage(
        state, run, "gate", f"{backend.name}: judging its {backend.precision} outputs",
        lambda: isolation.call(
            lambda: judge(backend.run, data, state.checked or []), state.deadline, "gate"
        ),
    )  # fmt: skip
    record(result, judgement)
    result.quantization = backend.precision_note or None
    if not judgement:
        raise Mismatch(f"{describe(judgement)}", judgement)
    run.progress.say(f"{backend.name}: passed the gate: {judgement.reason}")


def record(result: CandidateResult, judgement: Judgement) -> None:
    """The gate's verdict in the candidate's result (the report's fields)."""
    result.gate = judgement.rule
    result.reason = judgement.reason if judgement else result.reason
    result.metric, result.reference_metric = judgement.metric, judgement.reference_metric
    result.metric_drop, result.metric_drop_bound = judgement.drop, judgement.drop_bound
    result.max_drop = judgement.max_drop
