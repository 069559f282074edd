"""The plan of buckets for a traffic, from what each candidate costs at each length measured.

pipeline/traffic_plan.py measures; this chooses, by dynamic programming over the measured
lengths (`best_plan`): the bucket bounds among them and a candidate per bucket that minimize
the expected latency over the traffic's requests. A bucket pads its requests to its bound,
or runs them at their own lengths where the candidate may and that is cheaper (its steady
latency, interpolated between the lengths measured, plus its cost of switching shapes).
Each bucket beyond the first must save BUCKET_GAIN of the expected latency, and there are at
most MAX_BUCKETS (fewer where each bucket copies the weights: `most_buckets`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..backends import Backend

__all__ = [
    "BUCKET_GAIN",
    "MAX_BUCKETS",
    "BucketChoice",
    "best_plan",
    "best_single",
    "expected",
    "interpolated",
    "most_buckets",
    "waste",
]

MAX_BUCKETS = 6
# A bucket beyond the first must save this share of the expected latency: each holds its
# own prepared state (interpreters, a compile) and its own buffers.
BUCKET_GAIN = 0.01


def interpolated(points: list[int], values: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Values at `at`, linear between the measured points (and beyond, by the last two)."""
    xs, ys = np.asarray(points, float), np.asarray(values, float)
    ok = ~np.isnan(ys)
    xs, ys = xs[ok], ys[ok]
    if len(xs) == 1:
        return np.full(len(at), ys[0])
    result = np.interp(at, xs, ys)
    high = at > xs[-1]
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    result[high] = ys[-1] + slope * (at[high] - xs[-1])
    return result


@dataclass
class BucketChoice:
    """One bucket of a plan: (low, upper], its candidate, padded or at own length, cost."""

    low: int
    upper: int
    name: str
    padded: bool
    cost: float  # ms, summed over the planning requests in it


def _bucket_options(
    low: int,
    upper: int,
    j: int,
    planning: np.ndarray,
    points: list[int],
    costs: dict[str, np.ndarray],
    switch: dict[str, float],
    exact_ok: list[str],
    padding_ok: bool,
) -> BucketChoice | None:
    """The cheapest way to serve the planning requests in (low, upper]."""
    inside = planning[(planning > low) & (planning <= upper)]
    if not len(inside):
        return BucketChoice(low, upper, next(iter(costs)), padding_ok, 0.0)
    best = None
    for name, at in costs.items():
        options = []
        if padding_ok and not math.isnan(at[j]):
            options.append((True, len(inside) * float(at[j])))
        if name in exact_ok and name in switch:
            steady = interpolated(points, at, inside.astype(float))
            options.append((False, float(np.sum(steady)) + len(inside) * switch[name]))
        for pad, cost in options:
            if best is None or cost < best.cost:
                best = BucketChoice(low, upper, name, pad, cost)
    return best


def most_buckets(
    costs: dict[str, np.ndarray],
    contenders: dict[str, Backend],
    weights_bytes: int | None,
    memory_free: int | None,
) -> int:
    """MAX_BUCKETS, or fewer where a measured candidate copies the weights for each bucket
    (Backend.bucket_memory_factor) and half the memory free holds no more copies."""
    factor = max((contenders[name].bucket_memory_factor for name in costs), default=0.0)
    if factor <= 0 or not weights_bytes or memory_free is None:
        return MAX_BUCKETS
    return max(1, min(MAX_BUCKETS, int(0.5 * memory_free / (factor * weights_bytes))))


def best_plan(
    points: list[int],
    planning: np.ndarray,
    costs: dict[str, np.ndarray],
    switch: dict[str, float],
    exact_ok: list[str],
    padding_ok: bool,
    most: int = MAX_BUCKETS,
) -> list[BucketChoice]:
    """The buckets (bounds among `points`) and their candidates of least expected latency,
    each bucket after the first saving BUCKET_GAIN of it, at most `most`."""
    k = len(points)
    bounds = [0, *points]
    # best[b][j]: (cost, plan) covering lengths up to points[j-1] with b buckets.
    best: list[list[tuple[float, list[BucketChoice]] | None]] = [
        [None] * (k + 1) for _ in range(most + 1)
    ]
    best[0][0] = (0.0, [])
    for b in range(1, most + 1):
        for j in range(1, k + 1):
            for i in range(j):
                previous = best[b - 1][i]
                if previous is None:
                    continue
                option = _bucket_options(
                    bounds[i], bounds[j], j - 1, planning, points, costs, switch, exact_ok,
                    padding_ok,
                )  # fmt: skip
                if option is None:
                    continue
                total = previous[0] + option.cost
                if best[b][j] is None or total < best[b][j][0]:
                    best[b][j] = (total, [*previous[1], option])
    plans = [best[b][k] for b in range(1, most + 1) if best[b][k] is not None]
    if not plans:
        return []
    chosen = plans[0]
    for plan in plans[1:]:
        gained = chosen[0] - plan[0]
        if gained > BUCKET_GAIN * chosen[0] * (len(plan[1]) - len(chosen[1])):
            chosen = plan
    return _merged(chosen[1])


def _merged(plan: list[BucketChoice]) -> list[BucketChoice]:
    """Neighbouring buckets that run their requests at their own lengths by one candidate
    are one bucket."""
    merged: list[BucketChoice] = []
    for choice in plan:
        last = merged[-1] if merged else None
        if last and not last.padded and not choice.padded and last.name == choice.name:
            merged[-1] = BucketChoice(
                last.low, choice.upper, last.name, False, last.cost + choice.cost
            )
        else:
            merged.append(choice)
    return merged


def best_single(
    planning: np.ndarray,
    points: list[int],
    costs: dict[str, np.ndarray],
    switch: dict[str, float],
    exact_ok: list[str],
) -> tuple[str | None, float]:
    """The candidate of least expected latency at the requests' own lengths, and that mean."""
    best: tuple[str | None, float] = (None, math.inf)
    for name in exact_ok:
        if name not in switch:
            continue
        mean = float(np.mean(interpolated(points, costs[name], planning.astype(float))))
        mean += switch[name]
        if mean < best[1]:
            best = (name, mean)
    return best


def expected(
    plan: list[BucketChoice],
    planning: np.ndarray,
    points: list[int],
    costs: dict[str, np.ndarray],
    switch: dict[str, float],
) -> dict:
    """The plan's expected mean and p99 ms per request over the planning traffic."""
    per_request = np.zeros(len(planning))
    for choice in plan:
        inside = (planning > choice.low) & (planning <= choice.upper)
        at = costs[choice.name]
        if choice.padded:
            per_request[inside] = at[points.index(choice.upper)]
        else:
            steady = interpolated(points, at, planning[inside].astype(float))
            per_request[inside] = steady + switch.get(choice.name, 0.0)
    return {"mean_ms": float(per_request.mean()), "p99_ms": float(np.percentile(per_request, 99))}


def waste(plan: list[BucketChoice], planning: np.ndarray) -> float:
    """The share of the padded requests' positions that are padding."""
    real = padded_total = 0
    for choice in plan:
        inside = planning[(planning > choice.low) & (planning <= choice.upper)]
        real += int(inside.sum())
        padded_total += choice.upper * len(inside) if choice.padded else int(inside.sum())
    return 1.0 - real / padded_total if padded_total else 0.0
