"""The timing engine: warm-up, interleaved rounds, a stable-median stop, statistics.

Every function timed here must return its result on the host (numpy arrays): backends copy
outputs to host memory inside their call, so no asynchronous device work escapes the clock.
Candidates are timed in interleaved rounds (A B C A B C ...), so that the drift of a shared
machine hits all of them alike; a round gives each candidate a block of about `block_s`,
opened by one untimed call: the switch from another runtime (whose threads may still spin
on the cores) is charged to no one, as it never happens in production. A block ends early
at five times its planned length, so a candidate far slower than its warm-up said cannot
spend the budget in one block.
Measurement stops when every candidate's last three round medians agree within
`stable_rel`, or when the budget runs out; the statistics say how many calls they rest on.
With `callers` > 1, each block is run by that many threads at once (a service's concurrent
requests): every call is timed in the thread that made it, so the statistics are latency per
call under that load, and a block's calls over its wall time are the calls per second in
total (`LatencyStats.calls_per_s`).
A candidate slower than another by far in every round so far (10x in the first, 3x over
two rounds, or `RACE_RATIO` over three or more) leaves the rounds (`LatencyStats.left_after`):
it cannot be chosen, and ResNet50's eager call (300 ms against ONNX Runtime's 17) took half of
every round's time from the candidates that can. `race=False` keeps every one in the rounds: a
benchmark's ratio against a runtime far behind (float32 against int8) rests on its p50.
"""

from __future__ import annotations

import contextlib
import gc
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..errors import one_line

__all__ = [
    "RACE_RATIO",
    "RACE_ROUNDS",
    "EARLY_RACE_RATIO",
    "LatencyStats",
    "MeasureResult",
    "clearly_slower",
    "measure_interleaved",
    "time_once",
    "warm_up",
]


@dataclass(frozen=True)
class LatencyStats:
    """Latency statistics in milliseconds over `n` calls in `rounds` interleaved rounds."""

    p50: float
    p90: float
    p99: float
    mean: float
    min: float
    n: int
    rounds: int
    spread: float  # interquartile range of the per-round medians, ms
    stable: bool  # the last three round medians agreed within the stability tolerance
    round_medians: tuple[float, ...] = ()  # ms, one per interleaved round, in round order
    round_means: tuple[float, ...] = ()
    left_after: int | None = None  # the round it left the measurement in, far behind another
    callers: int = 1  # threads calling at once while it was measured
    calls_per_s: float | None = None  # calls per second in total, all callers together

    @classmethod
    def from_samples(
        cls,
        samples_s: list[float],
        round_medians_s: list[float],
        stable: bool,
        round_means_s: list[float] = (),
        left_after: int | None = None,
        callers: int = 1,
        calls_per_s: float | None = None,
    ) -> LatencyStats:
        ms = np.asarray(samples_s) * 1e3
        rounds_ms = np.asarray(round_medians_s) * 1e3
        if len(rounds_ms) >= 4:
            q25, q75 = np.percentile(rounds_ms, [25, 75])
            spread = float(q75 - q25)
        else:
            spread = float(rounds_ms.max() - rounds_ms.min()) if len(rounds_ms) else 0.0
        p50, p90, p99 = (float(v) for v in np.percentile(ms, [50, 90, 99]))
        return cls(
            p50=p50,
            p90=p90,
            p99=p99,
            mean=float(ms.mean()),
            min=float(ms.min()),
            n=int(ms.size),
            rounds=len(rounds_ms),
            spread=spread,
            stable=stable,
            round_medians=tuple(float(v) for v in rounds_ms),
            round_means=tuple(float(v) * 1e3 for v in round_means_s),
            left_after=left_after,
            callers=callers,
            calls_per_s=calls_per_s,
        )

    def samples_per_s(self, batch: int) -> float:
        """Samples per second in total: each caller's batch, every mean call."""
        return batch * self.callers / (self.mean / 1e3)

    def to_dict(self) -> dict:
        return asdict(self)


