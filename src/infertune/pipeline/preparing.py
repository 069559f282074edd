"""Prepare and verify the candidates: in the order most likely to pay, within the time budget,
with the rehearsal child working while this process converts.

Each candidate goes through its stages (stages.py): conversion, rehearsal (for the native
runtimes, isolation.py), compile, first call, verification. A rehearsed candidate's rehearsal
is submitted to the child process as soon as its files exist; this process goes on with the
next candidate's conversion (an ONNX export, a TFLite conversion: the longest stages) and
compiles the rehearsed one here once the child has answered. Only a candidate whose rehearsal
survived is ever compiled in this process.

With a time budget, a candidate is started only when its estimated cost (planning.py) fits in
what is left after the measurement and the diagnosis have their share; one that does not is
`skipped`, and the report and the progress lines say how much it needed and how much was left.
A stage still running at the budget's end is abandoned (as at candidate_timeout_s) and the
candidate is `skipped`, said so.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..backends import Backend, litert
from ..backends.base import NotApplicable
from ..environment import usable_cores
from ..errors import one_line
from ..machine import MachineRecord
from ..measure import measure_interleaved
from ..options import Options
from ..progress import Progress
from ..report import CandidateResult
from ..resources import available_bytes, page_out_own_files, release_freed_memory
from ..settings import hold_all_bytes, memory_limit_bytes, tf_worker_mode
from ..target import Target
from ..verify import Comparison, compare_outputs
from .isolation import (
    CandidateCrashed,
    CandidateTimeout,
    Isolation,
    NotRehearsable,
    Rehearsal,
    RehearsalError,
    RehearsalUnavailable,
)
from .planning import (
    CONVERSION_STAGES,
    Probe,
    conversion_estimate_s,
    estimate_s,
    order_candidates,
    uninterruptible_s,
)
from .reference import Check
from .tf_worker import OFFLOADABLE, OffloadedConversion, custom_classes

__all__ = ["Budget", "checks_for", "prepare_all"]


def shared_stage(key: str) -> str:
    """A shared conversion's (Target key's) name as a stage of the report."""
    return CONVERSION_STAGES.get(key, f"conversion {key}")


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


@dataclass
class Budget:
    """optimize()'s time budget: its deadline (the model's own first call excluded) and what
    the work after the candidates needs (`after_s(contenders)`: measurement and diagnosis)."""

    time_budget_s: float | None
    deadline: float = math.inf
    after_s: Callable[[int], float] = lambda contenders: 0.0
    after_measurement_s: float = 0.0  # the diagnosis and the report, after the measurement

    @property
    def limited(self) -> bool:
        return self.time_budget_s is not None

    def left_s(self) -> float:
        return self.deadline - time.perf_counter()

    def candidates_end(self, contenders: int) -> float:
        """When the candidates' stages must be done, so that the measurement and the
        diagnosis of `contenders` candidates still fit before the deadline."""
        return self.deadline - self.after_s(contenders)


@dataclass
class _Candidate:
    """A candidate on its way through its stages."""

    backend: Backend
    result: CandidateResult
    stage: str = "conversion"
    deadline: float = math.inf  # of its current phase (candidate_timeout_s, the budget)
    rehearsal: Rehearsal | None = None
    future: Future | None = None  # what the background thread does for it
    seconds: dict[str, float] = field(default_factory=dict)  # its own, by stage
    estimate: tuple[float, str] | None = None
    holds_memory: bool = False  # admitted by memory: it counts against those after it
    dropped: bool = False  # verified, then closed before the measurement (large models)


@dataclass
class _Run:
    """What every candidate's preparation shares."""

    target: Target
    checks: list[Check]
    options: Options
    progress: Progress
    isolation: Isolation
    budget: Budget
    probe: Probe | None
    record: MachineRecord | None
    contenders: dict[str, Backend] = field(default_factory=dict)
    call_estimates: dict[str, float] = field(default_factory=dict)  # s per call, sample batch
    estimates: dict[str, float] = field(default_factory=dict)  # planned seconds, by name
    started: int = 0  # candidates started besides the reference
    memory_budget: int | None = None  # bytes the candidates may hold in all (None: unknown)
    # Where the model is large: the verified candidates that copy the weights still held
    # for the measurement.
    alive: list[_Candidate] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Set once this thread has made every conversion: a tournament waits for it, so that no
    # conversion competes for the cores with the candidates it times.
    converted: threading.Event = field(default_factory=threading.Event)
    states: list[_Candidate] = field(default_factory=list)  # every candidate but the reference

    @property
    def large(self) -> str | None:
        """Why the model counts as large here (_large_model, kept on the target for the
        measurement after this), None where it does not."""
        return self.target.large


