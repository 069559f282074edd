"""The contest between the candidates, on a frame (frame.py), whichever way it was made:

prepare and verify (preparing.py) -> measure (measuring.py) -> choose (selection.py) ->
release the losers -> diagnose (diagnosis.py) -> the report

optimize() on a model, tuning from a package and the package's own making all run their
candidates here, so that each report has the same parts: the candidates, the choice and why,
the memory, the stages, the diagnosis and the notes.
"""

from __future__ import annotations

import dataclasses

from ..errors import ModelError
from ..export.registry import stage_name
from ..model.target import Target
from ..model.tolerance import ELEMENT_RULE
from ..options import REFERENCE_NAMES, Options
from ..report import CandidateResult, Report, memory_line
from ..report.progress import Progress
from ..report.stages import StageTimes
from ..result.choice import Choice
from ..system.environment import collect_environment, fingerprint, usable_cores
from ..system.resources import MemoryPeak, allocators_note
from .budget import Budget
from .context import Preparation
from .diagnosis import diagnose
from .frame import Frame, predicted_by_note
from .isolation import Isolation
from .machine import MachineRecord
from .measuring import (
    HEAD_TO_HEAD_S,
    close_quietly,
    concurrency_note,
    head_to_head,
    measure_batches,
)
from .memory import conversion_memory_learned
from .planning import Probe, after_candidates_s, learn_from_run
from .preparing import Prepared, prepare_all
from .reference import Check
from .selection import (
    Forced,
    Selection,
    choose,
    forced_choice,
    other_thread_setting,
    settled,
)
from .traffic_plan import MEASURED, plan_buckets, tournament_requests, traffic_words

__all__ = ["contest"]

# What optimize() does after the report: releasing the run's freed memory to the OS (a full
# garbage collection: 0.3-0.4 s after ResNet50's candidates on two cores).
_FINISH_S = 0.5


def contest(
    frame: Frame, options: Options, progress: Progress, forced: Forced | None = None
) -> tuple[Choice, Report]:
    """Every candidate of the frame prepared, verified, measured; the choice and its report,
    with the peak memory of this process and its children while it ran. `forced`: the
    choice given instead of measured (selection.Forced)."""
    memory = MemoryPeak().start()
    try:
        choice, report = _contest(frame, options, progress, memory, forced)
    finally:
        memory.stop()
    if report.memory is not None:
        report.memory["peak_bytes"] = memory.peak
    return choice, report


