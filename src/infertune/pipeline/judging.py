"""The reduced-precision candidates after every first verdict: the model's predictions on the
labelled data made by a verified float32 candidate (beside the conversions where they can be),
the gate for each verified candidate the fastest first and only while it can still be chosen,
then the search for a quantization that passes (precision.py) for those that failed it."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..backends import Backend
from .budget import BudgetOver
from .context import Candidate, Preparation
from .isolation import Isolation
from .precision import SEARCH_FASTER, raced, rivals, search, serves_several, time_together
from .steps import NotJudged, SearchLater, contend, guarded, timed_stage
from .tournament import keep
from .verifying import Mismatch, judge_candidate

__all__ = [
    "QUIET_WITHIN",
    "failed_gate",
    "judge_waiting",
    "judged_now",
    "predict_early",
    "quiet_maker",
    "search_waiting",
]

# The predictions beside the conversions are made by a runtime that sleeps between calls where
# one is at most this much slower than the fastest (call estimates: a few calls, some cold).
QUIET_WITHIN = 1.5


def judged_now(state: Candidate, run: Preparation, isolation: Isolation, stage: Callable) -> None:
    """Where memory is tight, a verified reduced-precision candidate's gate, at once (it holds
    memory), unless it cannot be chosen: it is first timed against the fastest candidates
    verified so far (`race`: nothing timed it with them before, as `judge_waiting` does), and
    one no faster is not judged (`NotJudged`), serving one batch size and one caller. On
    the BERT-sized encoder four gates slower than OpenVINO's int8, which had passed, took
    26 s of optimize()'s 217 there (one run each way)."""
    others = [] if serves_several(run) else rivals(run)
    if others:
        mine, rival, theirs = raced(state, run, stage, state.backend, others)
        if rival is not None and mine is not None and mine >= theirs:
            raise NotJudged(_slower(rival.name, theirs, mine))
    judge_candidate(state, run, isolation, stage)


def failed_gate(state: Candidate, run: Preparation, stage: Callable, failed: Mismatch) -> None:
    """After a Mismatch: raise it again, unless the candidate is a quantized one that another
    quantization may save (precision.py): its search then waits for every gate's verdict
    (`SearchLater`), or where memory is tight runs now (it holds memory: now or never)."""
    backend = state.backend
    if failed.judgement is None or not (backend.calibration_methods[1:] or backend.keeps_layers):
        raise failed
    if run.memory_tight is None:
        state.failed_gate = failed
        raise SearchLater from failed
    search(state, run, run.isolation, stage, failed)


# The float32 candidates timed with the reduced ones before the gates, the fastest by their
# verification calls: a bar to beat, and more rounds for the reduced ones in the second (on
# ResNet50 224 twelve runners got three rounds, and OpenVINO's int8 timed ahead of LiteRT's,
# which was 1.2x faster in the measurement after).
FLOAT32_TIMED = 3


def judge_waiting(run: Preparation) -> None:
    """The gate (verifying.py `judge_candidate`) for the reduced-precision candidates, once
    every candidate has its first verdict: they and the FLOAT32_TIMED fastest float32
    candidates are timed together on the sample (precision.py `time_together`), once the
    model's predictions on the labelled data started beside the conversions are in
    (`_await_predictions`; where they were not started, the fastest float32 one makes them
    after the timing: `_complete_predictions`); then the candidates are judged the fastest
    first, each only while it can still be chosen (`_not_judged`). On ResNet50 224 five gates
    took 41 s of optimize()'s 135 s; the fastest candidate passed, and none of the others
    could have been chosen."""
    _await_predictions(run)
    if not run.to_judge:
        return
    by_estimate = sorted(rivals(run), key=lambda b: run.call_estimates.get(b.name, math.inf))
    rivals_fp32 = by_estimate[:FLOAT32_TIMED]
    text = "timing the reduced-precision candidates and the fastest float32 ones together"
    with run.progress.timed("timing", text=text):
        run.sample_p50 = time_together([s.backend for s in run.to_judge] + rivals_fp32, run)
    _complete_predictions(run, rivals_fp32)
    budget = run.budget
    waiting = sorted(run.to_judge, key=lambda s: run.sample_p50.get(s.name, math.inf))
    for state in waiting:
        state.deadline = run.deadline()

        def judged(state: Candidate = state) -> None:
            if budget.limited and budget.left_s() <= budget.after_s(1):
                raise BudgetOver("before its gate")
            why_not = _not_judged(state, run)
            if why_not is not None:
                raise NotJudged(why_not)
            try:
                judge_candidate(state, run, run.isolation, timed_stage)
            except Mismatch as exc:
                failed_gate(state, run, timed_stage, exc)

        if guarded(state, run, judged):
            contend(state, run)