def prepare_all(
    candidates: list[Backend],
    target: Target,
    checks: list[Check],
    results: list[CandidateResult],
    options: Options,
    progress: Progress,
    isolation: Isolation,
    budget: Budget,
    probe: Probe | None = None,
    record: MachineRecord | None = None,
) -> tuple[dict[str, Backend], dict[str, float], list[str]]:
    """Prepare and verify each candidate (the reference first, then the others in the planned
    order); `results` gets one entry per candidate, in the order given. Returns the verified
    candidates by name, their seconds per call on the sample seen in verification (for the
    measurement's warm-up), and the names in the order they were tried."""
    run = _Run(target, checks, options, progress, isolation, budget, probe, record)
    run.memory_budget = _memory_budget()
    states = []
    for backend in candidates:
        result = CandidateResult(name=backend.name, status="ok", precision=backend.precision)
        results.append(result)
        states.append(_Candidate(backend, result))
    reference, others = states[0], states[1:]
    # The model itself runs as the caller runs it, in this thread, with no deadline.
    if _admitted(reference, options) and _in_process(reference, run, Isolation("off", None)):
        run.contenders[reference.backend.name] = reference.backend
    target.large = _large_model(others, run)
    run.states = others
    isolation.start()  # the child's imports overlap the next candidate's conversion
    if probe is not None:
        by_backend = {id(s.backend): s for s in others}
        ordered = order_candidates([s.backend for s in others], probe, record)
        others = [by_backend[id(b)] for b in ordered]
    if not budget.limited and isolation.mode != "off":
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
    tried = [reference.backend.name]
    pending: list[_Candidate] = []
    # One background thread finishes each candidate after its part in this thread (its
    # conversion, or its trace): the wait for its rehearsal, its compile, first call and
    # verification; XLA's and the runtimes' compiles run in native code, without the GIL,
    # while this thread converts the next candidate. Not with isolation "off": everything
    # then runs in the caller's thread, one candidate after another.
    background = ThreadPoolExecutor(1, "infertune background") if isolation.mode != "off" else None
    if background is None:
        run.converted.set()
    try:
        _offload(others, run)
        for state in others:
            if not _admitted(state, options) or not _fits(state, run, pending):
                continue
            if _session_variant(state, run, others) or not _fits_memory(state, run, states):
                continue
            tried.append(state.backend.name)
            run.started += 1
            if background is None:
                if _in_process(state, run, isolation):
                    _contend(state, run)
            elif _start(state, run, background):
                pending.append(state)
        run.converted.set()
        for state in pending:
            _finish(state, run)
    finally:
        run.converted.set()
        if background is not None:
            background.shutdown(wait=False)  # every task was waited for, or abandoned
        target.close_offloaded()
        target.release_traced()  # every conversion that starts from it is made
    return run.contenders, run.call_estimates, tried


# A shared conversion expected to take at least this long goes to a worker process: its
# start (importing TensorFlow, loading the model: about 5 s on two cores) runs beside this
# process's work, and the conversion beside the ONNX export (tf_worker.py). Since the TFLite
# conversion stopped rebuilding its frozen function (3-4 s for ResNet50 128x128 alone), the
# worker costs more than it saves at that size: optimize() took 31.7 s with it (the worker
# busy 17 s, this process waiting 6.4 s for it) and 28.8 s without, on the quiet 2-core
# machine (benchmarks/tuning_time.py --models resnet50).
OFFLOAD_MIN_S = 15.0


def _free_core() -> str | None:
    """None where a core is free for a worker process, else why not. A worker adds work (its
    imports, the model saved and loaded again: 5-10 s of CPU for ResNet50) to save time only
    by running on a core nothing else uses: on a machine whose load average already fills
    its cores, it would slow this process down instead."""
    from ..environment import usable_cores

    try:
        load = os.getloadavg()[0]
    except OSError:  # not available on this platform: nothing says the cores are busy
        return None
    cores = usable_cores()
    if load <= cores - 1:
        return None
    return f"the load average {load:.1f} on {cores} cores leaves no core free for it"