def clearly_slower(
    a: LatencyStats,
    b: LatencyStats,
    *,
    statistic: str = "median",
    min_ratio: float = 1.01,
    min_share: float = 0.75,
) -> bool:
    """True when `a` is slower than `b` beyond noise, judged round by round.

    Rounds are interleaved, so round r of `a` and of `b` ran under the same machine load:
    `a` is clearly slower when its median per-round ratio to `b` exceeds `min_ratio` and it
    was slower in at least `min_share` of the rounds. Drift that slows every candidate in
    some rounds cancels out of the ratio. `statistic` is "median" or "mean" per round.
    """
    a_rounds = a.round_medians if statistic == "median" else a.round_means
    b_rounds = b.round_medians if statistic == "median" else b.round_means
    rounds = min(len(a_rounds), len(b_rounds))
    if rounds == 0:
        return a.p50 > b.p50 * min_ratio if statistic == "median" else a.mean > b.mean * min_ratio
    ratios = np.asarray(a_rounds[:rounds]) / np.asarray(b_rounds[:rounds])
    return float(np.median(ratios)) > min_ratio and float(np.mean(ratios > 1.0)) >= min_share


def time_once(fn: Callable[[], Any]) -> tuple[Any, float]:
    """Call `fn` once; return its result and the wall time in seconds."""
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def warm_up(
    fn: Callable[[], Any], min_calls: int = 3, min_s: float = 0.1, max_calls: int = 100
) -> float:
    """Call `fn` at least `min_calls` times and `min_s` seconds; return the median call time."""
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_calls and (
        len(times) < min_calls or time.perf_counter() - start < min_s
    ):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


@dataclass
class MeasureResult:
    stats: dict[str, LatencyStats]
    errors: dict[str, str]  # candidates that raised while being timed: the reason
    seconds: float


def measure_interleaved(
    runners: dict[str, Callable[[], Any]],
    *,
    budget_s: float,
    block_s: float = 0.02,
    min_rounds: int = 5,
    max_rounds: int = 500,
    stable_rel: float = 0.05,
    per_call_estimate_s: dict[str, float] | None = None,
    cooldown_s: dict[str, float] | None = None,
    on_round: Callable[[int, float], None] | None = None,
    callers: int = 1,
    race: bool = True,
    until_decided: bool = False,
) -> MeasureResult:
    """Time every runner in interleaved rounds until all are stable or the budget is spent.

    `per_call_estimate_s` (from warm-up) sets how many calls make one block; the first
    block of a runner whose estimate is missing is a single call. `cooldown_s` is how long
    to wait after a runner's block (its threads spinning on the cores) before the next one.
    `callers`: threads that run each block at once (see the module's docstring). `race`: a
    runner far behind another leaves the rounds (False: every one stays to the end).
    `until_decided`: stop too once the fastest is steady and clearly faster than every other
    one round by round (`_decided`): a choice needs no more, the others' figures rest on
    fewer rounds.
    """
    with _Callers(callers) as pool:
        return _measure(
            runners, pool, budget_s, block_s, min_rounds, max_rounds, stable_rel,
            per_call_estimate_s, cooldown_s, on_round, race, until_decided,
        )  # fmt: skip