def predict_early(run: Preparation) -> None:
    """The model's predictions on the labelled data (precision/gate.py) started in a thread of
    their own
    once every float32 candidate started so far has its verdict (called as each verdict
    comes), by a verified one (`quiet_maker`): they then run beside the conversions still to
    come, the quantizing ones among them (TFLite's converter keeps one core of two most of its
    time). Not where memory is tight (nothing runs beside the conversions there), nor where no
    reduced-precision candidate is left."""
    data = run.precision
    if data is None or data.predicted or run.memory_tight is not None:
        return
    with run.lock:
        if run.predicting is not None:
            return
        float32 = [s for s in run.states if s.backend.precision == "fp32" and s.future]
        if any(not s.future.done() for s in float32):
            return
        if not any(s.backend.precision != "fp32" and s.result.status == "ok" for s in run.states):
            return
        verified = [
            s for s in float32
            if s.backend.exact_shapes is None and s.future.exception() is None
            and s.name in run.call_estimates
        ]  # fmt: skip
        if not verified:
            return
        fastest = quiet_maker(verified, run.call_estimates)
        started = time.perf_counter()

        def predict() -> list[np.ndarray] | None:
            try:
                with run.exclusive.work():
                    return data.predictions_by(fastest.backend.run)
            finally:
                seconds = time.perf_counter() - started
                run.progress.times.add_background(fastest.name, seconds, "accuracy reference")

        thread = ThreadPoolExecutor(1, "infertune predictions")
        run.predicting = (fastest.name, thread.submit(predict))
        thread.shutdown(wait=False)
    run.progress.say(
        f"the model's predictions on the labelled data: by {fastest.name}, beside the conversions"
    )


def quiet_maker(verified: list[Candidate], estimates: dict[str, float]) -> Candidate:
    """Of the verified float32 candidates, the one to make the predictions beside the
    conversions: the fastest (least call estimate) of those whose threads sleep between calls,
    where it is within QUIET_WITHIN of the fastest of all. A runtime whose threads spin
    (ONNX Runtime's default session) holds both cores between its calls, which the quantizers
    beside it need: NNCF on ResNet50 224 and the predictions on 435 samples took 34.5-37.6 s
    together by the spinning session, 29.0-32.8 s by the one that sleeps (2 cores, 3 rounds
    interleaved: benchmarks/predictions_beside.py)."""
    fastest = min(verified, key=lambda s: estimates[s.name])
    quiet = [s for s in verified if not s.backend.cooldown_s]
    if not quiet:
        return fastest
    best_quiet = min(quiet, key=lambda s: estimates[s.name])
    if estimates[best_quiet.name] <= QUIET_WITHIN * estimates[fastest.name]:
        return best_quiet
    return fastest


def _await_predictions(run: Preparation) -> None:
    """The predictions started by `predict_early` awaited, and the model's made from them
    (by the model itself where they failed or differ from its own on the first rows)."""
    data = run.precision
    if run.predicting is None or data is None or data.predicted:
        return
    name, future = run.predicting
    text = f"waiting for the model's predictions on the labelled data by {name}"
    with run.progress.timed("waiting for the accuracy reference", text=text):
        data.complete(None, name, (run.options.rtol, run.options.atol), made=future.result())
    run.progress.say(f"the model's predictions on the labelled data made by {data.predicted_by}")