def _offload(others: list[_Candidate], run: _Run) -> None:
    """Start a worker process for each shared conversion that is long enough and that a
    candidate to be tried needs, for a Keras model (saved for the worker as a .keras file)
    where child processes are in use and no time budget is given (the model's save would
    spend seconds before any candidate is known to fit)."""
    source = run.target.source
    mode = tf_worker_mode()  # INFERTUNE_TF_WORKER
    if run.isolation.mode != "process" or run.probe is None or not source.is_keras:
        return
    if mode == "never":
        return
    if run.budget.limited:  # saving the model costs seconds a LiteRT candidate may not get
        return
    for key in OFFLOADABLE:
        needed = any(
            key in s.backend.conversions
            and s.backend.precision in run.options.precisions
            and s.backend.available() is None
            for s in others
        )
        if not needed or key in run.target.built():
            continue
        if mode == "auto" and conversion_estimate_s(key, run.probe, run.record) < OFFLOAD_MIN_S:
            continue
        stage = shared_stage(key)
        busy = _free_core() if mode == "auto" else None
        if busy is None and mode == "auto" and run.large is not None:
            # The worker's TensorFlow (0.65 GB), its copy of the model and its conversion
            # (3-4x the weights) would all be held beside this process's ONNX export.
            busy = f"the model is large here ({run.large})"
        if busy is None:
            busy = _no_memory_for_worker(key, run)
        classes: list[tuple[str, str]] = []
        if busy is None:
            try:
                classes = custom_classes(source.owner)
            except ValueError as exc:  # the worker could not load the model
                busy = str(exc)
        if busy is not None:
            run.target.notes.append(f"the {stage} was made here, not in a worker process: {busy}")
            continue
        try:
            with run.progress.timed(
                f"{stage}: saving the model for a worker process",
                text=f"starting the {stage} in a worker process",
            ):
                run.target.offload(key, OffloadedConversion(key, run.target, classes))
        except Exception as exc:  # it is made here, as without a worker
            run.target.notes.append(f"no worker process for the {stage}: {one_line(exc)}")


# What a worker process holds beside the model's copy and its conversion: TensorFlow itself.
WORKER_BASE_BYTES = 1 << 30


def _no_memory_for_worker(key: str, run: _Run) -> str | None:
    """None where the memory left holds a worker (a second copy of the model and its
    conversion) while this process makes the ONNX export, else why not."""
    budget = run.memory_budget
    if budget is None:
        return None
    try:
        weights = run.target.weights_bytes()
    except Exception:  # the trace fails: the conversions will say why
        return None
    factor = 1.0 + CONVERSION_MEMORY.get(key, 1.0) + CONVERSION_MEMORY["onnx"]
    need = factor * weights + WORKER_BASE_BYTES
    if need <= budget:
        return None
    return (
        f"it would need about {need / 1e9:.1f} GB beside this process's ONNX export "
        f"(a second copy of the weights' {weights / 1e9:.2f} GB and its conversion); "
        f"{budget / 1e9:.1f} GB were free"
    )


# -- admission and the budget -------------------------------------------------------------
def _admitted(state: _Candidate, options: Options) -> bool:
    """Whether a candidate can go on to prepare; if not, its result says why.

    Availability comes before precision: a candidate that cannot run here is `unavailable`
    with its reason whatever the precision allowed, so that a `skipped` fp16 candidate means
    that allowing fp16 would let it run."""
    backend, result = state.backend, state.result
    reason = backend.available()
    if reason is not None:
        result.status, result.reason = "unavailable", reason
        return False
    if backend.callers_only and options.concurrency == 1:
        result.status = "skipped"
        result.reason = (
            "a variant for several callers at once: tried with optimize(concurrency=N), N > 1"
        )
        return False
    if backend.precision not in options.precisions:
        result.status = "skipped"
        result.reason = (
            f"{backend.precision} candidate; allow it with precision=(..., "
            f"{backend.precision!r}) where a reduced-precision error is acceptable"
        )
        return False
    return True


# A candidate starts only when its estimate times this fits: estimates made from one trace
# are off by 20-30% on a busy machine, and a candidate stopped at the budget's end has cost
# its time for nothing (its abandoned conversion even runs on beside the measurement). A
# conversion whose native step holds the GIL also needs room to overrun the budget's end by
# that step (planning.UNINTERRUPTIBLE): it cannot be abandoned before the step returns.
ESTIMATE_MARGIN = 1.3


