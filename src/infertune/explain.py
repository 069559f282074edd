"""explain(): where the time goes for this model on this machine, measured, in plain words."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .api import optimize
from .backends import Backend
from .model.source import load_model
from .pipeline.diagnosis import advise, measure_retracing, predict_vs_call
from .report import Diagnosis
from .report.progress import Progress

__all__ = ["explain"]


def explain(
    model: Any,
    sample_input: Any,
    *,
    batch_sizes: Sequence[int] | None = None,
    backends: Sequence[str | Backend] | None = None,
    time_budget_s: float | None = None,
    verbose: bool = True,
) -> Diagnosis:
    """Measure where the time goes for this model on this machine, and say it in plain words.

    Runs optimize() (every path's first call and steady state, eager vs graph), then times
    `model.predict(x)` against `model(x)` and counts the traces a plain tf.function makes
    over `batch_sizes` (default 1, 2, 4, 8). Returns a `Diagnosis`; print it.
    """
    source = load_model(model)
    opt = optimize(
        source, sample_input, backends=backends, time_budget_s=time_budget_s, verbose=verbose
    )
    diagnosis = opt.report.diagnosis
    signature = opt.input_signature
    sample = signature.flatten(sample_input)
    with Progress(verbose) as progress:
        if source.is_keras and hasattr(source.owner, "predict"):
            progress.stage("timing model.predict(x) against model(x)")
            diagnosis.model_call_ms, diagnosis.predict_ms = predict_vs_call(
                source, signature, sample
            )
        if signature.batch_is_dynamic:
            sizes = list(batch_sizes or (1, 2, 4, 8))
            progress.stage(f"counting tf.function traces over batch sizes {sizes}")
            diagnosis.retracing = measure_retracing(
                source.graph_function(signature), signature, sizes, np.random.default_rng(0)
            )
        diagnosis.advice = advise(diagnosis)
    opt.close()
    return diagnosis