def _contest(
    frame: Frame, options: Options, progress: Progress, memory: MemoryPeak, forced: Forced | None
) -> tuple[Choice, Report]:
    target, signature = frame.target, frame.signature
    with progress.timed("environment"):
        environment = collect_environment()
    # A package's probe was made on another machine: nothing is learned from it here.
    record = MachineRecord(fingerprint(environment)) if frame.has_model else None
    planned = dataclasses.replace(
        frame.probe, peak_gflops=record.peak_gflops if record is not None else None
    )
    budget = _budget(options, frame.first_call_s, planned, record)
    isolation = Isolation(options.isolation, options.candidate_timeout_s)
    run = Preparation(target, frame.checks, options, progress, isolation, budget, planned, record)
    run.precision = frame.precision
    if frame.traffic is not None:
        run.tournament_requests = tournament_requests(frame.traffic, frame.signature)
        if not frame.traffic.lengths and frame.batch_sizes:  # served by batch size alone
            run.deferred_batches = frozenset(frame.batch_sizes) - {frame.signature.sample_batch}
    isolation.exclusive = run.exclusive
    try:
        prepared = prepare_all(frame.candidates, run)
    finally:
        isolation.close()
    results, contenders = prepared.results, prepared.contenders
    _background_times(progress.times, isolation, target)
    if frame.has_model:
        results[0].first_call_ms = 1e3 * frame.first_call_s  # the model's own, on the sample
        _check_own_call(results[0], options.reference)
    elif not contenders:
        raise ModelError(
            "No candidate could run from the package here: "
            + "; ".join(f"{r.name}: {r.status} ({r.reason})" for r in results[1:] if r.reason)
        )
    precision_notes = _precision_notes(frame, results)
    kinds = [(type(b), b.name) for b in frame.candidates]
    frame.candidates.clear()  # a rejected candidate is referenced by nobody

    selection = _selection(frame, options, results, contenders, prepared, run, forced)
    choice = selection.choice
    traffic = None
    if frame.traffic is not None and forced is None:
        traffic = plan_buckets(
            frame.traffic, signature, results, contenders, choice.general.name, options.rtol,
            options.atol, progress, run.exclusive, target.weights_measured, run.memory_budget,
        )  # fmt: skip
        choice.buckets = traffic.buckets
        progress.say(traffic_words(traffic))
    under_load = concurrency_note(
        choice.general.name, results, contenders, frame.sample, signature.sample_batch or 1,
        options, progress, memory_tight=target.memory_tight is not None,
        exclusive=run.exclusive,
    )  # fmt: skip
    _release_losers(choice, contenders)
    selected = choice.selected.name
    diagnosis = None  # rates of the measured paths: none where the choice was forced
    if forced is None:
        progress.stage("diagnosis: the machine's peak")
        diagnosis = diagnose(
            frame.source, signature, frame.sample, results, selected, environment,
            flops=(planned.flops, planned.flops_note), record=record, timed=progress.timed,
            description=frame.description,
        )  # fmt: skip
    times = progress.times
    times.total_s = progress.elapsed()
    if record is not None and forced is None:
        statuses = {r.name: r.status for r in results}
        learned = conversion_memory_learned(target)
        learn_from_run(record, planned, kinds, statuses, times, selected, learned)
    notes = (
        frame.notes
        + _verification_notes(frame, results)
        + precision_notes
        + target.notes
        + _plan_notes(options, prepared.tried, results)
        + isolation.notes
        + _concurrency_notes(options, under_load)
        + [note for note in [run.exclusive.note()] if note]
        + ([traffic_words(traffic)] if traffic is not None else [])
    )
    if frame.traced_differs and options.reference == "eager" and selected in REFERENCE_NAMES:
        selection.reason += (
            "; every compiled candidate computes the model's traced graph, which differs "
            "from model(x) (see the first note: reference='traced' verifies against it)"
        )
    report = _report(frame, options, results, environment, selection, notes, diagnosis, times)
    report.memory = _memory(memory, target, progress)
    report.traffic = traffic.summary if traffic is not None else None
    tip = allocators_note() if report.memory is not None and target.memory_tight else None
    if tip is not None:
        report.notes.append(tip)
    _say_choice(report, selection, progress, times)
    return choice, report


def _selection(
    frame: Frame,
    options: Options,
    results: list[CandidateResult],
    contenders: dict,
    prepared: Prepared,
    run: Preparation,
    forced: Forced | None,
) -> Selection:
    """The choice at the sample's shape (and at each tuned batch size): measured, chosen and
    settled head to head between one thread and several; or `forced`, not measured."""
    signature = frame.signature
    if forced is not None:
        return forced_choice(forced, results, contenders, signature, frame.outputs)
    # With traffic=, the other batch sizes time the fastest few, as the traffic's lengths do.
    fastest = MEASURED if frame.traffic is not None else None
    by_batch = measure_batches(
        contenders, frame.sample, results, signature, frame.batch_sizes, options, run.progress,
        run.budget, prepared.call_estimates, run.exclusive, fastest, prepared.deferred_checks,
    )  # fmt: skip
    selection = choose(
        results, contenders, by_batch, options, signature, frame.outputs, frame.batch_sizes
    )
    return _settle_threads(selection, results, contenders, frame, options, run)