def _fits(state: _Candidate, run: _Run, pending: list[_Candidate]) -> bool:
    """Under a time budget: whether the candidate's estimated cost fits in what is left once
    the candidates already started and the work after them have their share."""
    budget = run.budget
    if not budget.limited:
        return True
    name = state.backend.name
    if run.probe is None:  # nothing to estimate from: only the budget's end stops it
        if budget.left_s() > budget.after_s(len(run.contenders) + 1):
            return True
        return _skip(state, run, f"not reached within time_budget_s={budget.time_budget_s:g}")
    built = run.target.built() | {k for s in pending for k in s.backend.conversions}
    seconds, how = estimate_s(state.backend, run.probe, built, run.record)
    state.estimate = (seconds, how)
    run.estimates[name] = seconds
    owed = sum(run.estimates.get(s.backend.name, 0.0) for s in pending) * 0.3  # here, after
    after = budget.after_s(len(run.contenders) + len(pending) + 1)
    left = budget.left_s() - after - owed
    tail = uninterruptible_s(state.backend, run.probe, built, run.record)
    if seconds * ESTIMATE_MARGIN + tail <= left:
        return True
    unstoppable = f" and {tail:.1f} s its conversion cannot be stopped in" if tail else ""
    return _skip(
        state,
        run,
        f"needs about {seconds:.1f} s ({how}; {seconds * ESTIMATE_MARGIN + tail:.1f} s with "
        f"the margin for estimates{unstoppable}); {max(0.0, left):.1f} s of time_budget_s="
        f"{budget.time_budget_s:g} were left for it (the measurement and the diagnosis keep "
        f"{after:.1f} s)",
    )


# Transient copies of the weights a shared conversion makes while it runs, beyond the model:
# the frozen GraphDef, tf2onnx's graph, the ModelProto and its bytes; the converter's MLIR
# module and its flatbuffer.
# (the process's high-water mark above the model, BERT-base-sized, each conversion alone:
# ONNX export 4.1x; TFLite conversion 5.4x through a SavedModel, the path past 256 MB, and
# 9.8x from the concrete function, the path below it, where a sampled peak had said 3.3x)
# A TFLite conversion in a child process of its own (memory_key; one glibc arena, no oneDNN
# pool): its VmHWM, 3.3x the 2.46 GB recommender's weights and the child's TensorFlow
# (0.65 GB), 3.6x in all; 4x covers 1 GiB of weights.
CONVERSION_MEMORY = {
    "onnx": 4.0,
    "onnx-int8": 1.0,
    "tflite": 5.5,
    "tflite-fixed": 5.5,
    "tflite-child": 4.0,
    "tflite-fixed-child": 4.0,
}
# What the rest of optimize() needs beside the candidates: verification and measurement
# inputs and outputs, the runtimes' own code and arenas.
MEMORY_RESERVE = 1 << 30


def _memory_budget() -> int | None:
    """Bytes the candidates may hold in all: what the machine has free now (Linux's
    MemAvailable; at most INFERTUNE_MEMORY_BYTES), less MEMORY_RESERVE; None where neither
    is known."""
    free = available_bytes()
    limit = memory_limit_bytes()  # INFERTUNE_MEMORY_BYTES
    if limit is not None:
        free = limit if free is None else min(free, limit)
    return None if free is None else max(0, free - MEMORY_RESERVE)


def memory_key(key: str, weights: int) -> str:
    """The name the conversion `key`'s memory is learned and estimated under: a TFLite
    conversion past CHILD_CONVERSION_MIN_BYTES runs in a child process, whose peak says
    nothing of one in this process, nor the other way round (learned as one, a BERT-base-
    sized model's 4.2x in this process had a 2.46 GB recommender's LiteRT skipped for 14 GB
    it would not have needed)."""
    if key in ("tflite", "tflite-fixed") and litert.converts_in_child(weights):
        return f"{key}-child"
    return key


def conversion_memory_learned(target: Target) -> dict[str, float]:
    """This run's conversions' peaks in copies of the weights, under memory_key's names."""
    weights = target.weights_measured or 0
    return {memory_key(key, weights): f for key, f in target.memory_factors().items()}


def _conversion_memory(key: str, record: MachineRecord | None, weights: int) -> float:
    """Copies of the weights the conversion `key` holds at its peak: as measured by earlier
    runs on this machine (large models), else CONVERSION_MEMORY."""
    key = memory_key(key, weights)
    learned = record.memory_factor(key) if record is not None else None
    return learned if learned is not None else CONVERSION_MEMORY.get(key, 1.0)


