"""Tuning for the shapes traffic has (optimize(traffic=...)): buckets chosen by measurement.

Two halves, as the pipeline has. With the model (`frame_traffic`, in the frame): the padding
check (padding.py), the lengths every candidate will be measured at (spread over the
traffic's lengths, its longest among them: the buckets' possible bounds), and at each, a
request with the model's outputs on it, as at a few held-out lengths: what every bucket is
verified against, kept in a package too. In the contest (`plan_buckets`), after the choice at
the sample's shape:

1. each of the fastest candidates that run any shape is timed at each length (interleaved,
   the machine to itself; one that builds per shape, a TensorRT engine, through an engine
   built for that length), and, where it may run requests at their own lengths, on a stream
   of the traffic's lengths (what switching between shapes costs it: an interpreter resized,
   a compile);
2. the buckets and a candidate per bucket that minimize the expected latency over the
   traffic (bucket_plan.py: dynamic programming over the measured lengths);
3. the plan verified (each bucket at its bound, padded requests against the model's outputs)
   and timed on held-out traffic against the best single candidate at exact shapes,
   interleaved; a plan that is not faster there gives way to that candidate.

A model whose outputs change under padding (padding.py) is served at exact shapes by the
candidate fastest over the traffic's lengths.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..backends import Backend
from ..errors import one_line
from ..model.inputs import InputSignature
from ..model.tolerance import compare_outputs
from ..model.traffic import Traffic, shapes_at
from ..options import REFERENCE_NAMES
from ..report import CandidateResult
from ..report.progress import Progress
from ..result.buckets import Bucket, Buckets
from .bucket_plan import (
    BucketChoice,
    best_plan,
    best_single,
    expected,
    interpolated,
    most_buckets,
    waste,
)
from .exclusive import Exclusive
from .padding import PaddingCheck, check_padding
from .reference import Check
from .timing import clearly_slower, measure_interleaved

__all__ = [
    "TrafficFrame",
    "TrafficPlan",
    "frame_traffic",
    "plan_buckets",
    "tournament_requests",
    "traffic_words",
]

# The quantiles of the traffic's lengths the candidates are measured at (the buckets'
# possible bounds), the longest always among them.
LENGTH_QUANTILES = (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)
# Candidates measured at the lengths: the fastest at the sample's shape, the choice among them.
MEASURED = 4
TOURNAMENT = 6  # requests of the traffic's lengths the tournament times candidates on
HELD_OUT = 0.25  # the share of the traffic kept for the plan's own timing
HELD_OUT_MAX = 64  # requests of it timed, at most
STREAM = 16  # requests in the stream that times each candidate's switching between lengths
LENGTH_BUDGET_S = 0.3  # measurement at one length, every candidate
# The held-out timing: rounds over the stream (each plan once a round, interleaved), the
# seconds it may take, and the longest pass over the stream.
HELD_OUT_ROUNDS = 5
HELD_OUT_BUDGET_S = 1.5
HELD_OUT_PASS_S = 0.1


@dataclass
class TrafficFrame:
    """What the frame knows of the traffic, with the model: see the module's doc."""

    traffic: Traffic
    pad_values: tuple
    dim_index: int | None  # the dimension buckets pad; None: served at exact shapes
    padding: PaddingCheck | None
    lengths: list[int] = field(default_factory=list)  # where candidates are measured
    checks: dict[int, Check] = field(default_factory=dict)  # length -> request + outputs
    # The same at each length measured, at another batch size (`_other_batch`), where the
    # batch is free: a bucket serves every batch size (a TensorRT bucket's engine, from
    # batch 1 to its profile's bound), verified at two.
    batch_checks: dict[int, Check] = field(default_factory=dict)
    held_out: list[int] = field(default_factory=list)  # rows of the traffic kept apart
    why_exact: str = ""  # why the requests run at exact shapes, where they do


@dataclass
class TrafficPlan:
    """What the contest made of the traffic: the buckets (None: exact shapes), and the
    figures the report gives."""

    buckets: Buckets | None
    summary: dict