def _settle_threads(
    selection: Selection,
    results: list[CandidateResult],
    contenders: dict,
    frame: Frame,
    options: Options,
    run: Preparation,
) -> Selection:
    """A choice on one thread against the best candidate on several (or the other way round):
    the two timed again, head to head, and the faster kept (measuring.py `head_to_head`).
    Not where the choice has an exact-shape path, on one core, or where the time budget has
    no seconds left for it."""
    choice = selection.choice
    if choice.exact_shape is not None or usable_cores() < 2:
        return selection
    budget = run.budget
    if budget.limited and budget.left_s() <= budget.after_measurement_s + HEAD_TO_HEAD_S:
        return selection
    chosen = next(r for r in results if r.name == choice.general.name)
    other = other_thread_setting(chosen.name, results, contenders)
    if other is None or chosen.latency is None:
        return selection
    settled_by = head_to_head(
        chosen, other, contenders, frame.sample, options, run.progress, run.exclusive
    )
    if settled_by is None:
        return selection
    winner, why = settled_by
    return settled(selection, results, contenders, winner, why, frame.signature.sample_batch)


def _background_times(times: StageTimes, isolation: Isolation, target: Target) -> None:
    """The work done off this thread's clock: rehearsals in the child process, conversions
    in a worker process."""
    for name, seconds in isolation.child_seconds.items():
        times.add_background(name, seconds, "rehearsal in the child process")
    for key, seconds in target.conversions.offloaded_seconds.items():
        times.add_background("(shared)", seconds, f"{stage_name(key)} in a worker process")


def _release_losers(choice: Choice, contenders: dict) -> None:
    """Close every measured candidate the choice does not keep."""
    kept = {id(backend) for backend in choice.backends}
    for backend in contenders.values():
        if id(backend) not in kept:
            close_quietly(backend)
    contenders.clear()


def _say_choice(
    report: Report, selection: Selection, progress: Progress, times: StageTimes
) -> None:
    choice = selection.choice
    progress.say(f"selected {choice.selected.name}: {report.selection_reason}")
    if choice.exact_shape:
        progress.say(f"every other shape: {choice.general.name}: {selection.general_reason}")
    for line in report.batch_summary():
        progress.say(line)
    progress.say(times.summary().replace("\n  ", "; "))


def _check_own_call(result: CandidateResult, reference: str) -> None:
    """The model's own call must reproduce the reference: with reference="eager" it is the
    reference (a model that does not reproduce it cannot be verified); with "traced" it is a
    candidate like any other, its mismatch said as such."""
    if result.status == "mismatch" and reference == "traced":
        result.reason = (
            f"model(x) is not the reference (reference='traced'), and differs from the traced "
            f"graph: {result.reason}"
        )
    if result.status != "ok" and reference == "eager":
        raise ModelError(
            f"The model does not reproduce its own outputs on the same input "
            f"({result.reason}); a model with randomness at inference (for a Keras model: "
            f"under model(x, training=False), how it is called) cannot be verified."
        )


def _precision_notes(frame: Frame, results: list[CandidateResult]) -> list[str]:
    """How each reduced-precision candidate was made, and by what the model's predictions on
    the labelled data were made."""
    notes = [
        f"{result.name}: {result.quantization or backend.precision_note}"
        for backend, result in zip(frame.candidates, results)
        if (result.quantization or backend.precision_note)
        and result.status not in ("skipped", "unavailable")
    ]
    notes += predicted_by_note(frame.precision)
    if frame.precision is not None and any(r.gate for r in results):
        notes.append(frame.precision.rule)
    return notes


def _memory(memory: MemoryPeak, target: Target, progress: Progress) -> dict | None:
    """The report's memory: what the process held before tuning, its peak with its children,
    and the weights; None where it cannot be read here."""
    if memory.before is None:
        return None
    memory.sample()
    held = {
        "before_bytes": memory.before,
        "peak_bytes": memory.peak,
        "weights_bytes": target.weights_measured,
        # Each conversion's own peak above what this process held when it began (large
        # models), by the report's stage name.
        "conversions_bytes": {stage_name(k): v for k, v in target.conversions.memory_peaks.items()},
    }
    progress.say(memory_line(held))
    return held