def _fits_memory(state: _Candidate, run: _Run, states: list[_Candidate]) -> bool:
    """Whether the candidate, its conversions not built yet, and its rehearsal (the child
    holds it once more while this process holds the others) fit in the memory left once the
    candidates admitted before it hold theirs; if not, it is `skipped` with the estimate,
    never left to be killed for memory. Estimates are the weights times each runtime's
    `memory_factor` and each conversion's CONVERSION_MEMORY (measured on a BERT-base-sized
    model)."""
    budget, target = run.memory_budget, run.target
    if budget is None or target.source is None:
        return True
    try:
        weights = target.weights_bytes()
    except Exception:  # the trace fails: the candidate's own stages will say why
        return True
    backend = state.backend
    holding = sorted(
        (
            s.backend.memory_factor * weights
            for s in states
            if s is not state and s.result.status == "ok" and s.holds_memory
        ),
        reverse=True,
    )
    # A large model's candidates are held KEEP_AT_ONCE at a time after verification (_keep).
    held = sum(holding[:KEEP_AT_ONCE] if run.large else holding)
    own = backend.memory_factor * weights
    conversions = [k for k in backend.conversions if k not in target.built()]
    compiling = backend.compile_memory_factor * weights
    converting = sum(_conversion_memory(k, run.record, weights) for k in conversions) * weights
    transient = max([converting, compiling] + ([own] if run.isolation.rehearses(backend) else []))
    need = held + own + transient
    if run.large:
        # No session or XLA compile in this process while a large model's conversions run
        # (only one candidate, in the rehearsal child, may hold its copy meanwhile); after
        # them, the one kept, this one, and its compile.
        need = max(converting + (holding[0] if holding else 0.0), held + own + compiling)
    if need <= budget:
        state.holds_memory = True  # from here on its memory counts for those after it
        return True
    parts = [f"{backend.memory_factor:g}x the weights' {weights / 1e9:.2f} GB for its runtime"]
    if conversions:
        during = f"while the {', '.join(conversions)} conversion runs"
        parts.append(f"{transient / weights:.1f}x {during}")
    elif transient == compiling and compiling:
        parts.append(f"{backend.compile_memory_factor:g}x more while it compiles")
    elif transient:
        parts.append("once more while it is rehearsed in the child process")
    if held or (run.large and holding):
        parts.append("what the candidates before it hold beside it")
    return _skip(
        state,
        run,
        f"needs about {need / 1e9:.1f} GB of memory at its peak ({'; '.join(parts)}); "
        f"the candidates may have {budget / 1e9:.1f} GB of what was free when tuning began",
    )


# -- large models: fewer copies of the weights held at once --------------------------------
# Where holding every verified candidate that copies the weights would pass
# INFERTUNE_HOLD_ALL_BYTES (2 GiB: a BERT-base-sized model's eleven candidates held 5.2 GB
# at the end of verification), at most this many of them stay for the measurement: each one
# verified is timed against the one kept (champion and challenger) and the slower is closed
# at once. BERT-base-sized, one run each: 3 kept peaked at 8.3x the weights, 1 at 6.5x.
KEEP_AT_ONCE = 1
# ... and one whose verification calls were more than this much slower than the fastest such
# candidate's is closed at once (the measurement's own race drops a candidate 1.5x behind).
CLEARLY_SLOWER = 1.5


def _large_model(others: list[_Candidate], run: _Run) -> str | None:
    """Why the model counts as large here (the candidates that copy its weights would hold
    more than INFERTUNE_HOLD_ALL_BYTES at once), or None."""
    if run.target.source is None:
        return None
    try:
        weights = run.target.weights_bytes()
    except Exception:  # the trace fails: the candidates' own stages will say why
        return None
    options = run.options
    holders = [
        s.backend
        for s in others
        if s.backend.memory_factor > 0
        and s.backend.precision in options.precisions
        and not (s.backend.callers_only and options.concurrency == 1)
        and s.backend.available() is None
    ]
    held = sum(b.memory_factor for b in holders) * weights
    limit = hold_all_bytes()
    if held <= limit:
        return None
    return (
        f"the {len(holders)} candidates that copy the weights' {weights / 1e9:.2f} GB would "
        f"hold about {held / 1e9:.1f} GB at once, past {limit / 1e9:.1f} GB"
    )


def _session_variant(state: _Candidate, run: _Run, others: list[_Candidate]) -> bool:
    """On a large model, skip a candidate that differs from another one tried only in a
    session option (Backend.session_variant) or, for one caller, in running on fewer threads
    than the cores (Backend.threads_variant): each one holds its own copy of the weights."""
    backend = state.backend
    threads = backend.threads_variant if run.options.concurrency == 1 else None
    if run.large is None or (backend.session_variant is None and threads is None):
        return False
    base = next(
        (
            s.backend.name
            for s in others
            if type(s.backend) is type(backend)
            and s.backend.session_variant is None
            and s.backend.threads_variant is None
        ),
        None,
    )
    if base is None:
        return False
    if threads is not None:
        why = (
            f"it differs from {base} only in running on {threads} thread(s) of "
            f"{usable_cores()}, which one caller on a model this large seldom gains from"
        )
    else:
        why = f"it differs from {base} only in a session option ({backend.session_variant})"
    _skip(
        state,
        run,
        f"not tried on a model this large: {why}, and would hold its own copy of the "
        f"weights ({run.large})",
    )
    return True