def frame_traffic(
    traffic: Traffic,
    signature: InputSignature,
    call: Callable[[list[np.ndarray]], list[np.ndarray]],
    pad_values: tuple,
    rtol: float,
    atol: float,
    progress: Progress,
) -> TrafficFrame:
    """The padding check, the lengths to measure at and the model's outputs there."""
    rng = np.random.default_rng(11)
    rows = rng.permutation(len(traffic))
    held = sorted(rows[: max(1, int(len(traffic) * HELD_OUT))].tolist()) if len(traffic) > 3 else []
    frame = TrafficFrame(traffic, pad_values, None, None, held_out=held)
    if not traffic.dims:
        frame.why_exact = (
            "the model has no free dimension besides the batch: the traffic's batch sizes are "
            "tuned as batch_sizes= tunes them"
        )
        return frame
    if len(traffic.dims) > 1:
        frame.why_exact = (
            f"buckets pad one free dimension; this model has {len(traffic.dims)} "
            f"({', '.join(d.name for d in traffic.dims)})"
        )
        return frame
    planning = np.setdiff1d(np.arange(len(traffic)), held) if held else np.arange(len(traffic))
    lengths = traffic.lengths(0)[planning]
    quantiles = np.quantile(lengths, LENGTH_QUANTILES, method="higher")
    # The longest request of the whole traffic among them, held-out rows included: the last
    # bucket then reaches every length seen.
    frame.lengths = sorted({*(int(v) for v in quantiles), int(traffic.lengths(0).max())})
    with progress.timed("padding check", text="checking that padding changes no output"):
        frame.padding = check_padding(call, signature, traffic, 0, pad_values, rtol, atol)
    if frame.padding.exact:
        frame.dim_index = 0
    else:
        frame.why_exact = frame.padding.reason
    batch = int(np.median(traffic.batches))
    held_lengths = sorted({int(traffic.lengths(0)[row]) for row in held})[:: max(1, len(held) // 4)]
    other = _other_batch(traffic, signature)
    with progress.timed("traffic checks", text="the model at the traffic's lengths"):
        for n in dict.fromkeys([*frame.lengths, *held_lengths]):
            x = signature.random_inputs(rng, shapes=shapes_at(signature, traffic.dims, batch, [n]))
            frame.checks[n] = Check(f"a request of length {n}", x, call(x))
        for n in frame.lengths if other is not None else ():
            x = signature.random_inputs(rng, shapes=shapes_at(signature, traffic.dims, other, [n]))
            frame.batch_checks[n] = Check(f"a request of length {n} at batch {other}", x, call(x))
    return frame


def _other_batch(traffic: Traffic, signature: InputSignature) -> int | None:
    """The batch size the buckets are verified at besides the traffic's median: its largest
    where it is larger, else 1 (2 where the median is 1); None where the batch is fixed."""
    if not signature.batch_is_dynamic:
        return None
    median, largest = int(np.median(traffic.batches)), int(traffic.batches.max())
    return largest if largest > median else (2 if median == 1 else 1)


def plan_buckets(
    frame: TrafficFrame,
    signature: InputSignature,
    results: list[CandidateResult],
    contenders: dict[str, Backend],
    chosen: str,
    rtol: float,
    atol: float,
    progress: Progress,
    exclusive: Exclusive | None,
    weights_bytes: int | None = None,
    memory_free: int | None = None,
) -> TrafficPlan:
    """The buckets for the traffic (see the module's doc), or the best candidate at exact
    shapes where buckets do not win (or padding is not exact). `weights_bytes` and
    `memory_free` bound the buckets of a runtime that copies the weights for each."""
    traffic = frame.traffic
    summary: dict = {"traffic": traffic.describe(), "requests": len(traffic)}
    if not frame.lengths:
        summary["exact_only"] = frame.why_exact
        return TrafficPlan(None, summary)
    names = _measured_names(results, contenders, chosen)
    with progress.timed("lengths", text="timing the candidates at the traffic's lengths"):
        costs = _costs_at_lengths(frame, signature, names, contenders, progress, exclusive)
    exact_ok = [n for n in names if n in costs and _runs_each_length(contenders[n])]
    with progress.timed("switching", text="timing each candidate on a stream of lengths"):
        switch = _switching_costs(frame, signature, exact_ok, contenders, costs, exclusive)
    planning = _planning_lengths(frame)
    summary.update(
        lengths=frame.lengths,
        histogram=_histogram(planning),
        p50_ms={n: costs[n].tolist() for n in costs},
        switch_ms=switch,
    )
    padding_ok = frame.dim_index is not None
    most = most_buckets(costs, contenders, weights_bytes, memory_free)
    plan = best_plan(frame.lengths, planning, costs, switch, exact_ok, padding_ok, most)
    single = best_single(planning, frame.lengths, costs, switch, exact_ok)
    padded_max = min(
        ((n, float(c[-1])) for n, c in costs.items() if not math.isnan(c[-1])),
        key=lambda pair: pair[1], default=(None, math.nan),
    )  # fmt: skip
    exact_plan = [BucketChoice(0, frame.lengths[-1], single[0], False, 0.0)] if single[0] else []
    single_p99 = expected(exact_plan, planning, frame.lengths, costs, switch)["p99_ms"]
    summary.update(
        expected=expected(plan, planning, frame.lengths, costs, switch),
        exact_single={"candidate": single[0], "mean_ms": single[1], "p99_ms": single_p99},
        padded_to_max={
            "candidate": padded_max[0],
            "mean_ms": padded_max[1],
            "p99_ms": padded_max[1],
        },
        padding=frame.padding.to_dict() if frame.padding else None,
        exact_only=frame.why_exact or None,
        waste=waste(plan, planning),
        planned=_bucket_rows(plan, planning, costs, frame.lengths),
        beyond=single[0],
    )
    if single[0] is None:
        summary["kept"] = "no candidate ran the traffic's lengths"
        return TrafficPlan(None, summary)
    exact = _exact_buckets(contenders[single[0]], frame)
    if all(not c.padded and c.name == single[0] for c in plan):
        summary["kept"] = f"every request at its own length by {single[0]}"
        return TrafficPlan(exact, summary)
    # The plan and, where it has more than two buckets, the best of at most two: timed with
    # the best single candidate at exact shapes on held-out traffic, the fastest kept.
    plans = {"the buckets": plan}
    fewer = best_plan(frame.lengths, planning, costs, switch, exact_ok, padding_ok, 2)
    if len(plan) > 2 and fewer and fewer != plan:
        plans["two buckets"] = fewer
    tried = {label: _buckets(p, contenders, frame, single[0]) for label, p in plans.items()}
    for label, buckets in list(tried.items()):
        problem = _verify(buckets, frame, rtol, atol)
        if problem is not None:
            summary.setdefault("failed", {})[label] = problem
            buckets.release()
            del tried[label]
    held = _held_out_timing({**tried, "exact": exact}, frame, signature, progress, exclusive)
    summary["held_out"] = {k: v for k, v in held.items() if k != "stats"} if held else None
    best = _fastest(held, tried)
    for label, buckets in tried.items():
        if label != best:
            buckets.release()
    if best is None:
        summary["kept"] = f"exact shapes by {single[0]}: {_why_exact(held, summary)}"
        return TrafficPlan(exact, summary)
    summary["kept"] = best
    if best != "the buckets":
        summary["planned"] = _bucket_rows(plans[best], planning, costs, frame.lengths)
        summary["expected"] = expected(plans[best], planning, frame.lengths, costs, switch)
        summary["waste"] = waste(plans[best], planning)
    summary["buckets"] = summary["planned"]
    return TrafficPlan(tried[best], summary)


def _runs_each_length(backend: Backend) -> bool:
    """Whether a candidate may run requests at their own lengths: not one that compiles
    (XLA) or builds an engine (TensorRT) for each new shape."""
    return not backend.compiles_per_shape and not backend.builds_per_shape


def _fastest(held: dict | None, tried: dict[str, Buckets]) -> str | None:
    """The bucket plan clearly faster than every request at its own length on the held-out
    traffic (round by round), the fastest of those; None where none is."""
    if held is None:
        return next(iter(tried), None)
    stats = held["stats"]
    faster = [
        label for label in tried
        if label in stats and clearly_slower(stats["exact"], stats[label])
    ]  # fmt: skip
    return min(faster, key=lambda label: stats[label].p50, default=None)


def _why_exact(held: dict | None, summary: dict) -> str:
    if held is None:
        return f"the buckets failed verification ({summary.get('failed')})"
    words = ", ".join(f"{label} {ms:.4g}" for label, ms in held["ms"].items())
    return f"on held-out traffic no plan of buckets was clearly faster (ms a request: {words})"


def _bucket_rows(
    plan: list[BucketChoice], planning: np.ndarray, costs: dict[str, np.ndarray], points: list[int]
) -> list[dict]:
    """The plan's buckets for the report: bound, candidate, padded, share of the planning
    requests, p50 at the bound."""
    return [
        {
            "upper": c.upper, "candidate": c.name, "padded": c.padded,
            "share": float(np.mean((planning <= c.upper) & (planning > c.low))),
            "p50_ms": float(costs[c.name][points.index(c.upper)]),
        }
        for c in plan
    ]  # fmt: skip


# -- measuring ------------------------------------------------------------------------------
def _measured_names(
    results: list[CandidateResult], contenders: dict[str, Backend], chosen: str
) -> list[str]:
    """The MEASURED fastest candidates that run any shape, or build for each (by p50 at the
    sample's), the choice among them; not the model's own call (the reference), unless it
    is the choice."""
    ranked = sorted(
        (r for r in results if r.name in contenders and r.latency is not None
         and _any_length(contenders[r.name])
         and (r.name not in REFERENCE_NAMES or r.name == chosen)),
        key=lambda r: r.latency.p50,
    )  # fmt: skip
    names = [r.name for r in ranked[:MEASURED]]
    if chosen in contenders and chosen not in names and _any_length(contenders[chosen]):
        names[-1:] = [chosen]
    return names


def _any_length(backend: Backend) -> bool:
    """Whether a candidate can be timed at the traffic's lengths: it runs any shape, or it
    builds for each (a TensorRT engine: exact shapes at the sample's, shaped runners)."""
    return backend.exact_shapes is None or backend.builds_per_shape


def _request(frame: TrafficFrame, signature: InputSignature, n: int) -> list[np.ndarray]:
    return (
        frame.checks[n].inputs
        if n in frame.checks
        else signature.random_inputs(
            np.random.default_rng(n),
            shapes=shapes_at(
                signature, frame.traffic.dims, int(np.median(frame.traffic.batches)), [n]
            ),
        )
    )


def tournament_requests(
    frame: TrafficFrame, signature: InputSignature
) -> list[list[np.ndarray]] | None:
    """Requests at TOURNAMENT lengths of the traffic, its quantiles at the middles of equal
    shares (their mean time: the mean over the traffic's, roughly): what the tournament
    (tournament.py), where memory is tight, times candidates on, so that the one kept is
    the fastest over the traffic, not at the sample's length. None without a free length."""
    if not frame.lengths:
        return None
    shares = (np.arange(TOURNAMENT) + 0.5) / TOURNAMENT
    lengths = np.quantile(_planning_lengths(frame), shares, method="nearest")
    return [_request(frame, signature, int(n)) for n in lengths]


def _costs_at_lengths(
    frame: TrafficFrame,
    signature: InputSignature,
    names: list[str],
    contenders: dict[str, Backend],
    progress: Progress,
    exclusive: Exclusive | None,
) -> dict[str, np.ndarray]:
    """p50 ms of each candidate at each length (nan where it failed there), all of them
    timed together at each length, the machine to themselves. A candidate that builds per
    shape (Backend.builds_per_shape: a TensorRT engine) is timed through a shaped runner of
    that length, as a bucket padded to it would run, released after the length."""
    costs = {name: np.full(len(frame.lengths), np.nan) for name in names}
    for j, n in enumerate(frame.lengths):
        x = _request(frame, signature, n)
        runners, closers = {}, []
        for name in names:
            backend = contenders[name]
            run = backend.run
            if backend.builds_per_shape:
                run = backend.shaped_runner()
                if (close := getattr(run, "close", None)) is not None:
                    closers.append(close)
            try:
                run(x)  # a new shape's first call: a compile, an allocation, an engine built
            except Exception:
                continue
            runners[name] = lambda run=run, x=x: run(x)
        progress.stage(f"timing {len(runners)} candidates at length {n}", log=False)
        guard = exclusive.timing() if exclusive is not None else _nothing()
        try:
            with guard:
                measured = measure_interleaved(
                    runners, budget_s=LENGTH_BUDGET_S, min_rounds=3,
                    cooldown_s={name: contenders[name].cooldown_s for name in runners},
                )  # fmt: skip
        finally:
            for close in closers:
                close()
        for name, stats in measured.stats.items():
            costs[name][j] = stats.p50
    return {name: c for name, c in costs.items() if not np.isnan(c).all()}


def _switching_costs(
    frame: TrafficFrame,
    signature: InputSignature,
    names: list[str],
    contenders: dict[str, Backend],
    costs: dict[str, np.ndarray],
    exclusive: Exclusive | None,
) -> dict[str, float]:
    """ms a call costs each candidate beyond its steady time at the call's length, where the
    lengths change from call to call (a stream of the traffic's): an interpreter resized at
    each new shape, caches filled again."""
    planning = _planning_lengths(frame)
    rng = np.random.default_rng(3)
    stream_lengths = rng.choice(planning, size=min(STREAM, len(planning)), replace=False)
    batch = int(np.median(frame.traffic.batches))
    stream = [
        signature.random_inputs(rng, shapes=shapes_at(signature, frame.traffic.dims, batch, [n]))
        for n in stream_lengths
    ]
    switch = {}
    guard = exclusive.timing() if exclusive is not None else _nothing()
    with guard:
        for name in names:
            run = contenders[name].run
            try:
                for x in stream:  # warm: every length seen once
                    run(x)
                start = time.perf_counter()
                for x in stream:
                    run(x)
                mean_ms = (time.perf_counter() - start) * 1e3 / len(stream)
            except Exception:
                continue
            steady = float(np.mean(interpolated(frame.lengths, costs[name], stream_lengths)))
            switch[name] = max(0.0, mean_ms - steady)
    return switch


def _nothing() -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


# -- planning -------------------------------------------------------------------------------
def _planning_lengths(frame: TrafficFrame) -> np.ndarray:
    rows = np.setdiff1d(np.arange(len(frame.traffic)), frame.held_out)
    if not len(rows):
        rows = np.arange(len(frame.traffic))
    return frame.traffic.lengths(0)[rows]


def _histogram(lengths: np.ndarray, bins: int = 24) -> dict:
    counts, edges = np.histogram(lengths, bins=min(bins, max(1, len(np.unique(lengths)))))
    return {"counts": counts.tolist(), "edges": edges.tolist()}


# -- the plan as buckets, verified and timed ------------------------------------------------
def _buckets(
    plan: list[BucketChoice], contenders: dict[str, Backend], frame: TrafficFrame, beyond: str
) -> Buckets:
    padding = frame.padding
    traffic = frame.traffic
    return Buckets(
        traffic.dims[0],
        [Bucket(c.upper, contenders[c.name], c.padded) for c in plan],
        contenders[beyond],
        frame.pad_values,
        padding.sliced if padding is not None else (),
    )


def _exact_buckets(backend: Backend, frame: TrafficFrame) -> Buckets:
    """Every request at its own length by one candidate (no padding): one bucket."""
    padding = frame.padding
    return Buckets(
        frame.traffic.dims[0], [], backend, frame.pad_values,
        padding.sliced if padding is not None else (),
    )  # fmt: skip


def _verify(buckets: Buckets, frame: TrafficFrame, rtol: float, atol: float) -> str | None:
    """Every stored request (each bucket's bound at two batch sizes, held-out lengths) through
    the buckets against the model's outputs on it; None where all match, else what failed."""
    run = buckets.run
    for n, check in [*frame.checks.items(), *frame.batch_checks.items()]:
        try:
            got = run(check.inputs)
        except Exception as exc:
            return f"{check.label}: {one_line(exc)}"
        comparison = compare_outputs(got, check.reference, rtol, atol)
        if not comparison:
            bucket = buckets.bucket_for(n)
            who = bucket.backend.name if bucket else buckets.beyond.name
            return f"{check.label} by {who}: {comparison.reason}"
    return None


def _held_out_timing(
    plans: dict[str, Buckets],
    frame: TrafficFrame,
    signature: InputSignature,
    progress: Progress,
    exclusive: Exclusive | None,
) -> dict | None:
    """Each plan (the exact-shape one among them) run over the same held-out requests, the
    plans timed in interleaved rounds (one call a request stream, at least HELD_OUT_ROUNDS
    rounds, every plan to the end): ms a request of each, and their statistics. The stream
    holds HELD_OUT_MAX requests at most, fewer where a plan's first (untimed) pass takes
    over HELD_OUT_PASS_S."""
    rows = frame.held_out[:HELD_OUT_MAX]
    if not rows or not any(label != "exact" for label in plans):
        return None
    traffic = frame.traffic
    rng = np.random.default_rng(5)
    stream = [
        traffic.requests[row] if traffic.requests is not None
        else signature.random_inputs(rng, shapes=traffic.shapes(row, signature))
        for row in rows
    ]  # fmt: skip
    runs = {label: buckets.run for label, buckets in plans.items()}
    count = len(stream)
    for run in runs.values():  # warm: every runtime has seen every shape it is timed on
        start = time.perf_counter()
        for i, x in enumerate(stream[:count]):
            run(x)
            if i + 1 >= 4 and time.perf_counter() - start > HELD_OUT_PASS_S:
                count = i + 1  # a long model: fewer requests a pass
                break
    stream = stream[:count]
    runners = {label: (lambda run=run: [run(x) for x in stream]) for label, run in runs.items()}
    text = f"timing {len(runners)} plans on {len(stream)} held-out requests"
    guard = exclusive.timing() if exclusive is not None else _nothing()
    with progress.timed("held-out traffic", text=text), guard:
        measured = measure_interleaved(
            runners, budget_s=HELD_OUT_BUDGET_S, min_rounds=HELD_OUT_ROUNDS, race=False,
            per_call_estimate_s=dict.fromkeys(runners, HELD_OUT_PASS_S),
        )  # fmt: skip
    stats = measured.stats
    return {
        "requests": len(stream),
        "rounds": min((s.rounds for s in stats.values()), default=0),
        "ms": {label: s.p50 / len(stream) for label, s in stats.items()},
        "plan_ms": min(
            (s.p50 / len(stream) for label, s in stats.items() if label != "exact"),
            default=math.nan,
        ),
        "exact_ms": stats["exact"].p50 / len(stream) if "exact" in stats else math.nan,
        "exact": plans["exact"].beyond.name,
        "stats": stats,
    }


def traffic_words(plan: TrafficPlan) -> str:
    """The plan in one line: the traffic, the buckets (or why exact shapes), the expected
    mean against the best single candidate at exact shapes and against padding to the
    longest, and the held-out timing."""
    s = plan.summary
    words = [f"traffic: {s['traffic']}"]
    if s.get("exact_only"):
        words.append(f"padding not used: {s['exact_only']}")
    if plan.buckets is None or not plan.buckets.buckets:
        who = plan.buckets.beyond.name if plan.buckets is not None else "the choice above"
        words.append(f"every request at its own length by {who}")
        if s.get("kept") and not s["kept"].startswith("every request"):
            words.append(s["kept"])
    else:
        low = 0
        parts = []
        for bucket in plan.buckets.buckets:
            how = f"padded to {bucket.upper}" if bucket.padded else "at its own length"
            parts.append(f"({low}, {bucket.upper}] {bucket.backend.name} {how}")
            low = bucket.upper
        parts.append(f"longer: {plan.buckets.beyond.name}")
        words.append("buckets " + "; ".join(parts))
    expected = s.get("expected")
    if expected:
        single, to_max = s["exact_single"], s["padded_to_max"]
        line = (
            f"expected {expected['mean_ms']:.4g} ms a request (p99 {expected['p99_ms']:.4g}); "
            f"best at exact shapes {single['candidate']} {single['mean_ms']:.4g} ms"
        )
        if not s.get("exact_only"):  # padding to the longest is no option where it is inexact
            line += f"; padded to the longest {to_max['candidate']} {to_max['mean_ms']:.4g} ms"
        words.append(line)
    held = s.get("held_out")
    if held:
        words.append(
            f"held-out traffic ({held['requests']} requests): {held['plan_ms']:.4g} ms a "
            f"request against {held['exact']} at exact shapes {held['exact_ms']:.4g} ms"
        )
    return "; ".join(words)
