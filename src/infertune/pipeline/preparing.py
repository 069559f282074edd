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
(judging.py `predict_early`).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass, field

from ..backends import Backend
from ..backends.base import RunFacts
from ..model.sizes import ModelSize
from ..model.target import Target
from ..report import CandidateResult
from ..system.environment import usable_cores
from ..system.resources import page_out_own_files
from .budget import BudgetOver, fits_time
from .context import Candidate, Preparation
from .isolation import (
    Isolation,
    NotRehearsable,
    Rehearsal,
    RehearsalUnavailable,
)
from .judging import failed_gate, judge_waiting, judged_now, predict_early, search_waiting
from .memory import fits_memory, memory_budget
from .offload import offload
from .planning import order_candidates
from .reference import Check
from .steps import JudgeLater, contend, guarded, timed_in_background, timed_stage
from .tournament import keep, memory_tight, skip_variant, wait_for_rehearsals
from .verifying import Mismatch, checks_for, first_call_and_verify

__all__ = ["Prepared", "prepare_all"]


@dataclass
class Prepared:
    """What the preparation hands to the measurement."""

    results: list[CandidateResult]  # one per candidate, in the order given
    contenders: dict[str, Backend]  # the verified candidates, by name
    call_estimates: dict[str, float]  # their seconds per call on the sample in verification
    tried: list[str]  # the names in the order they were tried
    # Checks at other batch sizes left to the measurement, by name (Preparation's).
    deferred_checks: dict[str, list[Check]] = field(default_factory=dict)


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
    # Background threads finish each candidate after its part in this thread (its
    # conversion, or its trace): the wait for its rehearsal, its compile, first call and
    # verification; XLA's and the runtimes' compiles run in native code, without the GIL,
    # while this thread converts the next candidate. Two where there are two cores: once the
    # conversions are made, the candidates still to compile and verify take both (ResNet50
    # 128: optimize() 18.0-18.5 s against 19.1-20.7 s with one, in fresh processes), one
    # where memory is tight or the model large (each compile holds a copy of the weights).
    # Not with isolation "off": everything then runs in the caller's thread, one candidate
    # after another.
    background = (
        ThreadPoolExecutor(_background_threads(target), "infertune background")
        if isolation.mode != "off"
        else None
    )
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
                    contend(state, run)
            elif _start(state, run, background):
                pending.append(state)
                if state.backend.precision == "fp32":
                    state.future.add_done_callback(lambda _: predict_early(run))
        run.converted.set()
        for state in pending:
            _finish(state, run)
        judge_waiting(run)
        search_waiting(run)
    finally:
        run.converted.set()
        if background is not None:
            background.shutdown(wait=False)  # every task was waited for, or abandoned
        if run.predicting is not None:  # no candidate is closed while it runs one
            run.predicting[1].result()
        target.conversions.close_offloaded()
        target.release_traced()  # every conversion that starts from it is made
    return Prepared(
        [s.result for s in states], run.contenders, run.call_estimates, tried,
        {name: checks for name, checks in run.deferred_checks.items() if name in run.contenders},
    )  # fmt: skip


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
def _in_process(state: Candidate, run: Preparation, isolation: Isolation) -> bool:
    """Prepare, first call and verify a candidate that is not rehearsed."""
    state.deadline = _deadline(run, isolation)

    def compile_and_verify() -> None:
        _compile(state, run, isolation, timed_stage)
        _verify(state, run, isolation, in_background=False)

    return guarded(state, run, compile_and_verify)


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
            _compile(state, run, isolation, timed_stage)
            state.future = background.submit(_verify, state, run, isolation, True)
            return
        started = time.perf_counter()
        timed_stage(
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
        twin = _rehearsed_twin(state, run)
        if twin is not None:  # the same artifact in the same runtime: its verdict answers
            state.rehearsal = twin.rehearsal
        else:
            checks = checks_for(backend, run.checks)
            try:
                state.rehearsal = isolation.submit(
                    *backend.rehearsal(run.target, [c.inputs for c in checks]), allowed,
                    state.name,
                )  # fmt: skip
            except RehearsalUnavailable as exc:
                isolation.fall_back(str(exc))
        state.future = background.submit(_after_rehearsal, state, run)

    return guarded(state, run, start)


def _background_threads(target: Target) -> int:
    """Two background threads, or one where memory is tight, the model takes the large-model
    paths (each compile at once holds a copy of the weights) or one core is usable."""
    weights = target.weights_measured
    large = weights is not None and ModelSize(weights).lean
    return 1 if target.memory_tight is not None or large or usable_cores() < 2 else 2


def _rehearsed_twin(state: Candidate, run: Preparation) -> Candidate | None:
    """The candidate whose rehearsal answers for this one (Backend.rehearsal_twin: the same
    artifact in the same runtime on other threads), where it was rehearsed in this run: on
    ResNet50 128 each such rehearsal held the child about half a second, and wrote the
    export (100 MB) again."""
    name = state.backend.rehearsal_twin
    if name is None:
        return None
    return next((s for s in run.states if s.name == name and s.rehearsal is not None), None)


def _after_rehearsal(state: Candidate, run: Preparation) -> None:
    """In a background thread: wait for the rehearsal's verdict, then compile, first call
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
    _compile(state, run, isolation, timed_in_background)
    _verify(state, run, isolation, in_background=True)


def _finish(state: Candidate, run: Preparation) -> None:
    """Wait for what a background thread does for a candidate (its verdict)."""
    budget = run.budget
    give_up = budget.candidates_end(run.contenders_at_most()) if budget.limited else None

    def wait() -> None:
        text = f"{state.name}: waiting for its compile and verification"
        timeout = None if give_up is None else max(0.0, give_up - time.perf_counter())
        try:
            timed_stage(state, run, "waiting", text, lambda: state.future.result(timeout), False)
        except FuturesTimeout:
            raise BudgetOver(f"during its {state.stage}") from None

    if state.future is None or guarded(state, run, wait):
        contend(state, run)


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
    conversions = target.conversions
    used_before = len(conversions.used)
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
        + conversions.shared_seconds(conversions.used[used_before:] + list(backend.conversions))
    )


def _verify(state: Candidate, run: Preparation, isolation: Isolation, in_background: bool) -> None:
    """First call and verification (verifying.py; raises Mismatch), then, where memory is
    tight, the tournament. A reduced-precision candidate's gate waits for every candidate's
    first verdict (`JudgeLater`), except where memory is tight (it holds memory: judged at
    once). `in_background`: in the background thread, timed apart."""
    if in_background and run.memory_tight is not None:
        # Where memory is tight nothing runs beside the conversions: XLA compiles at its first
        # call, holding 3x the weights (beside the ONNX export's 4x: 5x); and a call reading
        # a variable while a conversion reads it too made TensorFlow copy it (a variable in
        # copy-on-read mode: the 2.46 GB recommender's table, read by tf-function's
        # verification while the export froze it), a copy its allocator kept to the end.
        run.converted.wait()
    stage = timed_in_background if in_background else timed_stage
    later = run.memory_tight is None  # a gate waits for every first verdict (judge_waiting)
    try:
        first_call_and_verify(state, run, isolation, stage)
        if not later and state.checked is not None:
            judged_now(state, run, isolation, stage)
    except Mismatch as exc:
        failed_gate(state, run, stage, exc)
    if later and state.checked is not None:
        raise JudgeLater
    keep(state, run)