def _call_s(state: _Candidate, run: _Run) -> float:
    """Seconds per call on the sample in its verification (its first call where no other)."""
    known = run.call_estimates.get(state.backend.name)
    if known is not None:
        return known
    return (state.result.first_call_ms or 1e3) / 1e3


def _keep(state: _Candidate, run: _Run) -> None:
    """On a large model, after a candidate that copies the weights is verified: while more
    than KEEP_AT_ONCE such candidates are held, they are timed against each other in a few
    interleaved rounds on the sample (a tournament: verification's own call times, taken
    beside a conversion, put OpenVINO 1.5x behind where it was the fastest); the slowest, and
    any CLEARLY_SLOWER than the fastest, are closed at once (`skipped`, with their times)."""
    if run.large is None or state.backend.memory_factor <= 0:
        return
    with run.lock:
        run.alive.append(state)
        if len(run.alive) <= KEEP_AT_ONCE:
            return
    # Multi-threaded sessions lost 1.9x to single-threaded ones timed beside a conversion
    # (ONNX Runtime 246 ms, 115-129 ms alone): the tournament waits for the conversions to
    # be done. This background thread compiles nothing meanwhile, so no more is held.
    run.converted.wait()
    # ... and for the rehearsals in the child: beside one, ONNX Runtime's default session
    # (two threads) lost 2.2x where it was as fast as OpenVINO alone.
    _rehearsals_done(run)
    with run.lock:
        sample = run.checks[0].inputs
        runners = {s.backend.name: (lambda b=s.backend: b.run(sample)) for s in run.alive}
        measured = measure_interleaved(
            runners,
            budget_s=TOURNAMENT_S,
            min_rounds=3,
            per_call_estimate_s={s.backend.name: _call_s(s, run) for s in run.alive},
            cooldown_s={s.backend.name: s.backend.cooldown_s for s in run.alive},
        )
        run.progress.times.add_background(state.backend.name, measured.seconds, "tournament")
        p50 = {name: stats.p50 for name, stats in measured.stats.items()}
        ranked = sorted((s for s in run.alive if s.backend.name in p50),
                        key=lambda s: p50[s.backend.name])  # fmt: skip
        best = ranked[0].backend.name if ranked else None
        kept = [
            s for s in ranked[:KEEP_AT_ONCE] if p50[s.backend.name] <= CLEARLY_SLOWER * p50[best]
        ]
        for out in run.alive:
            if out not in kept:
                _drop(out, run, p50, best, measured.errors.get(out.backend.name))
        run.alive = kept


# Seconds of the tournament's interleaved rounds (at least 3 rounds).
TOURNAMENT_S = 2.0


def _rehearsals_done(run: _Run) -> None:
    """Wait for every rehearsal submitted to the child to be done (not with a time budget:
    each candidate's own wait is bounded by it)."""
    if run.budget.limited:
        return
    for other in run.states:
        if other.rehearsal is not None:
            with contextlib.suppress(Exception):  # its own wait says what went wrong
                other.rehearsal.wait(math.inf)


def _drop(
    state: _Candidate, run: _Run, p50: dict[str, float], best: str | None, error: str | None
) -> None:
    """Close a verified candidate that lost the tournament (or failed in it)."""
    state.dropped = True
    name, result = state.backend.name, state.result
    run.contenders.pop(name, None)
    verified = f"verified (relative error {result.max_rel_err or 0.0:.1e})"
    if error is not None or best is None:
        result.status = "failed"
        result.reason = f"{verified}, then failed while timed against the others: {error}"
    else:
        ratio = p50[name] / p50[best]
        kept = "the fastest is" if KEEP_AT_ONCE == 1 else f"the {KEEP_AT_ONCE} fastest are"
        rule = (
            f"more than {CLEARLY_SLOWER:g}x"
            if ratio > CLEARLY_SLOWER
            else f"only {kept} kept of those that copy the weights"
        )
        result.status = "skipped"
        result.reason = (
            f"{verified}, then closed before the measurement to hold memory: timed against "
            f"the others held, p50 {p50[name]:.1f} ms against {best}'s {p50[best]:.1f} ms "
            f"({ratio:.2f}x; {rule}); {run.large}"
        )
    run.progress.say(f"{name}: closed, {result.reason}")
    with contextlib.suppress(Exception):  # what it held goes when it is collected
        state.backend.close()
    # Its runtime's buffers go back to the heap, where glibc keeps them unless asked.
    release_freed_memory()


