"""The pipeline, stage by stage, and nothing else:

inputs -> reference -> candidates -> prepare -> verify -> measure -> select -> choice + report

Each stage lives in its own module; this one runs them in order, closes what is not chosen,
and writes the report.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backends import Backend
from ..backends.keras_eager import KerasEager
from ..backends.registry import BACKENDS
from ..backends.tf_function import TfFunction
from ..backends.tf_head import TensorFlowOnly, TfHeadChain
from ..errors import ModelError
from ..export.registry import stage_name
from ..model.inputs import (
    InputSignature,
    build_signature,
)
from ..model.source import (
    ModelSource,
    load_model,
)
from ..model.splitting import (
    Split,
    find_split,
)
from ..model.target import Target
from ..model.tolerance import (
    ELEMENT_RULE,
    compare_outputs,
)
from ..options import REFERENCE_NAMES, Options
from ..precision.data import (
    LabelledBatch,
    calibration_batches,
    labelled_batches,
)
from ..precision.gate import (
    FIRST_ROWS,
    precision_data,
)
from ..report import CandidateResult, Diagnosis, Report, memory_line
from ..report.progress import Progress
from ..report.stages import StageTimes
from ..result.choice import Choice
from ..system.environment import (
    collect_environment,
    fingerprint,
)
from ..system.gpu import enable_tf_memory_growth
from ..system.resources import (
    MemoryPeak,
    allocators_note,
)
from .budget import Budget
from .context import Preparation
from .diagnosis import diagnose
from .isolation import Isolation
from .machine import MachineRecord
from .measuring import close_quietly, concurrency_note, measure_batches
from .memory import conversion_memory_learned
from .planning import Probe, after_candidates_s, learn_from_run
from .preparing import prepare_all
from .reference import (
    Check,
    EagerVsTraced,
    compare_traced,
    output_signature,
    probe,
    reference_outputs,
    tuned_batch_sizes,
    verification_inputs,
)
from .selection import Selection, choose

__all__ = ["Model", "candidates", "load_for_tuning", "read_data", "tune"]

# What optimize() does after the report: releasing the run's freed memory to the OS (a full
# garbage collection: 0.3-0.4 s after ResNet50's candidates on two cores).
_FINISH_S = 0.5


@dataclass
class Model:
    """The model as the pipeline takes it: loaded, its input signature, the sample flat, and
    the user's data for reduced precision, read and checked (read_data)."""

    source: ModelSource
    signature: InputSignature
    sample: list[np.ndarray]
    gpu_growth: dict  # what enable_tf_memory_growth() did, for the report
    calibration: list[list[np.ndarray]] | None = None  # flat input batches
    labelled: list[LabelledBatch] | None = None


def candidates(
    source: ModelSource,
    options: Options,
    split: Split | None = None,
    unsplit: str | None = None,
) -> list[Backend]:
    """The reference (the model's own call) first, then the requested (or all registered)
    backends, each a new instance.

    Where the model is split (`split`), each candidate that converts the model is replaced by
    a chain (TfHeadChain: the TensorFlow head, then the body on that candidate): what goes in
    the head is what no converter takes (model/splitting.py), so the whole model would only fail
    its conversion. Where the model takes strings and cannot be split (`unsplit` says why),
    the converting candidates are skipped with that reason."""
    reference = KerasEager("keras-eager" if source.is_keras else "original")
    wanted = list(BACKENDS) if options.backends is None else list(options.backends)
    chosen = [b if isinstance(b, Backend) else BACKENDS[b]() for b in wanted]
    if split is not None:
        chosen = [b if _runs_in_tensorflow(b) else TfHeadChain(b, split) for b in chosen]
    if unsplit is not None:
        chosen = [b if _runs_in_tensorflow(b) else TensorFlowOnly(b, unsplit) for b in chosen]
    return [reference, *chosen]


def _runs_in_tensorflow(backend: Backend) -> bool:
    """A candidate that runs the whole model as TensorFlow runs it (strings, lookup tables
    and all): the model's own call, and tf.function without XLA."""
    if isinstance(backend, KerasEager | TfHeadChain | TensorFlowOnly):
        return True
    return type(backend) is TfFunction


def tune(model: Model, options: Options, progress: Progress) -> tuple[Choice, Report]:
    """Every stage of optimize() after the model is loaded: the choice and its report, with
    the peak memory of this process and its children while it ran."""
    memory = MemoryPeak().start()
    try:
        choice, report = _tune(model, options, progress, memory)
    finally:
        memory.stop()
    if report.memory is not None:
        report.memory["peak_bytes"] = memory.peak
    return choice, report


