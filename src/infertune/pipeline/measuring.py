"""The measurement stage: every contender timed in interleaved rounds, at the sample's batch
size and at each other tuned batch size (measure.py is the engine)."""

from __future__ import annotations

import contextlib

import numpy as np

from ..backends import Backend
from ..errors import one_line
from ..inputs import InputSignature
from ..measure import LatencyStats, measure_interleaved, warm_up
from ..options import Options
from ..progress import Progress
from ..report import CandidateResult
from .preparing import Budget

__all__ = ["close_quietly", "measure", "measure_batches"]


def measure_batches(
    contenders: dict[str, Backend],
    sample: list[np.ndarray],
    results: list[CandidateResult],
    signature: InputSignature,
    batch_sizes: list[int] | None,
    options: Options,
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
        stats, errors = measure(
            running,
            inputs,
            options.measure_budget(len(sizes) - i, deadline, after),
            progress,
            where,
            estimates,
        )
        for name, reason in errors.items():
            by_name[name].status, by_name[name].reason = "failed", f"{reason}{where}"
            close_quietly(contenders.pop(name))
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


def measure(
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


def close_quietly(backend: Backend) -> None:
    """Close a candidate that is out; a custom close() that raises must not end optimize()."""
    with contextlib.suppress(Exception):  # what it held goes when it is collected
        backend.close()
