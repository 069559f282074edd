"""A candidate's steps through preparation: each timed as a stage of the report, its failure
its verdict (`guarded`), and the verified candidate joining the measurement (`contend`).
The exceptions below carry a candidate between the scheduler (preparing.py) and the gate's
waiting line (judging.py)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from ..backends.base import NotApplicable
from ..errors import one_line
from ..export.registry import stage_name
from .budget import BudgetOver
from .context import Candidate, Preparation
from .isolation import CandidateCrashed, CandidateTimeout, RehearsalError
from .verifying import Mismatch

__all__ = [
    "JudgeLater",
    "NotJudged",
    "SearchLater",
    "contend",
    "guarded",
    "timed_in_background",
    "timed_stage",
]


class JudgeLater(Exception):
    """A reduced-precision candidate is verified: its gate waits for every first verdict."""


class NotJudged(Exception):
    """A reduced-precision candidate slower than one verified: not judged (the reason)."""


class SearchLater(Exception):
    """A quantized candidate failed the gate: its search waits for every gate's verdict."""


def timed_stage(
    state: Candidate, run: Preparation, stage: str, text: str, fn: Callable[[], Any],
    track: bool = True,
) -> Any:  # fmt: skip
    """fn() as `stage` of the candidate, timed; shared conversions built meanwhile are
    timed as shared stages of their own, not as the candidate's. `track`: the stage is the
    one a failure is reported at (not for a wait on work done elsewhere), and work that
    no timing may overlap (exclusive.py)."""
    if track:
        state.stage = stage
    run.progress.stage(text)
    start = time.perf_counter()
    try:
        with run.exclusive.work() if track else contextlib.nullcontext():
            return fn()
    finally:
        end = time.perf_counter()
        shared = run.target.conversions.built_between(start, end)
        for key, seconds in shared.items():
            run.progress.times.add(stage_name(key), seconds)
        own = end - start - sum(shared.values())
        run.progress.times.add(stage, own, state.name)
        if track:
            state.seconds[stage] = state.seconds.get(stage, 0.0) + own


def timed_in_background(
    state: Candidate, run: Preparation, stage: str, text: str, fn: Callable[[], Any]
) -> Any:
    """fn() as `stage` of the candidate in the background thread: timed apart (off this
    thread's timeline), shown nowhere as the current stage; work no timing may overlap."""
    state.stage = stage
    start = time.perf_counter()
    try:
        with run.exclusive.work():
            return fn()
    finally:
        seconds = time.perf_counter() - start
        run.progress.times.add_background(state.name, seconds, stage)
        state.seconds[stage] = state.seconds.get(stage, 0.0) + seconds


def contend(state: Candidate, run: Preparation) -> None:
    """A verified candidate joins the measurement, unless it was closed meanwhile (keep)."""
    with run.lock:
        if not state.dropped:
            run.contenders[state.name] = state.backend


def guarded(state: Candidate, run: Preparation, fn: Callable[[], None]) -> bool:
    """Run a candidate's stages; True if they all passed. A failure is its result's status
    and reason, never raised; a candidate that failed is closed, one timed out is not (a
    stage abandoned in a thread may still be using it)."""
    name, result, progress, budget = state.name, state.result, run.progress, run.budget
    try:
        fn()
        return True
    except Mismatch as exc:
        result.status, result.reason = "mismatch", str(exc)
        progress.say(f"{name}: rejected, {result.reason}")
    except JudgeLater:  # verified; judged once every candidate has its first verdict
        with run.lock:
            run.to_judge.append(state)
        return False
    except NotJudged as exc:
        result.status, result.reason = "skipped", str(exc)
        progress.say(f"{name}: skipped, {result.reason}")
    except SearchLater:  # held open for its search, once every candidate has its verdict
        result.status, result.reason = "mismatch", str(state.failed_gate)
        progress.say(f"{name}: failed the gate, {result.reason}; its search waits")
        with run.lock:
            run.to_search.append(state)
        return False
    except NotApplicable as exc:
        result.status, result.reason = "skipped", f"not applicable: {exc}"
        progress.say(f"{name}: skipped, {result.reason}")
    except BudgetOver as exc:
        result.status = "skipped"
        result.reason = f"time_budget_s={budget.time_budget_s:g} ran out {exc}"
        progress.say(f"{name}: skipped, {result.reason}")
    except CandidateTimeout as exc:
        at_end = budget.limited and time.perf_counter() >= budget.candidates_end(
            run.contenders_at_most()
        )
        if at_end:
            result.status = "skipped"
            result.reason = (
                f"time_budget_s={budget.time_budget_s:g} ran out during its {state.stage} "
                f"(abandoned, as at candidate_timeout_s)"
            )
            progress.say(f"{name}: skipped, {result.reason}")
        else:
            result.status, result.reason = "timeout", str(exc)
            progress.say(f"{name}: timed out: {result.reason}")
        return False
    except (CandidateCrashed, RehearsalError) as exc:
        result.status, result.reason = "failed", str(exc)
        progress.say(f"{name}: {result.reason}")
    except Exception as exc:  # a candidate's failure is reported, never raised
        stage = "prepare" if state.stage == "compile" else state.stage
        result.status, result.reason = "failed", f"{stage}: {one_line(exc)}"
        progress.say(f"{name}: failed at {result.reason}")
    with contextlib.suppress(Exception):  # what it held goes when it is collected
        state.backend.close()
    return False
