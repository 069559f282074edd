"""The front door: optimize() and load() as the user calls them.

optimize() = options -> the tuning cache -> the pipeline (pipeline/tune.py) -> the result;
load() = the saved form (result/saved.py) -> the result, or the pipeline again where the
environment no longer fits and the caller asked for that.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .accuracy import Accuracy
from .backends import Backend
from .backends.registry import BACKENDS
from .errors import EnvironmentMismatchError, OptionError
from .optimized import Optimized
from .options import DEFAULTS, Options
from .pipeline.packaging import (
    Package,
    is_package,
    make_package,
    package_options,
    tune_package,
)
from .pipeline.tune import load_for_tuning, read_data, tune
from .report.progress import Progress
from .result.cache import CacheEntry
from .result.calling import warm_up
from .result.saved import open_saved, restore
from .system.paths import user_path
from .system.resources import (
    page_out_own_files,
    release_freed_memory,
)

__all__ = ["available_backends", "load", "optimize", "package"]

ON_MISMATCH = ("raise", "retune")
DEFAULTS_REFERENCE = "keras-eager"  # the model's own call, always tried


def optimize(
    model: Any,
    sample_input: Any = None,
    *,
    backends: Sequence[str | Backend] | None = DEFAULTS.backends,
    rtol: float = DEFAULTS.rtol,
    atol: float = DEFAULTS.atol,
    objective: str = DEFAULTS.objective,
    time_budget_s: float | None = DEFAULTS.time_budget_s,
    precision: Iterable[str] = DEFAULTS.precision,
    cache: str | os.PathLike | None = None,
    batch_sizes: Sequence[int] | None = DEFAULTS.batch_sizes,
    latency_budget_ms: float | None = DEFAULTS.latency_budget_ms,
    concurrency: int = DEFAULTS.concurrency,
    isolation: str = DEFAULTS.isolation,
    candidate_timeout_s: float | None = DEFAULTS.candidate_timeout_s,
    reference: str = DEFAULTS.reference,
    calibration: Any = DEFAULTS.calibration,
    accuracy: Accuracy | None = DEFAULTS.accuracy,
    traffic: Sequence[Any] | None = DEFAULTS.traffic,
    pad_value: Any = DEFAULTS.pad_value,
    free_dims: dict[str, Any] | None = DEFAULTS.free_dims,
    verbose: bool = True,
) -> Optimized:
    """Try every candidate backend that can run here and return the fastest correct one.

    docs/api.md is the reference for every argument; in short:

    Args:
        model: a keras.Model, tf.Module or tf.function, the path of a SavedModel directory
            or a .keras/.h5 file, or a package's directory (`infertune.package`: tuned here
            without TensorFlow; no sample_input then, and only backends, time_budget_s,
            isolation and candidate_timeout_s may be set).
        sample_input: one batch exactly as `model(sample_input)` takes it (array, tf.Tensor,
            list/tuple or dict of them). Axis 0 is the batch.
        backends: candidate names (`infertune.available_backends()`) or Backend instances;
            None tries every candidate that can run here. The model's own call is always
            measured as the reference.
        rtol, atol: output-match tolerance (scale-aware, docs/how-it-works.md).
        objective: "latency" (median per call) or "throughput" (samples/s).
        time_budget_s: budget for the whole call; candidates not reached are "skipped".
        precision: precisions allowed ("fp32", "fp16", "bf16", "int8"); reduced precision is
            judged by `accuracy`, or by agreement with the model, never by rtol/atol.
        cache: a directory for the tuning cache: a result tuned before for the same model,
            signature, options and environment is checked on the sample and returned.
        batch_sizes: batch sizes a service calls at (e.g. [1, 8, 64]): the fastest candidate
            is chosen per batch size; None: the sample's only (the batch must be free).
        latency_budget_ms: with objective="throughput", only choices whose p99 stays within it.
        concurrency: how many callers call the result at once; candidates are measured and
            ranked under that load. 1: one caller (the report says where more would differ).
        isolation: "process" (default: native runtimes rehearse in a child process, so a
            crash or out-of-memory kill fails the candidate, not the caller), "thread"
            (deadlines only) or "off".
        candidate_timeout_s: seconds one candidate may take before it is `timeout`.
        reference: "eager" (default: `model(x)`) or "traced" (`tf.function(model)`, what
            predict() and export() compute).
        calibration: representative inputs static int8 calibrates its ranges on.
        accuracy: `infertune.Accuracy(data=(x, y), metric="accuracy", max_drop=0.01)`: the
            task a reduced-precision candidate must keep.
        traffic: a sample of real requests (inputs as the model takes them, or their shapes):
            buckets over its free dimension's lengths, a candidate each, chosen by measurement,
            padding used only where it is proven exact for this model.
        pad_value: what padding writes (per input name in a dict; default 0).
        free_dims: the free dimensions by name, {"length": ["ids:1", "mask:1"]}; None: found.
        verbose: progress lines on stderr.

    Returns:
        An `Optimized` callable; its `.report` says what was tried and why it was chosen.
    """
    given = dict(
        backends=backends, rtol=rtol, atol=atol, objective=objective,
        time_budget_s=time_budget_s, precision=precision, batch_sizes=batch_sizes,
        latency_budget_ms=latency_budget_ms, concurrency=concurrency, isolation=isolation,
        candidate_timeout_s=candidate_timeout_s, reference=reference, calibration=calibration,
        accuracy=accuracy, traffic=traffic, pad_value=pad_value, free_dims=free_dims,
    )  # fmt: skip
    if sample_input is None and isinstance(model, str | os.PathLike) and is_package(model):
        if cache is not None:
            raise OptionError("cache= is not used when tuning a package yet: leave it out.")
        return _optimize_package(user_path(model), given, verbose)
    if sample_input is None:
        raise OptionError(
            "sample_input is missing: give one batch as model(sample_input) takes it (only a "
            "package's directory is tuned without one)."
        )
    options = Options.checked(**given)
    if cache is not None and not isinstance(cache, str | os.PathLike):
        raise OptionError(
            f"cache must be a directory path or None. Received: cache={cache!r} of type "
            f"{type(cache).__name__}."
        )
    return _optimize(model, sample_input, options, cache, verbose)


def _optimize(
    model: Any, sample_input: Any, options: Options, cache: Any, verbose: bool
) -> Optimized:
    with Progress(verbose) as progress:
        tuning = load_for_tuning(model, sample_input, progress)
        options = read_data(tuning, options, progress)  # checked before any long work
        entry = None
        if cache is not None:
            with progress.timed("cache lookup", text="looking up the tuning cache"):
                entry = CacheEntry(user_path(cache), tuning.source, tuning.signature, options)
                hit = entry.load(tuning.source, tuning.signature, tuning.sample, progress)
            if hit is not None:
                choice, report, saved = hit
                return Optimized(choice, report, options.saved(), saved_from=saved)
        choice, report = tune(tuning, options, progress)
        if entry is not None:
            progress.stage("storing the result in the tuning cache")
            entry.store(choice, report, progress)
        opt = Optimized(choice, report, options.saved())
    # Everything the run built is garbage now (rejected candidates, conversions, reference
    # outputs): hand the freed heap back to the OS instead of leaving it to the allocator,
    # and the pages of the chosen one's weight files its runtime no longer reads.
    release_freed_memory()
    page_out_own_files()
    return opt


def _optimize_package(path: Any, given: dict, verbose: bool) -> Optimized:
    """optimize() of a package: its candidates prepared from its files, here."""
    package = Package.read(path)
    options = package_options(package, given)
    with Progress(verbose) as progress:
        choice, report = tune_package(package, options, progress)
        return Optimized(choice, report, options.saved())


def package(
    model: Any,
    sample_input: Any,
    path: str | os.PathLike,
    *,
    rtol: float = DEFAULTS.rtol,
    atol: float = DEFAULTS.atol,
    objective: str = DEFAULTS.objective,
    precision: Iterable[str] = DEFAULTS.precision,
    batch_sizes: Sequence[int] | None = DEFAULTS.batch_sizes,
    latency_budget_ms: float | None = DEFAULTS.latency_budget_ms,
    concurrency: int = DEFAULTS.concurrency,
    reference: str = DEFAULTS.reference,
    calibration: Any = DEFAULTS.calibration,
    accuracy: Accuracy | None = DEFAULTS.accuracy,
    traffic: Sequence[Any] | None = DEFAULTS.traffic,
    pad_value: Any = DEFAULTS.pad_value,
    free_dims: dict[str, Any] | None = DEFAULTS.free_dims,
    verbose: bool = True,
) -> Path:
    """Write everything tuning needs into the directory `path` (new or empty), with
    TensorFlow, so that `infertune.optimize(path)` tunes on another machine without it: the
    ONNX export and the TFLite conversions, the sample and the verification inputs with the
    model's outputs on them, the calibration and labelled data with the model's outputs, the
    options (they decide the result: set them here), and a manifest with every file's
    sha256. Takes optimize()'s arguments (docs/api.md, "infertune.package"); returns the path."""
    options = Options.checked(
        rtol=rtol, atol=atol, objective=objective, precision=precision,
        batch_sizes=batch_sizes, latency_budget_ms=latency_budget_ms,
        concurrency=concurrency, reference=reference, calibration=calibration,
        accuracy=accuracy, traffic=traffic, pad_value=pad_value, free_dims=free_dims,
    )  # fmt: skip
    with Progress(verbose) as progress:
        tuning = load_for_tuning(model, sample_input, progress)
        options = read_data(tuning, options, progress)
        return make_package(tuning, options, user_path(path), progress)