def _skip(state: _Candidate, run: _Run, reason: str) -> bool:
    state.result.status, state.result.reason = "skipped", reason
    run.progress.say(f"{state.backend.name}: skipped, {reason}")
    return False


def _deadline(run: _Run, isolation: Isolation) -> float:
    """The deadline of a phase that starts now: candidate_timeout_s's, or the budget's end
    where sooner (stages in a worker thread can be abandoned; with isolation 'off', none)."""
    deadline = isolation.deadline()
    if run.budget.limited and isolation.mode != "off":
        deadline = min(deadline, run.budget.candidates_end(_contenders(run)))
    return deadline


def _contenders(run: _Run) -> int:
    """How many candidates the measurement will have, at most, as far as is known now."""
    return run.started + 1  # the reference among them


# -- the stages ---------------------------------------------------------------------------
def _stage(
    state: _Candidate, run: _Run, stage: str, text: str, fn: Callable[[], Any], track: bool = True
) -> Any:
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
            run.progress.times.add(shared_stage(key), seconds)
        own = end - start - sum(shared.values())
        run.progress.times.add(stage, own, state.backend.name)
        if track:
            state.seconds[stage] = state.seconds.get(stage, 0.0) + own


def _in_process(state: _Candidate, run: _Run, isolation: Isolation) -> bool:
    """Prepare, first call and verify a candidate that is not rehearsed."""
    state.deadline = _deadline(run, isolation)
    return _guarded(state, run, lambda: _compile_and_verify(state, run, isolation))


def _start(state: _Candidate, run: _Run, background: ThreadPoolExecutor) -> bool:
    """This thread's part of a candidate: its conversion and the submission of its rehearsal
    (a rehearsed one), or its compile (a trace, in Python: best here); the rest goes to the
    background thread. False if it failed already."""
    backend, isolation = state.backend, run.isolation
    name = backend.name
    state.deadline = _deadline(run, isolation)
    rehearsed = isolation.rehearses(backend)

    def start() -> None:
        if not rehearsed:
            _compile(state, run, isolation, _stage)
            state.future = background.submit(_first_call_and_verify, state, run, isolation, True)
            return
        started = time.perf_counter()
        _stage(
            state,
            run,
            "conversion",
            f"{name}: converting",
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
                *backend.rehearsal(run.target, [c.inputs for c in checks]), allowed, name
            )
        except RehearsalUnavailable as exc:
            isolation.fall_back(str(exc))
        state.future = background.submit(_after_rehearsal, state, run)

    return _guarded(state, run, start)


def _after_rehearsal(state: _Candidate, run: _Run) -> None:
    """In the background thread: wait for the rehearsal's verdict, then compile, first call
    and verify here (raises on failure)."""
    isolation = run.isolation
    if state.rehearsal is not None:
        give_up = run.budget.candidates_end(_contenders(run)) if run.budget.limited else math.inf
        if not _wait(state.rehearsal, give_up):
            raise _BudgetOver("during its rehearsal in the child process")
    if run.large is not None and state.backend.memory_factor > 0:
        # A large model's conversions hold 2-4.6x its weights each: a session compiled here
        # meanwhile adds its copy to that peak, so it waits for them (its rehearsal went on);
        # and for the rehearsals in the child, which hold a copy each (2.42 GB MLP: LiteRT
        # rehearsed while OpenVINO compiled here took the peak from 3.2x to 6.0x).
        run.converted.wait()
        _rehearsals_done(run)
    if run.budget.limited and run.budget.left_s() <= run.budget.after_s(1):
        raise _BudgetOver("before its compile here")
    state.deadline = _deadline(run, isolation)  # compiling here gets the full time again
    _compile(state, run, isolation, _background_stage)
    _first_call_and_verify(state, run, isolation, True)


def _finish(state: _Candidate, run: _Run) -> None:
    """Wait for what the background thread does for a candidate (its verdict)."""
    name = state.backend.name
    give_up = run.budget.candidates_end(_contenders(run)) if run.budget.limited else None

    def wait() -> None:
        try:
            _stage(state, run, "waiting", f"{name}: waiting for its compile and verification",
                   lambda: state.future.result(_timeout(give_up)), track=False)  # fmt: skip
        except FuturesTimeout:
            raise _BudgetOver(f"during its {state.stage}") from None

    if state.future is None or _guarded(state, run, wait):
        _contend(state, run)


def _contend(state: _Candidate, run: _Run) -> None:
    """A verified candidate joins the measurement, unless it was closed meanwhile (_keep)."""
    with run.lock:
        if not state.dropped:
            run.contenders[state.backend.name] = state.backend