def _measure(
    runners, pool, budget_s, block_s, min_rounds, max_rounds, stable_rel, per_call_estimate_s,
    cooldown_s, on_round, race, until_decided=False,
) -> MeasureResult:  # fmt: skip
    cooldown = cooldown_s or {}
    start = time.perf_counter()
    estimate = dict(per_call_estimate_s or {})
    samples: dict[str, list[float]] = {name: [] for name in runners}
    medians: dict[str, list[float]] = {name: [] for name in runners}
    means: dict[str, list[float]] = {name: [] for name in runners}
    busy_s: dict[str, float] = dict.fromkeys(runners, 0.0)  # blocks' wall time, for calls/s
    errors: dict[str, str] = {}
    order = list(runners)
    left: dict[str, int] = {}  # candidates far behind another: the round they left in
    rounds = 0
    while order and rounds < max_rounds:
        # Rotate the order each round: each candidate opens a round in turn (after the
        # previous round's last block and the cooldown), none is always first or last.
        shift = rounds % len(order)
        for name in order[shift:] + order[:shift]:
            calls = max(1, min(1000, int(block_s / max(estimate.get(name, block_s), 1e-7))))
            if not rounds:  # the first round's ratio (FIRST_ROUND_RATIO) rests on a few calls
                calls = max(calls, FIRST_ROUND_CALLS)
            try:
                block, wall = pool.block(runners[name], calls, _BLOCK_OVERRUN * block_s)
            except Exception as exc:  # a runtime failing mid-measurement is reported, not raised
                errors[name] = one_line(exc)
                continue
            if cooldown.get(name):
                time.sleep(cooldown[name])
            busy_s[name] += wall
            samples[name].extend(block)
            medians[name].append(float(np.median(block)))
            means[name].append(float(np.mean(block)))
            estimate[name] = medians[name][-1]
        rounds += 1
        order = [name for name in order if name not in errors]
        for name in _far_behind(order, medians, means) if race else ():
            left[name] = rounds
        order = [name for name in order if name not in left]
        elapsed = time.perf_counter() - start
        if on_round is not None:
            on_round(rounds, elapsed)
        if rounds >= min_rounds and all(_is_stable(medians[n], stable_rel) for n in order):
            break
        per_round = means if pool.size > 1 else medians  # the mean call under several callers
        if until_decided and rounds >= min_rounds and _decided(order, per_round, stable_rel):
            break
        if elapsed >= budget_s and rounds >= 2:
            break
    stats = {
        name: LatencyStats.from_samples(
            samples[name],
            medians[name],
            _is_stable(medians[name], stable_rel),
            means[name],
            left.get(name),
            pool.size,
            len(samples[name]) / busy_s[name] if busy_s[name] > 0 else None,
        )
        for name in runners
        if name not in errors and samples[name]
    }
    return MeasureResult(stats, errors, time.perf_counter() - start)


# A block ends early once it has run this many times its planned length: a candidate whose
# calls turn 1000x slower than its estimate (two runtime threads on a core another process
# spins on: 8 ms instead of 10 us) would otherwise spend the whole budget in one block.
_BLOCK_OVERRUN = 5


class _Callers:
    """The threads that run a block at once: none of its own for one caller (the block runs
    in the measuring thread, as before), else `size` threads started once for the whole
    measurement and released together at each block."""

    def __init__(self, size: int):
        self.size = size
        self._pool = ThreadPoolExecutor(size, "infertune-caller") if size > 1 else None

    def __enter__(self) -> _Callers:
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def block(self, fn: Callable[[], Any], calls: int, max_s: float) -> tuple[list[float], float]:
        """Each caller's `calls` calls of `fn`, timed one by one (after one untimed call
        each); and the block's wall time, from the moment they all started to the last
        one's end. What a caller raised is raised here."""
        if self._pool is None:
            start = time.perf_counter()
            times = _time_block(fn, calls, max_s)
            return times, time.perf_counter() - start
        barrier = threading.Barrier(self.size + 1)

        def one() -> tuple[list[float], float]:
            try:
                fn()  # the switch from the previous candidate, before anyone is timed
            except BaseException:
                barrier.abort()  # the others stop waiting; this error is the block's
                raise
            barrier.wait()
            return _time_block(fn, calls, max_s, untimed_first=False, gc_off=False), (
                time.perf_counter()
            )

        gc_was_enabled = gc.isenabled()
        gc.disable()  # once for all the callers: the flag is the process's, not a thread's
        try:
            futures = [self._pool.submit(one) for _ in range(self.size)]
            with contextlib.suppress(threading.BrokenBarrierError):  # a caller raised: below
                barrier.wait(timeout=_BARRIER_S)
            start = time.perf_counter()
            outcomes = [(f.exception(), f) for f in futures]
        finally:
            if gc_was_enabled:
                gc.enable()
        errors = [e for e, _ in outcomes if e is not None]
        if errors:
            raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)),
                       errors[0])  # fmt: skip
        results = [f.result() for _, f in outcomes]
        return [t for times, _ in results for t in times], max(end for _, end in results) - start


# How long the measuring thread waits for every caller's untimed first call.
_BARRIER_S = 120.0