def _tune(
    model: Model, options: Options, progress: Progress, memory: MemoryPeak
) -> tuple[Choice, Report]:
    source, signature, sample = model.source, model.signature, model.sample
    times = progress.times
    batch_sizes = tuned_batch_sizes(options.batch_sizes, signature)
    with progress.timed("reference", text="computing reference outputs"):
        reference, structure, first_call_s = reference_outputs(source, signature, sample)
    with progress.timed("split", text="looking for preprocessing to run apart"):
        split, unsplit = find_split(source, signature, sample)
    if split is not None:
        progress.say(f"the model is {split.describe()}")
    # Without strings, a model that cannot be split still goes whole to every converter.
    backends = candidates(source, options, split, unsplit if signature.strings else None)
    dtypes = [ref.dtype for ref in reference]
    target = Target(source, signature, structure, dtypes, options.objective, options.concurrency)
    reference, versus, call = reference_kind(target, sample, reference, options, progress)
    target.output_dtypes = [ref.dtype for ref in reference]
    with progress.timed("verification inputs"):
        checks, call_s = verification_inputs(
            source, signature, sample, reference, progress, batch_sizes, call
        )
    outputs = output_signature(structure, signature, checks)
    precision = None
    if model.calibration or model.labelled:
        with progress.timed("calibration", text="the model on the calibration and accuracy data"):
            reference_call = call or (lambda flat: source.call_flat(signature, flat)[0])
            precision = precision_data(
                model.calibration,
                options.accuracy,
                model.labelled,
                outputs,
                reference_call,
                references=False,
            )
            precision.batch_sizes = [n for n in batch_sizes or [] if n != signature.sample_batch]
        target.calibration = precision.calibration or None

    with progress.timed("environment"):
        environment = collect_environment()
    record = MachineRecord(fingerprint(environment))
    with progress.timed("FLOP count", text="counting the model's arithmetic (one trace of it)"):
        planned = probe(source, signature, sample, checks, call_s, record.peak_gflops)
    budget = _budget(options, first_call_s, planned, record)

    isolation = Isolation(options.isolation, options.candidate_timeout_s)
    run = Preparation(target, checks, options, progress, isolation, budget, planned, record)
    run.precision = precision
    try:
        prepared = prepare_all(backends, run)
    finally:
        isolation.close()
    results, contenders = prepared.results, prepared.contenders
    for name, seconds in isolation.child_seconds.items():
        times.add_background(name, seconds, "rehearsal in the child process")
    for key, seconds in target.offloaded_seconds.items():
        times.add_background("(shared)", seconds, f"{stage_name(key)} in a worker process")
    results[0].first_call_ms = 1e3 * first_call_s  # the model's own first call, on the sample
    precision_notes = [
        f"{result.name}: {result.quantization or backend.precision_note}"
        for backend, result in zip(backends, results)
        if (result.quantization or backend.precision_note)
        and result.status not in ("skipped", "unavailable")
    ]
    if precision is not None and precision.predicted_by != "the model":
        precision_notes.append(
            f"the model's predictions on the labelled data by {precision.predicted_by} (verified, "
            f"and within rtol/atol of the model's own on the first {FIRST_ROWS} rows)"
        )
    _check_own_call(results[0], options.reference)
    kinds = [(type(b), b.name) for b in backends]
    del backends  # a rejected candidate is referenced by nobody

    by_batch = measure_batches(
        contenders, sample, results, signature, batch_sizes, options, progress, budget,
        prepared.call_estimates,
    )  # fmt: skip
    selection = choose(results, contenders, by_batch, options, signature, outputs, batch_sizes)
    choice = selection.choice
    under_load = concurrency_note(
        choice.general.name, results, contenders, sample, signature.sample_batch or 1, options,
        progress, memory_tight=target.memory_tight is not None,
    )  # fmt: skip
    kept = {id(backend) for backend in choice.backends}
    for backend in contenders.values():
        if id(backend) not in kept:
            close_quietly(backend)
    contenders.clear()
    selected = choice.selected.name
    progress.stage("diagnosis: the machine's peak")
    diagnosis = diagnose(
        source, signature, sample, results, selected, environment,
        flops=(planned.flops, planned.flops_note), record=record, timed=progress.timed,
    )  # fmt: skip
    times.total_s = progress.elapsed()
    statuses = {r.name: r.status for r in results}
    learned = conversion_memory_learned(target)
    learn_from_run(record, planned, kinds, statuses, times, selected, learned)
    notes = (
        [versus.note()]
        + ([source.inference_note] if source.inference_note else [])
        + _notes(target, checks, results)
        + _split_notes(split, unsplit, signature.strings)
        + precision_notes
        + target.notes
        + _plan_notes(options, prepared.tried, results)
        + _gpu_notes(model.gpu_growth)
        + isolation.notes
        + _concurrency_notes(options, under_load)
    )
    if versus.differs and options.reference == "eager" and selected in REFERENCE_NAMES:
        selection.reason += (
            "; every compiled candidate computes the model's traced graph, which differs "
            "from model(x) (see the first note: reference='traced' verifies against it)"
        )
    report = _report(model, options, results, environment, selection, notes, diagnosis, times)
    report.memory = _memory(memory, target, progress)
    tip = allocators_note() if report.memory is not None and target.memory_tight else None
    if tip is not None:
        report.notes.append(tip)
    progress.say(f"selected {selected}: {report.selection_reason}")
    if choice.exact_shape:
        progress.say(f"every other shape: {choice.general.name}: {selection.general_reason}")
    for line in report.batch_summary():
        progress.say(line)
    progress.say(times.summary().replace("\n  ", "; "))
    return choice, report


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
        "conversions_bytes": {stage_name(k): v for k, v in target.memory_peaks.items()},
    }
    progress.say(memory_line(held))
    return held