def _wait(rehearsal: Rehearsal, give_up_at: float) -> bool:
    """The rehearsal's verdict (raised where it failed); False if not in by `give_up_at`.
    A child that cannot start, or cannot import the class, leaves the candidate to be
    prepared here without a rehearsal (said in the notes)."""
    isolation = rehearsal._isolation
    try:
        return rehearsal.wait(give_up_at)
    except RehearsalUnavailable as exc:
        isolation.fall_back(str(exc))
    except NotRehearsable as exc:
        isolation.notes.append(f"{rehearsal.name}: prepared without a rehearsal ({exc})")
    return True


def _compile_and_verify(state: _Candidate, run: _Run, isolation: Isolation) -> None:
    """Compile here, time the first call, verify on every check (raises on failure)."""
    _compile(state, run, isolation, _stage)
    _first_call_and_verify(state, run, isolation)


def _compile(state: _Candidate, run: _Run, isolation: Isolation, stage: Callable) -> None:
    """prepare() in this process, timed by `stage` (this thread's or the background's)."""
    backend, target, result = state.backend, run.target, state.result
    name, deadline = backend.name, state.deadline
    used_before = len(target.used)
    stage(
        state,
        run,
        "compile",
        f"{name}: preparing",
        lambda: isolation.call(lambda: backend.prepare(target), deadline, "prepare"),
    )
    if run.large is not None:
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


def _first_call_and_verify(
    state: _Candidate, run: _Run, isolation: Isolation, in_background: bool = False
) -> None:
    """Time the first call, verify on every check (raises _Mismatch on a mismatch).
    `in_background`: in the background thread, its stages are timed apart (off this
    thread's timeline) and it shows nothing as the current stage."""
    backend, result = state.backend, state.result
    name, deadline = backend.name, state.deadline
    stage = _background_stage if in_background else _stage
    checks = checks_for(backend, run.checks)
    if in_background and run.large is not None:
        # On a large model nothing runs beside the conversions: XLA compiles at its first
        # call, holding 3x the weights (beside the ONNX export's 4x: 5x); and a call reading
        # a variable while a conversion reads it too made TensorFlow copy it (a variable in
        # copy-on-read mode: the 2.46 GB recommender's table, read by tf-function's
        # verification while the export froze it), a copy its allocator kept to the end.
        run.converted.wait()
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
            found = compare_outputs(
                found_outputs, check.reference, run.options.rtol, run.options.atol
            )
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
        raise _Mismatch(comparison.reason)
    only = ""
    if len(checks) < len(run.checks):
        only = (
            f", on the {len(checks)} inputs at the sample's shapes: it runs only those "
            f"({backend.exact_reason})"
        )
    run.progress.say(f"{name}: verified (relative error {comparison.max_rel_err:.1e}{only})")
    _keep(state, run)


def _background_stage(
    state: _Candidate, run: _Run, stage: str, text: str, fn: Callable[[], Any]
) -> Any:
    """fn() as `stage` of the candidate in the background thread: timed apart."""
    state.stage = stage
    start = time.perf_counter()
    try:
        return fn()
    finally:
        seconds = time.perf_counter() - start
        run.progress.times.add_background(state.backend.name, seconds, stage)
        state.seconds[stage] = state.seconds.get(stage, 0.0) + seconds


def _timeout(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.perf_counter())


class _Mismatch(Exception):
    """Verification rejected the candidate (its result already holds the errors)."""


class _BudgetOver(Exception):
    """The time budget ran out during (or before) a stage: the candidate is skipped."""


def _guarded(state: _Candidate, run: _Run, fn: Callable[[], None]) -> bool:
    """Run a candidate's stages; True if they all passed. A failure is its result's status
    and reason, never raised; a candidate that failed is closed, one timed out is not (a
    stage abandoned in a thread may still be using it)."""
    name, result, progress = state.backend.name, state.result, run.progress
    try:
        fn()
        return True
    except _Mismatch as exc:
        result.status, result.reason = "mismatch", str(exc)
        progress.say(f"{name}: rejected, {result.reason}")
    except NotApplicable as exc:
        result.status, result.reason = "skipped", f"not applicable: {exc}"
        progress.say(f"{name}: skipped, {result.reason}")
    except _BudgetOver as exc:
        result.status = "skipped"
        result.reason = f"time_budget_s={run.budget.time_budget_s:g} ran out {exc}"
        progress.say(f"{name}: skipped, {result.reason}")
    except CandidateTimeout as exc:
        if run.budget.limited and time.perf_counter() >= run.budget.candidates_end(
            _contenders(run)
        ):
            result.status = "skipped"
            result.reason = (
                f"time_budget_s={run.budget.time_budget_s:g} ran out during its {state.stage} "
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