def _time_block(
    fn: Callable[[], Any],
    calls: int,
    max_s: float = math.inf,
    untimed_first: bool = True,
    gc_off: bool = True,
) -> list[float]:
    """Time `calls` calls, or fewer once `max_s` has passed (one at least), after one untimed
    call that absorbs the switch from the previous candidate (its runtime's threads still
    spinning on the cores, caches full of its data)."""
    times = []
    clock = time.perf_counter
    gc_was_enabled = gc_off and gc.isenabled()
    if gc_off:
        gc.disable()  # a collection inside a timed call is noise that belongs to no candidate
    try:
        if untimed_first:
            fn()
        start = clock()
        for _ in range(calls):
            t0 = clock()
            fn()
            t1 = clock()
            times.append(t1 - t0)
            if t1 - start > max_s:
                break
    finally:
        if gc_was_enabled:
            gc.enable()
    return times


# A candidate leaves the rounds once another was faster than it by more than the ratio, in
# both the round's median and its mean, in every round so far: 10x after the first round
# alone, 3x over the first two rounds, RACE_RATIO from the third on. The selection
# (pipeline/selection.select) keeps only candidates within a few percent of the fastest, and
# a gap that large in each of several interleaved rounds is no load spike.
RACE_RATIO = 1.5
RACE_ROUNDS = 3  # from this round on the ratio is RACE_RATIO
EARLY_RACE_RATIO = 3.0  # over the first RACE_ROUNDS - 1 rounds (two at least)
# After the first round alone, a candidate this much slower than another leaves: a model's
# eager call (ResNet50 128's, 13x OpenVINO's) spends two calls a round in the measurement of
# candidates it cannot beat, and no load spike makes a runtime 10x slower than it is in both
# a round's median and its mean.
FIRST_ROUND_RATIO = 10.0
# Calls in each candidate's first block at least (the block's cap, five times its planned
# length, still ends a slow one after a call): a call can wait whole scheduler ticks (4 ms
# here) where a runtime's workers go from spinning to sleep. On a keras-hub BERT of 0.1 ms a
# call, `onnxruntime-cpu:parallel` (0.13 ms alone) had one call in its first block, from a
# first estimate over 10 ms, and left the rounds on it: its p50 in the report that one call.
FIRST_ROUND_CALLS = 3


def _far_behind(
    order: list[str], medians: dict[str, list[float]], means: dict[str, list[float]]
) -> list[str]:
    """The candidates in `order` that another in it beat by the race's ratio in every round."""
    rounds = len(medians[order[0]]) if order else 0
    if rounds < 1:
        return []
    ratio = (
        FIRST_ROUND_RATIO if rounds == 1 else RACE_RATIO if rounds >= RACE_ROUNDS
        else EARLY_RACE_RATIO
    )  # fmt: skip

    def behind(a: str, b: str) -> bool:
        return all(
            slow > ratio * fast
            for per_round in (medians, means)
            for slow, fast in zip(per_round[a], per_round[b], strict=True)
        )

    return [a for a in order if any(behind(a, b) for b in order if b != a)]


# The measurement of a choice stops once the fastest is faster than every other by more than
# this in the median of their per-round ratios, and in at least DECIDED_SHARE of the rounds:
# beyond the selection's tie (5%), where more rounds change no choice (ResNet50 128: OpenVINO
# 1.12x ahead of the next in every round, and its rounds ran on to nine while one other
# candidate's medians settled, a third of the measurement's 3.2 s).
DECIDED_RATIO = 1.05
DECIDED_SHARE = 0.8


def _decided(order: list[str], per_round: dict[str, list[float]], stable_rel: float) -> bool:
    """Whether the fastest of `order` is steady and clearly ahead of every other one."""
    if len(order) < 2:
        return False
    leader = min(order, key=lambda name: float(np.median(per_round[name])))
    if not _is_stable(per_round[leader], stable_rel):
        return False
    for name in order:
        if name == leader:
            continue
        ratios = np.asarray(per_round[name]) / np.asarray(per_round[leader])
        if not (np.median(ratios) > DECIDED_RATIO and np.mean(ratios > 1.0) >= DECIDED_SHARE):
            return False
    return True


def _is_stable(round_medians: list[float], stable_rel: float) -> bool:
    if len(round_medians) < 3:
        return False
    last = round_medians[-3:]
    center = float(np.median(last))
    return center > 0 and (max(last) - min(last)) / center <= stable_rel
