"""Prepare and verify the candidates: in the order most likely to pay, within the time budget
and the memory, with the rehearsal child working while this process converts.

This module is the scheduler; each concern it calls on has a module of its own: the time
budget (budget.py), memory admission (memory.py), where memory is tight the variants not tried
and the tournament that keeps few copies of the weights (tournament.py), the conversions
handed to a worker process (offload.py), verification and the reduced-precision gate
(verifying.py, precision/gate.py), and the search for a quantization that passes it (precision.py).
What they share is one `Preparation` (context.py).

Each candidate goes through its stages (report/stages.py): conversion, rehearsal (for the native
runtimes, isolation.py), compile, first call, verification. A rehearsed candidate's rehearsal
is submitted to the child process as soon as its files exist; this process goes on with the
next candidate's conversion (an ONNX export, a TFLite conversion: the longest stages) and
compiles the rehearsed one here once the child has answered. Only a candidate whose rehearsal
survived is ever compiled in this process.

Reduced-precision candidates are judged by the gate once every candidate is verified, the
fastest first, and only while they can still be chosen; the searches for a quantization that
passes come last, on the same rule. The model's predictions on the labelled data are made by a
verified float32 candidate (faster than the model), in a thread of their own beside the
conversions still to come, once the float32 candidates started so far are verified
(`_predict_early`).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backends import Backend
from ..backends.base import NotApplicable, RunFacts
from ..errors import one_line
from ..export.registry import stage_name
from ..report import CandidateResult
from ..system.resources import page_out_own_files
from .budget import BudgetOver, fits_time
from .context import Candidate, Preparation
from .isolation import (
    CandidateCrashed,
    CandidateTimeout,
    Isolation,
    NotRehearsable,
    Rehearsal,
    RehearsalError,
    RehearsalUnavailable,
)
from .memory import fits_memory, memory_budget
from .offload import offload
from .planning import order_candidates
from .precision import SEARCH_FASTER, raced, rivals, search, serves_several, time_together
from .tournament import keep, memory_tight, skip_variant, wait_for_rehearsals
from .verifying import Mismatch, checks_for, first_call_and_verify, judge_candidate

__all__ = ["Prepared", "prepare_all"]

# The predictions beside the conversions are made by a runtime that sleeps between calls where
# one is at most this much slower than the fastest (call estimates: a few calls, some cold).
QUIET_WITHIN = 1.5


@dataclass
class Prepared:
    """What the preparation hands to the measurement."""

    results: list[CandidateResult]  # one per candidate, in the order given
    contenders: dict[str, Backend]  # the verified candidates, by name
    call_estimates: dict[str, float]  # their seconds per call on the sample in verification
    tried: list[str]  # the names in the order they were tried


def prepare_all(candidates: list[Backend], run: Preparation) -> Prepared:
    """Prepare and verify each candidate (the reference first, then the others in the planned
    order)."""
    isolation, target = run.isolation, run.target
    run.memory_budget = memory_budget()
    states = [
        Candidate(b, CandidateResult(name=b.name, status="ok", precision=b.precision))
        for b in candidates
    ]
    reference, others = states[0], states[1:]
    probe = run.probe
    run.facts = RunFacts(
        frozenset(s.name for s in others),
        target.calibration is not None,
        probe.flops if probe is not None else None,
        probe.op_types if probe is not None else {},
    )
    # The model itself runs as the caller runs it, in this thread, with no deadline.
    admitted = _admitted(reference, run, is_reference=True)
    if admitted and _in_process(reference, run, Isolation("off", None)):
        run.contenders[reference.name] = reference.backend
    target.memory_tight = memory_tight(others, run)
    run.states = others
    isolation.start()  # the child's imports overlap the next candidate's conversion
    if run.probe is not None:
        by_backend = {id(s.backend): s for s in others}
        ordered = order_candidates([s.backend for s in others], run.probe, run.record)
        others = [by_backend[id(b)] for b in ordered]
    if not run.budget.limited and isolation.mode != "off":
        # Every candidate is tried, so the order only decides what overlaps: those compiled
        # in this process first (their first calls, XLA's compile, run in the background
        # while this thread converts), then the conversion that most candidates wait for
        # (the ONNX export: every ONNX Runtime and OpenVINO candidate is rehearsed and
        # compiled while the next conversion runs here).
        needs = Counter(k for s in others for k in s.backend.conversions[:1])
        others.sort(
            key=lambda s: (
                isolation.rehearses(s.backend),
                -needs[s.backend.conversions[0]] if s.backend.conversions else 0,
            )
        )
    tried = [reference.name]
    pending: list[Candidate] = []
    # One background thread finishes each candidate after its part in this thread (its
    # conversion, or its trace): the wait for its rehearsal, its compile, first call and
    # verification; XLA's and the runtimes' compiles run in native code, without the GIL,
    # while this thread converts the next candidate. Not with isolation "off": everything
    # then runs in the caller's thread, one candidate after another.
    background = ThreadPoolExecutor(1, "infertune background") if isolation.mode != "off" else None
    if background is None:
        run.converted.set()
    try:
        offload(others, run)
        for state in others:
            if not _admitted(state, run) or not fits_time(state, run, pending):
                continue
            if skip_variant(state, run, others) or not fits_memory(state, run, states):
                continue
            tried.append(state.name)
            run.started += 1
            if background is None:
                if _in_process(state, run, isolation):
                    _contend(state, run)
            elif _start(state, run, background):
                pending.append(state)
                if state.backend.precision == "fp32":
                    state.future.add_done_callback(lambda _: _predict_early(run))
        run.converted.set()
        for state in pending:
            _finish(state, run)
        _judge_waiting(run)
        _search_waiting(run)
    finally:
        run.converted.set()
        if background is not None:
            background.shutdown(wait=False)  # every task was waited for, or abandoned
        if run.predicting is not None:  # no candidate is closed while it runs one
            run.predicting[1].result()
        target.close_offloaded()
        target.release_traced()  # every conversion that starts from it is made
    return Prepared([s.result for s in states], run.contenders, run.call_estimates, tried)


def _admitted(state: Candidate, run: Preparation, is_reference: bool = False) -> bool:
    """Whether a candidate can go on to prepare; if not, its result says why. The reference
    (the model's own call) is always measured, whatever precision= allows.

    Availability comes before precision: a candidate that cannot run here is `unavailable`
    with its reason whatever the precision allowed, so that a `skipped` fp16 candidate means
    that allowing fp16 would let it run."""
    backend, result, options = state.backend, state.result, run.options
    reason = backend.available() or backend.tuning_unavailable()
    if reason is not None:
        result.status, result.reason = "unavailable", reason
        return False
    if backend.callers_only and options.concurrency == 1:
        result.status = "skipped"
        result.reason = (
            "a variant for several callers at once: tried with optimize(concurrency=N), N > 1"
        )
        return False
    if backend.precision not in options.precision and not is_reference:
        result.status = "skipped"
        result.reason = (
            f"{backend.precision} candidate; allow it with precision=(..., "
            f"{backend.precision!r}) where a reduced-precision error is acceptable"
        )
        return False
    if backend.needs_calibration and run.target.calibration is None:
        result.status = "skipped"
        result.reason = (
            f"static {backend.precision} needs calibration=... (a few hundred representative "
            f"inputs, as the model takes them) to calibrate its activations"
        )
        return False
    why = backend.not_worth_trying(run.facts)
    if why is not None:
        result.status, result.reason = "skipped", why
        return False
    return True


# -- the stages ---------------------------------------------------------------------------
def _stage(
    state: Candidate, run: Preparation, stage: str, text: str, fn: Callable[[], Any],
    track: bool = True,
) -> Any:  # fmt: skip
    """fn() as `stage` of the candidate, timed; shared conversions built meanwhile are
    timed as shared stages of their own, not as the candidate's. `track`: the stage is the
    one a failure is reported at (not for a wait on work done elsewhere)."""
    if track:
        state.stage = stage
    run.progress.stage(text)
    start = time.perf_counter()
    try:
        return fn()
    finally:
        end = time.perf_counter()
        shared = run.target.built_between(start, end)
        for key, seconds in shared.items():
            run.progress.times.add(stage_name(key), seconds)
        own = end - start - sum(shared.values())
        run.progress.times.add(stage, own, state.name)
        if track:
            state.seconds[stage] = state.seconds.get(stage, 0.0) + own


def _background_stage(
    state: Candidate, run: Preparation, stage: str, text: str, fn: Callable[[], Any]
) -> Any:
    """fn() as `stage` of the candidate in the background thread: timed apart (off this
    thread's timeline), shown nowhere as the current stage."""
    state.stage = stage
    start = time.perf_counter()
    try:
        return fn()
    finally:
        seconds = time.perf_counter() - start
        run.progress.times.add_background(state.name, seconds, stage)
        state.seconds[stage] = state.seconds.get(stage, 0.0) + seconds


def _in_process(state: Candidate, run: Preparation, isolation: Isolation) -> bool:
    """Prepare, first call and verify a candidate that is not rehearsed."""
    state.deadline = _deadline(run, isolation)

    def compile_and_verify() -> None:
        _compile(state, run, isolation, _stage)
        _verify(state, run, isolation, in_background=False)

    return _guarded(state, run, compile_and_verify)


def _deadline(run: Preparation, isolation: Isolation) -> float:
    """The deadline of a phase that starts now under `isolation` (the run's, or "off" for the
    model's own call): candidate_timeout_s's, or the budget's end where sooner."""
    if isolation is run.isolation:
        return run.deadline()
    return isolation.deadline()


def _start(state: Candidate, run: Preparation, background: ThreadPoolExecutor) -> bool:
    """This thread's part of a candidate: its conversion and the submission of its rehearsal
    (a rehearsed one), or its compile (a trace, in Python: best here); the rest goes to the
    background thread. False if it failed already."""
    backend, isolation = state.backend, run.isolation
    state.deadline = run.deadline()
    rehearsed = isolation.rehearses(backend)

    def start() -> None:
        if not rehearsed:
            _compile(state, run, isolation, _stage)
            state.future = background.submit(_verify, state, run, isolation, True)
            return
        started = time.perf_counter()
        _stage(
            state,
            run,
            "conversion",
            f"{state.name}: converting",
            lambda: isolation.call(
                lambda: backend.convert(run.target), state.deadline, "conversion"
            ),
        )
        allowed = None
        if isolation.deadline() != math.inf and isolation.timeout_s is not None:
            allowed = isolation.timeout_s - (time.perf_counter() - started)
        state.stage = "rehearsal"
        checks = checks_for(backend, run.checks)
        try:
            state.rehearsal = isolation.submit(
                *backend.rehearsal(run.target, [c.inputs for c in checks]), allowed, state.name
            )
        except RehearsalUnavailable as exc:
            isolation.fall_back(str(exc))
        state.future = background.submit(_after_rehearsal, state, run)

    return _guarded(state, run, start)


def _after_rehearsal(state: Candidate, run: Preparation) -> None:
    """In the background thread: wait for the rehearsal's verdict, then compile, first call
    and verify here (raises on failure)."""
    isolation, budget = run.isolation, run.budget
    if state.rehearsal is not None:
        give_up = budget.candidates_end(run.contenders_at_most()) if budget.limited else math.inf
        if not _wait(state.rehearsal, run, give_up):
            raise BudgetOver("during its rehearsal in the child process")
    if run.memory_tight is not None and state.backend.memory_factor > 0:
        # A large model's conversions hold 2-4.6x its weights each: a session compiled here
        # meanwhile adds its copy to that peak, so it waits for them (its rehearsal went on);
        # and for the rehearsals in the child, which hold a copy each (2.42 GB MLP: LiteRT
        # rehearsed while OpenVINO compiled here took the peak from 3.2x to 6.0x).
        run.converted.wait()
        wait_for_rehearsals(run)
    if budget.limited and budget.left_s() <= budget.after_s(1):
        raise BudgetOver("before its compile here")
    state.deadline = run.deadline()  # compiling here gets the full time again
    _compile(state, run, isolation, _background_stage)
    _verify(state, run, isolation, in_background=True)


def _finish(state: Candidate, run: Preparation) -> None:
    """Wait for what the background thread does for a candidate (its verdict)."""
    budget = run.budget
    give_up = budget.candidates_end(run.contenders_at_most()) if budget.limited else None

    def wait() -> None:
        text = f"{state.name}: waiting for its compile and verification"
        timeout = None if give_up is None else max(0.0, give_up - time.perf_counter())
        try:
            _stage(state, run, "waiting", text, lambda: state.future.result(timeout), False)
        except FuturesTimeout:
            raise BudgetOver(f"during its {state.stage}") from None

    if state.future is None or _guarded(state, run, wait):
        _contend(state, run)


def _contend(state: Candidate, run: Preparation) -> None:
    """A verified candidate joins the measurement, unless it was closed meanwhile (keep)."""
    with run.lock:
        if not state.dropped:
            run.contenders[state.name] = state.backend


def _wait(rehearsal: Rehearsal, run: Preparation, give_up_at: float) -> bool:
    """The rehearsal's verdict (raised where it failed); False if not in by `give_up_at`.
    A child that cannot start, or cannot import the class, leaves the candidate to be
    prepared here without a rehearsal (said in the notes)."""
    try:
        return rehearsal.wait(give_up_at)
    except RehearsalUnavailable as exc:
        run.isolation.fall_back(str(exc))
    except NotRehearsable as exc:
        run.isolation.notes.append(f"{rehearsal.name}: prepared without a rehearsal ({exc})")
    return True


def _compile(state: Candidate, run: Preparation, isolation: Isolation, stage: Callable) -> None:
    """prepare() in this process, timed by `stage` (this thread's or the background's)."""
    backend, target, result = state.backend, run.target, state.result
    used_before = len(target.used)
    stage(
        state,
        run,
        "compile",
        f"{state.name}: preparing",
        lambda: isolation.call(lambda: backend.prepare(target), state.deadline, "prepare"),
    )
    if run.memory_tight is not None:
        # Its runtime packed the weights into buffers of its own: the file's pages it
        # mapped (the flatbuffer, the external data) go before the next copy is made.
        page_out_own_files()
    # prepare_s: its own stages before the first call, plus every shared conversion it uses
    # (the ONNX export), whoever paid for it, so that each candidate shows its whole cost.
    result.prepare_s = (
        state.seconds.get("conversion", 0.0)
        + state.seconds.get("compile", 0.0)
        + target.shared_seconds(target.used[used_before:] + list(backend.conversions))
    )


def _verify(state: Candidate, run: Preparation, isolation: Isolation, in_background: bool) -> None:
    """First call and verification (verifying.py; raises Mismatch), then, where memory is
    tight, the tournament. A reduced-precision candidate's gate waits for every candidate's
    first verdict (`_JudgeLater`), except where memory is tight (it holds memory: judged at
    once). `in_background`: in the background thread, timed apart."""
    if in_background and run.memory_tight is not None:
        # Where memory is tight nothing runs beside the conversions: XLA compiles at its first
        # call, holding 3x the weights (beside the ONNX export's 4x: 5x); and a call reading
        # a variable while a conversion reads it too made TensorFlow copy it (a variable in
        # copy-on-read mode: the 2.46 GB recommender's table, read by tf-function's
        # verification while the export froze it), a copy its allocator kept to the end.
        run.converted.wait()
    stage = _background_stage if in_background else _stage
    later = run.memory_tight is None  # a gate waits for every first verdict (_judge_waiting)
    try:
        first_call_and_verify(state, run, isolation, stage)
        if not later and state.checked is not None:
            _judged_now(state, run, isolation, stage)
    except Mismatch as exc:
        _failed_gate(state, run, stage, exc)
    if later and state.checked is not None:
        raise _JudgeLater
    keep(state, run)


def _judged_now(state: Candidate, run: Preparation, isolation: Isolation, stage: Callable) -> None:
    """Where memory is tight, a verified reduced-precision candidate's gate, at once (it holds
    memory), unless it cannot be chosen: it is first timed against the fastest candidates
    verified so far (`race`: nothing timed it with them before, as `_judge_waiting` does), and
    one no faster is not judged (`_NotJudged`), serving one batch size and one caller. On
    the BERT-sized encoder four gates slower than OpenVINO's int8, which had passed, took
    26 s of optimize()'s 217 there (one run each way)."""
    others = [] if serves_several(run) else rivals(run)
    if others:
        mine, rival, theirs = raced(state, run, stage, state.backend, others)
        if rival is not None and mine is not None and mine >= theirs:
            raise _NotJudged(_slower(rival.name, theirs, mine))
    judge_candidate(state, run, isolation, stage)


def _failed_gate(state: Candidate, run: Preparation, stage: Callable, failed: Mismatch) -> None:
    """After a Mismatch: raise it again, unless the candidate is a quantized one that another
    quantization may save (precision.py): its search then waits for every gate's verdict
    (`_SearchLater`), or where memory is tight runs now (it holds memory: now or never)."""
    backend = state.backend
    if failed.judgement is None or not (backend.calibration_methods[1:] or backend.keeps_layers):
        raise failed
    if run.memory_tight is None:
        state.failed_gate = failed
        raise _SearchLater from failed
    search(state, run, run.isolation, stage, failed)


# The float32 candidates timed with the reduced ones before the gates, the fastest by their
# verification calls: a bar to beat, and more rounds for the reduced ones in the second (on
# ResNet50 224 twelve runners got three rounds, and OpenVINO's int8 timed ahead of LiteRT's,
# which was 1.2x faster in the measurement after).
FLOAT32_TIMED = 3


class _JudgeLater(Exception):
    """A reduced-precision candidate is verified: its gate waits for every first verdict."""


class _NotJudged(Exception):
    """A reduced-precision candidate slower than one verified: not judged (the reason)."""


class _SearchLater(Exception):
    """A quantized candidate failed the gate: its search waits for every gate's verdict."""


def _judge_waiting(run: Preparation) -> None:
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
                raise _NotJudged(why_not)
            try:
                judge_candidate(state, run, run.isolation, _stage)
            except Mismatch as exc:
                _failed_gate(state, run, _stage, exc)

        if _guarded(state, run, judged):
            _contend(state, run)


def _predict_early(run: Preparation) -> None:
    """The model's predictions on the labelled data (precision/gate.py) started in a thread of
    their own
    once every float32 candidate started so far has its verdict (called as each verdict
    comes), by a verified one (`_quiet_maker`): they then run beside the conversions still to
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
        fastest = _quiet_maker(verified, run.call_estimates)
        started = time.perf_counter()

        def predict() -> list[np.ndarray] | None:
            try:
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


def _quiet_maker(verified: list[Candidate], estimates: dict[str, float]) -> Candidate:
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
    """The predictions started by `_predict_early` awaited, and the model's made from them
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
    """The model's predictions on the labelled data (precision/gate.py), where `_predict_early` did
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
    among those timed together (`_judge_waiting`), and that p50."""
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


def _search_waiting(run: Preparation) -> None:
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
            search(state, run, run.isolation, _stage, failed)
            keep(state, run)

        if _guarded(state, run, searched):
            _contend(state, run)


def _why_not(state: Candidate, run: Preparation) -> str | None:
    """Why a quantized candidate that failed the gate is not searched, None where it is.
    Keeping layers in float32 only slows a quantized model: one whose p50 on the sample,
    quantized throughout, is not at most SEARCH_FASTER times the fastest verified candidate's
    (a float32 one, a reduced one that passed; timed together, `_judge_waiting`) cannot win.
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


def _guarded(state: Candidate, run: Preparation, fn: Callable[[], None]) -> bool:
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
    except _JudgeLater:  # verified; judged once every candidate has its first verdict
        with run.lock:
            run.to_judge.append(state)
        return False
    except _NotJudged as exc:
        result.status, result.reason = "skipped", str(exc)
        progress.say(f"{name}: skipped, {result.reason}")
    except _SearchLater:  # held open for its search, once every candidate has its verdict
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