def _complete_predictions(run: Preparation, verified: list[Backend]) -> None:
    """The model's predictions on the labelled data (precision/gate.py), where `predict_early` did
    not
    make them: by the fastest of the `verified` float32 candidates on the sample that runs
    every batch size; by the model itself where there is none, or where it differs from the
    model on the first rows."""
    data = run.precision
    if data is None or data.predicted:
        return
    usable = [b for b in verified if b.precision == "fp32" and b.exact_shapes is None]
    fastest = min(usable, key=lambda b: run.sample_p50.get(b.name, math.inf), default=None)
    name = fastest.name if fastest is not None else "the model"
    text = f"the model's predictions on the labelled data, by {name}"
    with run.progress.timed("accuracy reference", text=text):
        data.complete(
            fastest.run if fastest is not None else None, name, (run.options.rtol, run.options.atol)
        )
    run.progress.say(f"the model's predictions on the labelled data made by {data.predicted_by}")


def _fastest_verified(run: Preparation) -> tuple[str, float] | None:
    """The verified candidate (float32, or reduced and passed) of least p50 on the sample
    among those timed together (`judge_waiting`), and that p50."""
    timed = [(name, p50) for name, p50 in run.sample_p50.items() if name in run.contenders]
    return min(timed, key=lambda pair: pair[1], default=None)


def _not_judged(state: Candidate, run: Preparation) -> str | None:
    """Why a reduced-precision candidate is not judged, None where it is: one slower on the
    sample than a candidate verified (a float32 one, or a reduced one that passed) cannot be
    chosen. Always judged where the run serves several batch sizes or callers (the choice is
    made at each: a candidate slower here may win there)."""
    if serves_several(run):
        return None
    mine, best = run.sample_p50.get(state.name), _fastest_verified(run)
    if mine is None or best is None or mine < best[1]:
        return None
    return _slower(best[0], best[1], mine)


def _slower(best: str, theirs: float, mine: float) -> str:
    return (
        f"not judged: {best} is verified, its p50 {theirs:.4g} ms against this one's "
        f"{mine:.4g} ms (timed together on the sample), so it cannot be chosen"
    )


def search_waiting(run: Preparation) -> None:
    """The search for a quantization that passes the gate (precision.py) for the candidates
    whose first failed it: the fastest first, each only while it can still win (`_why_not`).
    On ResNet50 224 the search of ONNX Runtime's static int8 took 170 of optimize()'s 325 s,
    though OpenVINO's int8, faster, passed."""
    waiting = sorted(run.to_search, key=lambda s: run.sample_p50.get(s.name, math.inf))
    for state in waiting:
        state.result.status, state.deadline = "ok", run.deadline()

        def searched(state: Candidate = state) -> None:
            failed = state.failed_gate
            why_not = _why_not(state, run)
            if why_not is not None:
                raise Mismatch(f"{failed}; not searched further: {why_not}", failed.judgement)
            search(state, run, run.isolation, timed_stage, failed)
            keep(state, run)

        if guarded(state, run, searched):
            contend(state, run)


def _why_not(state: Candidate, run: Preparation) -> str | None:
    """Why a quantized candidate that failed the gate is not searched, None where it is.
    Keeping layers in float32 only slows a quantized model: one whose p50 on the sample,
    quantized throughout, is not at most SEARCH_FASTER times the fastest verified candidate's
    (a float32 one, a reduced one that passed; timed together, `judge_waiting`) cannot win.
    On ResNet50 224 OpenVINO's int8, timed 7.9 ms against LiteRT's int8 7.0 ms, was searched
    for 40 s, passed with layers kept in float32, and was 1.06x slower."""
    budget = run.budget
    if budget.limited and budget.left_s() <= budget.after_s(1):
        return f"time_budget_s={budget.time_budget_s:g} ran out"
    mine, best = run.sample_p50.get(state.name), _fastest_verified(run)
    if mine is None or best is None or mine < SEARCH_FASTER * best[1]:
        return None
    return (
        f"{best[0]} is verified, its p50 {best[1]:.4g} ms against this one's {mine:.4g} ms "
        f"quantized throughout (layers kept in float32 only slow it: searched where at most "
        f"{SEARCH_FASTER:g}x)"
    )