def _report(
    frame: Frame,
    options: Options,
    results: list[CandidateResult],
    environment: dict,
    selection: Selection,
    notes: list[str],
    diagnosis,
    times: StageTimes,
) -> Report:
    """The report of the run: every candidate, the choice and why, the notes, the stages."""
    choice = selection.choice
    return Report(
        model=frame.description,
        signature=frame.signature.describe(),
        batch_size=frame.signature.sample_batch,
        objective=options.objective,
        rtol=options.rtol,
        atol=options.atol,
        candidates=results,
        environment=environment,
        selected=choice.selected.name,
        selection_reason=selection.reason,
        total_s=times.total_s,
        notes=notes,
        diagnosis=diagnosis,
        batches=selection.batches,
        latency_budget_ms=options.latency_budget_ms,
        stages=times,
        general_backend=choice.general.name if choice.exact_shape else None,
        general_reason=selection.general_reason,
    )


def _budget(
    options: Options, first_call_s: float, planned: Probe, record: MachineRecord | None
) -> Budget:
    """The time budget: time_budget_s from optimize()'s start plus the model's own first call
    (which no candidate can save), and what the work after the candidates needs."""
    if options.time_budget_s is None:
        return Budget(None)
    peak = planned.peak_gflops
    return Budget(
        options.time_budget_s,
        options.deadline + first_call_s,
        lambda contenders: after_candidates_s(planned, contenders, peak is not None, peak),
        after_measurement_s=(0.0 if peak is not None else 1.5) + 0.5 + _FINISH_S,
    )


def _plan_notes(options: Options, tried: list[str], results: list[CandidateResult]) -> list[str]:
    """With a time budget: the order candidates were tried in, and how many were skipped."""
    if options.time_budget_s is None:
        return []
    skipped = [r.name for r in results if r.status == "skipped" and "time_budget_s" in r.reason]
    note = (
        f"time_budget_s={options.time_budget_s:g}: candidates tried most promising first "
        f"({', '.join(tried)})"
    )
    if skipped:
        note += f"; skipped for the budget: {', '.join(skipped)} (each says why)"
    return [note]


def _concurrency_notes(options: Options, under_load: str | None) -> list[str]:
    """How the candidates were measured where several callers were asked for; with one, what
    the choice would lose under several, where that is worth saying."""
    if options.concurrency > 1:
        return [
            f"measured under {options.concurrency} concurrent callers (concurrency="
            f"{options.concurrency}): latency is per call under that load, samples/s in total"
        ]
    return [under_load] if under_load else []


def _verification_notes(frame: Frame, results: list[CandidateResult]) -> list[str]:
    """What every candidate was verified on and by what rule, which candidates run only the
    sample's exact shapes, and what the ONNX export took."""
    checks: list[Check] = frame.checks
    notes = [
        f"verified on {len(checks)} inputs: " + ", ".join(c.label for c in checks),
        f"an element fails when {ELEMENT_RULE}; an output fails when ||out-ref||/||ref|| > rtol",
    ]
    exact = [r.name for r in results if r.exact_shapes is not None]
    if exact:
        at_sample = [c.label for c in checks if c.shapes == checks[0].shapes]
        notes.append(
            f"{', '.join(exact)} run{'s' if len(exact) == 1 else ''} only the sample's exact "
            f"shapes: verified on "
            f"{', '.join(at_sample)} only, measured at the sample's batch size only, and "
            f"eligible only for calls of exactly those shapes"
        )
    exported = frame.target.conversions.shared_value("onnx")
    if exported is not None and frame.has_model:
        notes.append(f"ONNX export (opset {exported.opset}) took {exported.seconds:.2f} s")
    return notes