def available_backends() -> list[str]:
    """Names of the candidates that can run here (`Backend.available()`: their runtime is
    installed, the GPU they need is there), the model's own call first: what `backends=`
    may name to be tried. `infertune env` lists every candidate infertune knows, and why
    each other one cannot run here."""
    names = [DEFAULTS_REFERENCE]
    for name, factory in BACKENDS.items():
        if factory().available() is None:
            names.append(name)
    return names


def load(
    path: str | os.PathLike,
    *,
    model: Any = None,
    sample_input: Any = None,
    on_mismatch: str = "raise",
    verbose: bool = True,
) -> Optimized:
    """Restore a result saved with `Optimized.save(path)`: no tuning, no conversion. Every
    call path is run once before it returns, so that the first call costs what the next do.

    Args:
        path: the directory save() wrote (`~` is expanded).
        model, sample_input: the original model and a sample, needed only to re-tune.
        on_mismatch: what to do when this environment no longer fits the saved result (its
            runtime is missing or cannot load the artifact; the CPU, GPUs or runtime version
            differ from where it was tuned). "raise" (default): raise EnvironmentMismatchError
            where the result cannot run here, and warn where it runs but was tuned elsewhere.
            "retune": run optimize(model, sample_input) again with the saved options instead.
        verbose: progress on stderr while re-tuning.

    Raises:
        ArtifactError: a file was modified, added or removed; not a saved result; written by a
            newer infertune.
        EnvironmentMismatchError: the result cannot run here (with on_mismatch="raise").
    """
    if on_mismatch not in ON_MISMATCH:
        raise OptionError(
            f"on_mismatch must be one of {ON_MISMATCH}. Received: on_mismatch={on_mismatch!r}."
        )
    if on_mismatch == "retune" and (model is None or sample_input is None):
        raise OptionError(
            "on_mismatch='retune' needs the original model and a sample to tune again: pass "
            "model= and sample_input=."
        )
    start = time.perf_counter()
    saved = open_saved(user_path(path))
    problem = saved.unavailable()
    changes = [] if problem else saved.changes()
    retune = on_mismatch == "retune"
    if retune and (problem or changes):
        return _retune(saved.manifest, model, sample_input, problem or "; ".join(changes), verbose)
    if problem:
        raise EnvironmentMismatchError(problem)
    try:
        choice, report = restore(saved)
    except EnvironmentMismatchError as exc:
        if retune:
            return _retune(saved.manifest, model, sample_input, str(exc), verbose)
        raise
    warmed = warm_up(choice)
    report.notes.append(
        f"loaded from '{saved.path}' in {time.perf_counter() - start:.2f} s (saved "
        f"{saved.manifest.get('saved_at', '?')}); not tuned again"
    )
    report.notes.append(warmed)
    if changes:
        words = "; ".join(changes)
        report.notes.append(f"tuned in another environment: {words}")
        warnings.warn(
            f"The result in '{saved.path}' ({saved.general['name']}) was tuned in another "
            f"environment ({words}). It runs and gives the same outputs, but another candidate "
            f"may be faster here: pass model=, sample_input= and on_mismatch='retune' to tune "
            f"again.",
            UserWarning,
            stacklevel=2,
        )
    return Optimized(choice, report, saved.manifest["options"], saved_from=saved)


def _retune(manifest: dict, model: Any, sample_input: Any, reason: str, verbose: bool):
    """optimize() again with the saved options, instead of loading the saved result."""
    opt = _optimize(model, sample_input, Options.from_saved(manifest["options"]), None, verbose)
    opt.report.notes.append(f"tuned again instead of loading the saved result: {reason}")
    return opt