def reference_kind(
    target: Target,
    sample: list[np.ndarray],
    eager: list[np.ndarray],
    options: Options,
    progress: Progress,
) -> tuple[list[np.ndarray], EagerVsTraced, Any]:
    """The traced graph against the eager call on the sample (one call of the trace the
    candidates share); with reference="traced", the traced outputs as the reference, the call
    that computes the others, and the model's own check that it reproduces them."""
    with progress.timed("traced graph", text="tracing the model and comparing with its call"):
        versus, traced = compare_traced(
            target, sample, eager, options.reference, options.rtol, options.atol
        )
        if not versus.agree:
            progress.say(versus.note())
        if options.reference == "eager":
            return eager, versus, None
        call = target.run_traced
        again = compare_outputs(call(sample), traced, options.rtol, options.atol)
    if not again:
        raise ModelError(
            f"The model's traced graph does not reproduce its own outputs on the same input "
            f"({again.reason}); a model with randomness at inference cannot be verified."
        )
    return traced, versus, call


def _report(
    model: Model,
    options: Options,
    results: list[CandidateResult],
    environment: dict,
    selection: Selection,
    notes: list[str],
    diagnosis: Diagnosis,
    times: StageTimes,
) -> Report:
    """The report of the run: every candidate, the choice and why, the notes, the stages."""
    choice = selection.choice
    return Report(
        model=model.source.description,
        signature=model.signature.describe(),
        batch_size=model.signature.sample_batch,
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


def load_for_tuning(model: Any, sample_input: Any, progress: Progress) -> Model:
    """The model loaded and its sample checked against it: the pipeline's input."""
    with progress.timed("model load", text="loading the model"):
        # Before TensorFlow runs anything on a GPU: candidates after it must still find memory.
        growth = enable_tf_memory_growth()
        source = load_model(model)
        signature, sample = build_signature(
            sample_input, source.declared_inputs, source.default_float
        )
        progress.say(f"{source.description}; inputs {signature.describe()}")
    return Model(source, signature, sample, growth)


def read_data(model: Model, options: Options, progress: Progress) -> Options:
    """optimize(calibration=..., accuracy=...) read into flat batches and checked against
    the model's inputs (InputError, OptionError: before any long work); the options with a
    digest of the data (it decides the result: the tuning cache's key)."""
    if options.calibration is None and options.accuracy is None:
        return options
    digest = hashlib.sha256()
    with progress.timed("reading the calibration and accuracy data"):
        if options.calibration is not None:
            model.calibration = calibration_batches(options.calibration, model.signature)
            for batch in model.calibration:
                _digest(digest, batch)
        if options.accuracy is not None:
            model.labelled = labelled_batches(options.accuracy.data, model.signature)
            for labelled in model.labelled:
                _digest(digest, [*labelled.inputs, labelled.labels])
    return dataclasses.replace(options, data_digest=digest.hexdigest()[:32])


def _digest(digest: Any, arrays: list[np.ndarray]) -> None:
    for array in arrays:
        digest.update(f"{array.dtype}{array.shape}".encode())
        digest.update(np.ascontiguousarray(array).tobytes() if array.dtype != object else
                      repr(array.tolist()).encode())  # fmt: skip


def _budget(options: Options, first_call_s: float, planned: Probe, record: MachineRecord):
    """The time budget: time_budget_s from optimize()'s start plus the model's own first call
    (which no candidate can save), and what the work after the candidates needs."""
    if options.time_budget_s is None:
        return Budget(None)
    peak = record.peak_gflops
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


def _split_notes(split: Split | None, unsplit: str | None, strings: list[str]) -> list[str]:
    """Where the model was split and why, or why a model that needs a split was not."""
    if split is not None:
        return [f"the model is {split.describe()}"]
    if unsplit is not None and strings:
        return [f"only TensorFlow candidates run this model: {unsplit}"]
    if unsplit is not None:
        return [f"the model was not split (every candidate converts it whole): {unsplit}"]
    return []


def _gpu_notes(growth: dict) -> list[str]:
    """What enable_tf_memory_growth() did, where TensorFlow sees a GPU."""
    if not growth["gpus"]:
        return []
    note = f"TensorFlow GPU memory growth: enabled on {growth['enabled'] or 'none'}"
    if growth["too_late"]:
        note += (
            f"; not on {growth['too_late']}, already initialized by the caller (TensorFlow "
            f"may hold most of that GPU's memory: call tf.config.experimental."
            f"set_memory_growth before first use)"
        )
    return [note]


def _notes(target: Target, checks: list[Check], results: list[CandidateResult]) -> list[str]:
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
    exported = target.shared_value("onnx")
    if exported is not None:
        notes.append(f"ONNX export (opset {exported.opset}) took {exported.seconds:.2f} s")
    return notes
