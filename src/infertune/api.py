"""optimize(): the pipeline, and nothing specific to any one backend.

inputs -> reference -> candidates -> prepare -> verify -> measure -> select -> Optimized
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from .backends import BACKENDS, Backend, KerasEager
from .cache import CacheEntry
from .diagnosis import diagnose, trace_and_count
from .environment import collect_environment, fingerprint
from .errors import InputError, ModelError, OptionError, one_line
from .gpu import enable_tf_memory_growth
from .inputs import InputSignature, build_signature
from .isolation import DEFAULT_CANDIDATE_TIMEOUT_S, ISOLATIONS, Isolation
from .machine import MachineRecord
from .measure import (
    RACE_RATIO,
    LatencyStats,
    clearly_slower,
    measure_interleaved,
    time_once,
    warm_up,
)
from .models import ModelSource, load_model
from .optimized import Optimized
from .planning import Probe, after_candidates_s, learn_from_run
from .preparing import Budget, Check, prepare_all, shared_stage
from .progress import Progress
from .report import BatchResult, CandidateResult, Report
from .resources import release_freed_memory
from .target import Target
from .verify import ELEMENT_RULE

__all__ = ["available_backends", "optimize"]

OBJECTIVES = ("latency", "throughput")
PRECISIONS = ("fp32", "fp16", "bf16", "int8")
DEFAULT_MEASURE_S = 5.0  # measurement budget when the caller gives no time_budget_s
FRESH_INPUTS = 2  # random inputs at the sample's batch size, besides the sample itself
# How much larger each free non-batch dimension is in the verification input at other sizes:
# a sequence a bit longer, and an image side with the sample's remainder modulo 32, so that
# a network of stride 32 (most CNNs) that took the sample takes it too.
OTHER_SIZE_STEP = 32


def optimize(
    model: Any,
    sample_input: Any,
    *,
    backends: Sequence[str | Backend] | None = None,
    rtol: float = 1e-3,
    atol: float = 1e-5,
    objective: str = "latency",
    time_budget_s: float | None = None,
    precision: Iterable[str] = ("fp32",),
    cache: str | os.PathLike | None = None,
    batch_sizes: Sequence[int] | None = None,
    latency_budget_ms: float | None = None,
    isolation: str = "process",
    candidate_timeout_s: float | None = DEFAULT_CANDIDATE_TIMEOUT_S,
    verbose: bool = True,
) -> Optimized:
    """Try every candidate backend that can run here and return the fastest correct one.

    Args:
        model: a keras.Model, tf.Module or tf.function, or the path of a SavedModel
            directory or a .keras/.h5 file.
        sample_input: one batch exactly as `model(sample_input)` takes it (array, tf.Tensor,
            list/tuple or dict of them). Axis 0 is the batch.
        backends: candidate names to try (see `infertune.available_backends()`), or Backend
            instances; None tries every candidate that can run here. The model's own call
            is always measured as the reference.
        rtol, atol: output-match tolerance (scale-aware, see docs/how-it-works.md).
        objective: "latency" (median per call) or "throughput" (samples/s at the sample's
            batch size).
        time_budget_s: budget for the whole call; candidates not reached are "skipped".
        precision: precisions allowed ("fp32", "fp16", "bf16", "int8"); reduced-precision
            candidates must still pass verification under rtol/atol.
        cache: a directory for the tuning cache. A result tuned before for the same model
            (definition and weights), input signature, options and environment is loaded
            from it, checked on the sample and returned without tuning (`report.from_cache`);
            otherwise the new result is stored there. See docs/deploy.md.
        batch_sizes: batch sizes a service calls the model at (e.g. [1, 8, 64]). Every
            candidate is verified and measured at each (and at the sample's), the fastest is
            chosen per batch size, and the callable sends each call to the choice for the
            smallest tuned batch size at or above the call's (the largest one beyond them).
            None: the sample's batch size only. The model's batch dimension must be free.
        latency_budget_ms: with objective="throughput", only (batch size, candidate) pairs
            whose p99 stays within this many ms are chosen; the report gives the largest
            batch size that meets it (a server's max batch size) and the best samples/s.
        isolation: how a candidate that crashes or hangs is contained. "process" (default):
            native runtimes (ONNX Runtime, OpenVINO, LiteRT) first compile and run the
            verification inputs in a child process, so a segfault or an out-of-memory kill
            there makes the candidate `failed`, not the caller's process die; every stage
            also has the deadline below. "thread": the deadline only. "off": neither.
        candidate_timeout_s: seconds one candidate may take to convert, compile, run first
            and verify; past it, it is reported `timeout`. None: no limit.
        verbose: progress lines on stderr.

    Returns:
        An `Optimized` callable; its `.report` says what was tried and why it was chosen.
    """
    options = _Options.checked(
        rtol,
        atol,
        objective,
        time_budget_s,
        precision,
        isolation,
        candidate_timeout_s,
        batch_sizes,
        latency_budget_ms,
    )
    if cache is not None and not isinstance(cache, str | os.PathLike):
        raise OptionError(
            f"cache must be a directory path or None. Received: cache={cache!r} of type "
            f"{type(cache).__name__}."
        )
    with Progress(verbose) as progress:
        opt = _optimize(model, sample_input, backends, options, cache, progress)
    # Everything the run built is garbage now (rejected candidates, conversions, reference
    # outputs): hand the freed heap back to the OS instead of leaving it to the allocator.
    release_freed_memory()
    return opt


def _optimize(
    model, sample_input, backends, options: _Options, cache, progress: Progress
) -> Optimized:
    times = progress.times
    with progress.timed("model load", text="loading the model"):
        # Before TensorFlow runs anything on a GPU: candidates after it must still find memory.
        growth = enable_tf_memory_growth()
        source = load_model(model)
        signature, sample = build_signature(
            sample_input, source.declared_inputs, source.default_float
        )
        progress.say(f"{source.description}; inputs {signature.describe()}")
        candidates = _candidates(source, backends)
    requested = None if backends is None else [b.name for b in candidates[1:]]
    saved_options = {**options.saved(), "backends": requested}
    entry = None
    if cache is not None:
        with progress.timed("cache lookup", text="looking up the tuning cache"):
            entry = CacheEntry(Path(cache), source, signature, saved_options)
            hit = entry.load(source, signature, sample, progress)
        if hit is not None:
            return hit

    batch_sizes = _tuned_batch_sizes(options.batch_sizes, signature)
    with progress.timed("reference", text="computing reference outputs"):
        reference, outputs, first_call_s = _reference(source, signature, sample)
    target = Target(source, signature, outputs, [ref.dtype for ref in reference], options.objective)
    with progress.timed("verification inputs"):
        checks, call_s = _checks(source, signature, sample, reference, progress, batch_sizes)

    with progress.timed("environment"):
        environment = collect_environment()
    record = MachineRecord(fingerprint(environment))
    with progress.timed("FLOP count", text="counting the model's arithmetic (one trace of it)"):
        probe = _probe(source, signature, sample, checks, call_s, record.peak_gflops)
    budget = _budget(options, first_call_s, probe, record)

    results: list[CandidateResult] = []
    isolation = Isolation(options.isolation, options.candidate_timeout_s)
    try:
        contenders, call_estimates, tried = prepare_all(
            candidates, target, checks, results, options, progress, isolation, budget, probe,
            record,
        )  # fmt: skip
    finally:
        isolation.close()
    for name, seconds in isolation.child_seconds.items():
        times.add_background(name, seconds, "rehearsal in the child process")
    for key, seconds in target.offloaded_seconds.items():
        times.add_background("(shared)", seconds, f"{shared_stage(key)} in a worker process")
    results[0].first_call_ms = 1e3 * first_call_s  # the model's own first call, on the sample
    precision_notes = [
        f"{backend.name}: {backend.precision_note}"
        for backend, result in zip(candidates, results)
        if backend.precision_note and result.status not in ("skipped", "unavailable")
    ]
    candidates = [(type(b), b.name) for b in candidates]  # a rejected one is referenced by nobody
    if results[0].status != "ok":
        raise ModelError(
            f"The model does not reproduce its own outputs on the same input "
            f"({results[0].reason}); a model with randomness at inference (dropout in "
            f"training mode, random layers) cannot be verified."
        )

    by_batch = _measure_batches(
        contenders, sample, results, signature, batch_sizes, options, progress, budget,
        call_estimates,
    )  # fmt: skip
    exact = {name for name, backend in contenders.items() if backend.exact_shapes is not None}
    chosen, why = _select(
        [r for r in results if r.name not in exact], options.objective, options.latency_budget_ms
    )
    fast, fast_why = _select_exact_shape(results, exact, chosen, options)
    batches = (
        _choose_per_batch(results, by_batch, chosen, why, options, signature.sample_batch)
        if batch_sizes
        else []
    )
    serving = fast or chosen  # the candidate that serves calls at the sample's shapes
    kept = {
        name: contenders.pop(name)
        for name in {serving.name, chosen.name, *(b.selected for b in batches)}
    }
    for rejected in contenders.values():
        _close(rejected)
    contenders.clear()
    progress.stage("diagnosis: the machine's peak")
    diagnosis = diagnose(
        source, signature, sample, results, serving.name, environment,
        flops=(probe.flops, probe.flops_note), record=record, timed=progress.timed,
    )  # fmt: skip
    times.total_s = progress.elapsed()
    _learn(record, probe, candidates, results, times, serving.name)
    report = Report(
        model=source.description,
        signature=signature.describe(),
        batch_size=signature.sample_batch,
        objective=options.objective,
        rtol=options.rtol,
        atol=options.atol,
        candidates=results,
        environment=environment,
        selected=serving.name,
        selection_reason=fast_why if fast else why,
        total_s=times.total_s,
        notes=_notes(target, checks, results)
        + precision_notes
        + target.notes
        + _plan_notes(options, tried, results)
        + _gpu_notes(growth)
        + isolation.notes,
        diagnosis=diagnosis,
        batches=batches,
        latency_budget_ms=options.latency_budget_ms,
        stages=times,
        other_shapes=chosen.name if fast else None,
        other_shapes_reason=why if fast else "",
    )
    progress.say(f"selected {serving.name}: {report.selection_reason}")
    if fast:
        progress.say(f"other shapes: {chosen.name}: {why}")
    for line in report.batch_summary():
        progress.say(line)
    progress.say(times.summary().replace("\n  ", "; "))
    opt = Optimized(
        kept[chosen.name],
        signature,
        outputs,
        report,
        output_dtypes=target.output_dtypes,
        options=saved_options,
        by_batch={b.batch_size: kept[b.selected] for b in batches} or None,
        exact=kept[fast.name] if fast else None,
    )
    if entry is not None:
        progress.stage("storing the result in the tuning cache")
        entry.store(opt, progress)
    return opt


def available_backends() -> list[str]:
    """Names of the candidate backends infertune knows (whether or not they can run here)."""
    return ["keras-eager", *BACKENDS]


# -- steps ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Options:
    """optimize()'s tuning options, checked once."""

    rtol: float
    atol: float
    objective: str
    time_budget_s: float | None
    precisions: tuple[str, ...]
    deadline: float
    isolation: str = "process"
    candidate_timeout_s: float | None = DEFAULT_CANDIDATE_TIMEOUT_S
    batch_sizes: tuple[int, ...] | None = None  # sorted, unique; None: the sample's only
    latency_budget_ms: float | None = None

    @classmethod
    def checked(
        cls,
        rtol,
        atol,
        objective,
        time_budget_s,
        precision,
        isolation="process",
        candidate_timeout_s=DEFAULT_CANDIDATE_TIMEOUT_S,
        batch_sizes=None,
        latency_budget_ms=None,
    ) -> _Options:
        numbers = isinstance(rtol, int | float) and isinstance(atol, int | float)
        if not (numbers and rtol >= 0 and atol >= 0):
            raise OptionError(
                f"rtol and atol must be numbers >= 0. Received: rtol={rtol!r}, atol={atol!r}."
            )
        _check_choice("objective", objective, OBJECTIVES)
        _check_positive_or_none("time_budget_s", time_budget_s)
        precisions = (precision,) if isinstance(precision, str) else tuple(precision)
        if not precisions or any(p not in PRECISIONS for p in precisions):
            raise OptionError(
                f"precision must be a subset of {PRECISIONS}. Received: {precision!r}."
            )
        _check_choice("isolation", isolation, ISOLATIONS)
        _check_positive_or_none("candidate_timeout_s", candidate_timeout_s)
        sizes = _checked_batch_sizes(batch_sizes)
        _check_positive_or_none("latency_budget_ms", latency_budget_ms)
        if latency_budget_ms is not None and objective != "throughput":
            raise OptionError(
                f"latency_budget_ms applies to objective='throughput' (the most samples/s "
                f"whose p99 stays within the budget); objective={objective!r} already chooses "
                f"the lowest latency. Received: latency_budget_ms={latency_budget_ms!r}."
            )
        deadline = math.inf if time_budget_s is None else time.perf_counter() + time_budget_s
        return cls(
            rtol,
            atol,
            objective,
            time_budget_s,
            precisions,
            deadline,
            isolation,
            candidate_timeout_s,
            sizes,
            latency_budget_ms,
        )

    def saved(self) -> dict:
        """The options that decide the tuned result, as JSON (for save() and the cache key);
        the time budget only decides how long it may take."""
        return {
            "rtol": self.rtol,
            "atol": self.atol,
            "objective": self.objective,
            "precision": sorted(self.precisions),
            "batch_sizes": list(self.batch_sizes) if self.batch_sizes else None,
            "latency_budget_ms": self.latency_budget_ms,
        }

    def measure_budget(
        self, batch_sizes_left: int = 1, deadline: float | None = None, after_s: float = 0.0
    ) -> float:
        """Seconds to measure one batch size: DEFAULT_MEASURE_S each, or an equal share of
        what remains of time_budget_s (until `deadline`, less `after_s` for what follows)."""
        if self.time_budget_s is None:
            return DEFAULT_MEASURE_S
        end = self.deadline if deadline is None else deadline
        return max(0.2, (end - after_s - time.perf_counter()) / batch_sizes_left)


def _checked_batch_sizes(batch_sizes: Any) -> tuple[int, ...] | None:
    if batch_sizes is None:
        return None
    sizes = [batch_sizes] if isinstance(batch_sizes, int) else batch_sizes
    if isinstance(sizes, str | bytes) or not isinstance(sizes, Iterable):
        sizes = None
    else:
        sizes = list(sizes)
    valid = bool(sizes) and all(
        isinstance(n, int | np.integer) and not isinstance(n, bool) and n > 0 for n in sizes
    )
    if not valid:
        raise OptionError(
            f"batch_sizes must be a list of positive integers, e.g. [1, 8, 64], or None. "
            f"Received: batch_sizes={batch_sizes!r}."
        )
    return tuple(sorted({int(n) for n in sizes}))


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise OptionError(f"{name} must be one of {choices}. Received: {name}={value!r}.")


def _check_positive_or_none(name: str, value: Any) -> None:
    if value is not None and not (isinstance(value, int | float) and value > 0):
        raise OptionError(f"{name} must be a positive number or None. Received: {value!r}.")


def _candidates(source: ModelSource, backends: Sequence[str | Backend] | None) -> list[Backend]:
    """The reference first, then the requested (or all registered) backends."""
    reference = KerasEager("keras-eager" if source.is_keras else "original")
    if backends is None:
        chosen: list[Backend] = [cls() for cls in BACKENDS.values()]
    else:
        if isinstance(backends, str):
            backends = [backends]
        chosen = []
        for item in backends:
            if isinstance(item, Backend):
                chosen.append(item)
            elif item in ("keras-eager", "original"):
                continue  # the reference is always measured
            elif item in BACKENDS:
                chosen.append(BACKENDS[item]())
            else:
                raise OptionError(
                    f"Unknown backend {item!r}. Known backends: {available_backends()}."
                )
    names = [reference.name] + [b.name for b in chosen]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise OptionError(f"Backend names must be unique; repeated: {duplicates}.")
    return [reference, *chosen]


def _reference(
    source: ModelSource, signature: InputSignature, sample: list[np.ndarray]
) -> tuple[list[np.ndarray], Any, float]:
    """The model's own outputs on the sample, their structure, and the first call's time."""
    try:
        (flat, structure), seconds = time_once(lambda: source.call_flat(signature, sample))
    except Exception as exc:
        raise InputError(
            f"The model rejected the sample: {one_line(exc)}. Expected inputs: "
            f"{signature.describe()}."
        ) from exc
    for i, array in enumerate(flat):
        if array.dtype == object or array.dtype.kind not in "biufc":
            raise ModelError(
                f"Output {i} of the model has dtype {array.dtype}; infertune handles numeric "
                f"outputs."
            )
    return flat, structure, seconds


def _checks(
    source: ModelSource,
    signature: InputSignature,
    sample: list[np.ndarray],
    reference: list[np.ndarray],
    progress: Progress,
    batch_sizes: list[int] | None = None,
) -> tuple[list[Check], float]:
    """The sample, fresh random inputs like it, one at each other tuned batch size (one at
    another batch size where none is given and the batch is free), and, where the model has
    free dimensions besides the batch (a sequence length, an image's height and width), one
    at the sample's batch size with each of those dimensions OTHER_SIZE_STEP larger; and the
    model's seconds per call at the sample's shapes, steady (the first call is the sample's).
    An input the model raises on is left out, said in the progress."""
    rng = np.random.default_rng(0)
    batch = signature.sample_batch
    at_sample = signature.concrete_shapes()
    wanted = [(f"random input {i + 1}", at_sample) for i in range(FRESH_INPUTS)]
    if batch_sizes:
        others = [size for size in batch_sizes if size != batch]
    elif batch is not None and signature.batch_is_dynamic:
        others = [1 if batch > 1 else 3]
    else:
        others = []
    wanted += [
        (f"random input at batch {other}", signature.concrete_shapes(other)) for other in others
    ]
    other_sizes = signature.other_sizes(OTHER_SIZE_STEP)
    if other_sizes is not None:
        words = ", ".join(str(shape) for shape in other_sizes)
        wanted.append((f"random input at other sizes of the free dimensions {words}", other_sizes))
    checks = [Check("the sample", sample, reference)]
    seconds = []
    for label, shapes in wanted:
        inputs = signature.random_inputs(rng, shapes=shapes)
        try:
            (outputs, _), took = time_once(lambda i=inputs: source.call_flat(signature, i))
        except Exception as exc:
            progress.say(f"the model raised on {label}, verifying without it: {one_line(exc)}")
            continue
        if shapes == at_sample:
            seconds.append(took)
        checks.append(Check(label, inputs, outputs))
    return checks, min(seconds, default=0.0)


def _probe(
    source: ModelSource,
    signature: InputSignature,
    sample: list[np.ndarray],
    checks: list[Check],
    call_s: float,
    peak_gflops: float | None,
) -> Probe:
    """What the candidates' order and the budget are planned from: one trace of the model at
    the sample's shapes gives its arithmetic (the diagnosis' count too), its op types and the
    trace's time; the model's own call time comes from the verification inputs."""
    flops, note, op_types, trace_s = trace_and_count(source.graph_function(signature), sample)
    return Probe(flops, note, op_types, trace_s, call_s, len(checks), peak_gflops)


def _budget(options: _Options, first_call_s: float, probe: Probe, record: MachineRecord):
    """The time budget: time_budget_s from optimize()'s start plus the model's own first call
    (which no candidate can save), and what the work after the candidates needs."""
    if options.time_budget_s is None:
        return Budget(None)
    peak = record.peak_gflops
    return Budget(
        options.time_budget_s,
        options.deadline + first_call_s,
        lambda contenders: after_candidates_s(probe, contenders, peak is not None, peak),
        after_measurement_s=(0.0 if peak is not None else 1.5) + 0.5 + _FINISH_S,
    )


# What optimize() does after the report: releasing the run's freed memory to the OS (a full
# garbage collection: 0.3-0.4 s after ResNet50's candidates on two cores).
_FINISH_S = 0.5


def _learn(record, probe, candidates, results, times, chosen: str) -> None:
    """What this run teaches the machine's record: its costs and its choice."""
    learn_from_run(record, probe, candidates, {r.name: r.status for r in results}, times, chosen)


def _plan_notes(options: _Options, tried: list[str], results: list[CandidateResult]) -> list[str]:
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


def _tuned_batch_sizes(batch_sizes: tuple[int, ...] | None, signature: InputSignature):
    """The batch sizes to tune at (the sample's among them), or None for the sample's only."""
    if batch_sizes is None:
        return None
    if not signature.batch_is_dynamic or signature.sample_batch is None:
        raise OptionError(
            f"batch_sizes={list(batch_sizes)} needs a model whose batch dimension is free, "
            f"and a sample whose inputs share one batch size; this model's inputs are "
            f"{signature.describe()} and the sample's shapes {list(signature.sample_shapes)}. "
            f"Leave batch_sizes=None to tune at the sample's batch size."
        )
    return sorted({*batch_sizes, signature.sample_batch})


def _measure_batches(
    contenders: dict[str, Backend],
    sample: list[np.ndarray],
    results: list[CandidateResult],
    signature: InputSignature,
    batch_sizes: list[int] | None,
    options: _Options,
    progress: Progress,
    budget: Budget | None = None,
    call_estimates: dict[str, float] | None = None,
) -> dict[int, dict[str, LatencyStats]]:
    """Measure every contender at the sample's batch size (its statistics go into `results`)
    and at each other tuned batch size, on random inputs drawn like the sample (an exact-shape
    candidate, at the sample's only). A candidate that fails at any batch size is `failed`
    and closed. Returns {batch: {name: stats}}.

    `call_estimates`: seconds per call at the sample's batch size seen in verification; a
    candidate with one needs no warm-up there (its verification calls were its warm-up)."""
    sizes = batch_sizes or [signature.sample_batch]
    by_name = {r.name: r for r in results}
    rng = np.random.default_rng(1)
    measured = {}
    # The sample's batch size first: its numbers are the candidates' own in the report.
    for i, size in enumerate(sorted(sizes, key=lambda n: n != signature.sample_batch)):
        inputs = sample if size == signature.sample_batch else signature.random_inputs(rng, size)
        where = f" at batch {size}" if batch_sizes else ""
        limited = budget is not None and budget.limited
        deadline = budget.deadline if limited else None
        # Measurement stops at the end of a round once its budget is spent: one round of
        # every contender (an untimed call and a timed one each) is kept for that.
        round_s = sum(2 * (call_estimates or {}).get(name, 0.01) for name in contenders)
        after = budget.after_measurement_s + round_s if limited else 0.0
        estimates = call_estimates if size == signature.sample_batch else None
        running = {
            name: backend
            for name, backend in contenders.items()
            if size == signature.sample_batch or backend.exact_shapes is None
        }
        stats, errors = _measure(
            running,
            inputs,
            options.measure_budget(len(sizes) - i, deadline, after),
            progress,
            where,
            estimates,
        )
        for name, reason in errors.items():
            by_name[name].status, by_name[name].reason = "failed", f"{reason}{where}"
            _close(contenders.pop(name))
        measured[size] = stats
    batch = signature.sample_batch or 1
    for name, stats in measured[signature.sample_batch].items():
        if name in contenders:
            by_name[name].latency = stats
            by_name[name].throughput = batch / (stats.mean / 1e3)
    return {
        size: {name: s for name, s in stats.items() if name in contenders}
        for size, stats in measured.items()
    }


def _measure(
    contenders: dict[str, Backend],
    inputs: list[np.ndarray],
    budget_s: float,
    progress: Progress,
    where: str = "",
    known: dict[str, float] | None = None,
) -> tuple[dict[str, LatencyStats], dict[str, str]]:
    """Warm up, then time all contenders on `inputs` in interleaved rounds. Returns their
    statistics and, for those that raised, the reason. A contender whose seconds per call on
    inputs like these are `known` (from its verification calls) needs no warm-up."""
    runners = {name: (lambda b=backend: b.run(inputs)) for name, backend in contenders.items()}
    estimates, errors = {}, {}
    known = known or {}
    with progress.timed("warm-up"):
        for name, runner in list(runners.items()):
            if name in known:
                estimates[name] = known[name]
                continue
            try:
                estimates[name] = warm_up(runner)
            except Exception as exc:
                errors[name] = f"warm-up: {one_line(exc)}"
                del runners[name]
    progress.say(
        f"measuring {len(runners)} candidates{where} in interleaved rounds (up to {budget_s:.1f} s)"
    )
    with progress.timed("measurement"):
        measured = measure_interleaved(
            runners,
            budget_s=budget_s,
            per_call_estimate_s=estimates,
            cooldown_s={name: backend.cooldown_s for name, backend in contenders.items()},
            on_round=lambda n, t: progress.stage(
                f"measuring{where}: round {n}, {t:.1f} of {budget_s:.1f} s", log=False
            ),
        )
    errors.update({name: f"measurement: {reason}" for name, reason in measured.errors.items()})
    return measured.stats, errors


def _choose_per_batch(
    results: list[CandidateResult],
    by_batch: dict[int, dict[str, LatencyStats]],
    chosen: CandidateResult,
    why: str,
    options: _Options,
    sample_batch: int,
) -> list[BatchResult]:
    """The choice at each tuned batch size, by the same rules as at the sample's; the
    sample's batch size keeps the choice already made there."""
    choices = []
    for size, stats in sorted(by_batch.items()):
        if size == sample_batch:
            reasons = {r.name: r.reason for r in results if r.name in stats and r is not chosen}
            choices.append(BatchResult(size, chosen.name, why, stats, reasons))
            continue
        at_size = [
            replace(r, status="ok", reason="", latency=stats[r.name])
            for r in results
            if r.name in stats
        ]
        for r in at_size:
            r.throughput = size / (r.latency.mean / 1e3)
        picked, picked_why = _select(at_size, options.objective, options.latency_budget_ms)
        reasons = {r.name: r.reason for r in at_size if r is not picked}
        choices.append(BatchResult(size, picked.name, picked_why, stats, reasons))
    return choices


def _close(backend: Backend) -> None:
    """Close a candidate that is out; a custom close() that raises must not end optimize()."""
    with contextlib.suppress(Exception):  # what it held goes when it is collected
        backend.close()


def _select(
    results: list[CandidateResult], objective: str, latency_budget_ms: float | None = None
) -> tuple[CandidateResult, str]:
    """The fastest candidate by the objective, or one within noise of it; with a latency
    budget, among those whose p99 is within it (all of them, said, where none is).

    A candidate is out when another is clearly faster than it (round by round, see
    measure.clearly_slower), or when its median (mean, for throughput) is more than
    _TIE_REL above the lowest of those left; the rest tie, and _tie_key breaks the tie.

    Each is compared with every other, not just with the one of lowest median: on a machine
    whose other cores are busy, a multi-threaded runtime is erratic (some rounds at full
    speed, some at half), clearly faster than no one and clearly slower than no one. A
    steady candidate must not win the tie for its cheaper start over a steady one clearly
    faster than it, nor an erratic one 20% slower in the median."""
    measured = [r for r in results if r.status == "ok" and r.latency is not None]
    if not measured:
        raise ModelError("No candidate could be measured, not even the model itself.")
    over_budget: list[CandidateResult] = []
    if latency_budget_ms is not None:
        within = [r for r in measured if r.latency.p99 <= latency_budget_ms]
        if within:
            over_budget = [r for r in measured if r.latency.p99 > latency_budget_ms]
            measured = within

    statistic, unit = _STATISTICS[objective]
    cost = partial(_cost, objective=objective)
    by_cost = sorted(measured, key=cost)
    fastest = by_cost[0]
    beaten = {  # the fastest candidate clearly faster than r, if any
        id(r): next(
            (
                o
                for o in by_cost
                if o is not r and clearly_slower(r.latency, o.latency, statistic=statistic)
            ),
            None,
        )
        for r in measured
    }
    unbeaten = [r for r in by_cost if beaten[id(r)] is None]
    cycle = not unbeaten  # each clearly slower than another: the rounds disagree
    unbeaten = unbeaten or [fastest]
    tied = [r for r in unbeaten if cost(r) <= cost(unbeaten[0]) * (1 + _TIE_REL)]
    chosen = min(tied, key=lambda r: _tie_key(r, objective))
    chosen.status = "selected"
    baseline = results[0]
    why = f"{unit} {cost(chosen):.4g} ms"
    if baseline is not chosen and baseline.latency is not None and cost(baseline) > cost(chosen):
        why += f", {cost(baseline) / cost(chosen):.1f}x faster than {baseline.name}"
    if cycle:
        why += (
            f"; every candidate was clearly slower than another round by round (the rounds "
            f"disagree): the lowest {unit}"
        )
    elif chosen is not fastest and fastest in tied:
        words = _tie_words(chosen, fastest, objective)
        why += f"; within noise of {fastest.name}, preferred ({words})"
    elif chosen is not fastest:  # the lowest cost, but another was faster in most rounds
        why += (
            f"; {fastest.name} has the lowest {unit} ({cost(fastest):.4g} ms) but is clearly "
            f"slower than {beaten[id(fastest)].name} round by round"
        )
    if latency_budget_ms is not None:
        if over_budget or all(r.latency.p99 <= latency_budget_ms for r in measured):
            why += (
                f"; p99 {chosen.latency.p99:.4g} ms within latency_budget_ms={latency_budget_ms:g}"
            )
        else:
            best = min(measured, key=lambda r: r.latency.p99)
            why += (
                f"; no candidate met latency_budget_ms={latency_budget_ms:g} (the lowest p99 "
                f"was {best.latency.p99:.4g} ms, {best.name})"
            )
    for r in over_budget:
        r.reason = f"p99 {r.latency.p99:.4g} ms exceeds latency_budget_ms={latency_budget_ms:g}"
    for r in measured:
        if r is chosen:
            continue
        winner = beaten[id(r)]
        if r in tied:
            r.reason = (
                f"within noise of {chosen.name} ({unit} {cost(r):.4g} ms); {chosen.name} "
                f"preferred ({_tie_words(chosen, r, objective)})"
            )
        elif cost(r) > cost(chosen) and (
            winner is None or clearly_slower(r.latency, chosen.latency, statistic=statistic)
        ):  # clearly slower than the chosen one, or erratic and more than 5% above it
            r.reason = (
                f"{cost(r) / cost(chosen):.2f}x slower than {chosen.name} ({unit} {cost(r):.4g} ms)"
            )
        else:  # beaten round by round, whatever its median over all calls says
            r.reason = (
                f"clearly slower than {winner.name} round by round ({unit} {cost(r):.4g} ms, "
                f"{winner.name} {cost(winner):.4g} ms)"
            )
    for r in measured + over_budget:
        if r.latency.left_after is not None and r is not chosen:
            r.reason += (
                f"; measured {r.latency.left_after} rounds: more than {RACE_RATIO:g}x slower "
                f"than another in each, it left the rest"
            )
    return chosen, why


# What each objective ranks candidates by: (the per-round statistic, its name in reasons).
_STATISTICS = {"latency": ("median", "p50"), "throughput": ("mean", "mean")}


def _cost(r: CandidateResult, objective: str) -> float:
    """ms per call by the objective's statistic."""
    return r.latency.p50 if objective == "latency" else r.latency.mean


# How far above the lowest median (mean, for throughput) a candidate that nothing beats
# round by round still ties: the stability tolerance of the measurement (measure.py).
_TIE_REL = 0.05


def _select_exact_shape(
    results: list[CandidateResult], exact: set[str], general: CandidateResult, options: _Options
) -> tuple[CandidateResult | None, str]:
    """The candidate among those that run only the sample's exact shapes (`exact`, by name)
    that serves calls at the sample's shapes instead of `general`, the choice among those that
    run any shape; and why. (None, "") where none beats `general`.

    By _select's rules among `general` and the exact-shape candidates measured, with one
    more: a tie stays with `general`. A fast path holds a second prepared model and splits
    the calls between two runtimes, so it must be faster beyond noise: clearly faster round
    by round, or its median (mean, for throughput) more than _TIE_REL below, or within the
    latency budget where `general` is not."""
    measured = [
        r for r in results if r.name in exact and r.status == "ok" and r.latency is not None
    ]
    if not measured:
        return None, ""
    stand_in = replace(general, status="ok", reason="")  # _select sets its status and reason
    picked, why = _select([stand_in, *measured], options.objective, options.latency_budget_ms)
    if picked is stand_in:
        return None, ""
    statistic, unit = _STATISTICS[options.objective]
    cost = partial(_cost, objective=options.objective)
    budget = options.latency_budget_ms
    beyond_noise = (
        clearly_slower(general.latency, picked.latency, statistic=statistic)
        or cost(general) > cost(picked) * (1 + _TIE_REL)
        or (budget is not None and picked.latency.p99 <= budget < general.latency.p99)
    )
    if not beyond_noise:
        picked.status = "ok"
        picked.reason = (
            f"within noise of {general.name} at the sample's shapes ({unit} "
            f"{cost(picked):.4g} ms, {general.name} {cost(general):.4g} ms): {general.name} "
            f"serves them too, as a fast path of its own must be clearly faster"
        )
        return None, ""
    general.reason = (
        f"serves every call but those at the sample's exact shapes, which {picked.name} serves"
    )
    return picked, f"{why}; at the sample's exact shapes only, {general.name} serves the others"


def _tie_key(r: CandidateResult, objective: str) -> tuple:
    """Full precision first, then the smaller error and the cheaper start (prepare plus first
    call), each by decade (2e-7 and 3e-7 are the same float32 round-off), then the steadier:
    the lower p90 for latency (the medians are within noise: the tail is the difference a
    caller sees, as with a runtime whose threads share a busy core), the lower mean for
    throughput; then the faster median."""
    latency = r.latency
    return (
        r.precision != "fp32",
        _decade(r.max_rel_err or 0.0),
        _decade((r.prepare_s or 0.0) + (r.first_call_ms or 0.0) / 1e3),  # XLA compiles late
        (latency.p90 if objective == "latency" else latency.mean) if latency else math.inf,
        latency.p50 if latency else math.inf,
    )


def _decade(value: float, floor: int = -6) -> int:
    """Order of magnitude; everything under 1e-6 is float32 round-off and counts as equal."""
    return max(math.floor(math.log10(value)), floor) if value > 0 else floor


def _tie_words(chosen: CandidateResult, other: CandidateResult, objective: str) -> str:
    a, b = _tie_key(chosen, objective), _tie_key(other, objective)
    if a[0] != b[0]:
        return "full precision"
    if a[1] != b[1]:
        return "more exact"
    if a[2] != b[2]:
        return "cheaper to start"
    if a[3] != b[3]:
        return "steadier: lower p90" if objective == "latency" else "lower mean"
    return "faster median"


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
