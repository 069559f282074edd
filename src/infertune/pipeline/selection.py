"""Selection: which candidate serves which calls, by the objective, beyond the measured noise.

`select` picks among candidates measured at one batch size; `select_exact_shape` decides
whether a candidate that runs only the sample's exact shapes takes the exact-shape path;
`choose_per_batch` applies `select` at each tuned batch size; `choose` builds the Choice
from the three. The rules are in each function's docstring and docs/how-it-works.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import partial

from ..backends import Backend
from ..errors import ModelError
from ..model.inputs import InputSignature
from ..model.outputs import OutputSignature
from ..options import Options
from ..report import BatchResult, CandidateResult
from ..result.choice import Choice
from .timing import (
    RACE_RATIO,
    LatencyStats,
    clearly_slower,
)

__all__ = [
    "Forced",
    "Selection",
    "choose",
    "forced_choice",
    "choose_per_batch",
    "ranked_by",
    "select",
    "select_exact_shape",
    "settled",
    "threads_of",
    "other_thread_setting",
    "close_call",
]


@dataclass
class Selection:
    """The choice, and the words the report gives it."""

    choice: Choice
    reason: str  # why the candidate serving the sample's shapes was chosen
    general_reason: str = ""  # where there is an exact-shape path: why the general choice
    batches: list[BatchResult] = field(default_factory=list)


def choose(
    results: list[CandidateResult],
    contenders: dict[str, Backend],
    by_batch: dict[int, dict[str, LatencyStats]],
    options: Options,
    inputs: InputSignature,
    outputs: OutputSignature,
    batch_sizes: list[int] | None,
) -> Selection:
    """The Choice from the measured candidates: the general choice among those that run any
    shape, the choice per tuned batch size (with `batch_sizes`), and the exact-shape path
    where a candidate that runs only the sample's shapes is clearly faster there."""
    exact = {name for name, backend in contenders.items() if backend.exact_shapes is not None}
    general, why = select(
        [r for r in results if r.name not in exact], ranked_by(options), options.latency_budget_ms
    )
    fast, fast_why = select_exact_shape(results, exact, general, options)
    batches = (
        choose_per_batch(results, by_batch, general, why, options, inputs.sample_batch)
        if batch_sizes
        else []
    )
    choice = Choice(
        contenders[general.name],
        inputs,
        outputs,
        by_batch={b.batch_size: contenders[b.selected] for b in batches} or None,
        exact_shape=contenders[fast.name] if fast else None,
    )
    if fast:
        return Selection(choice, fast_why, why, batches)
    return Selection(choice, why, "", batches)


@dataclass(frozen=True)
class Forced:
    """A choice given, not measured: the candidate for every shape and, where given, the
    exact-shape path. Tests that need a given winner use it (tests/helpers.py `forced`):
    which candidate the measurement picks depends on the machine and its load."""

    general: str
    exact_shape: str | None = None


def forced_choice(
    forced: Forced,
    results: list[CandidateResult],
    contenders: dict[str, Backend],
    inputs: InputSignature,
    outputs: OutputSignature,
) -> Selection:
    """The Choice `forced` names, from the verified candidates; ModelError naming what
    happened to a named candidate that was not verified."""
    by_name = {r.name: r for r in results}
    for name in filter(None, (forced.general, forced.exact_shape)):
        if name not in contenders:
            result = by_name.get(name)
            what = f"{result.status}: {result.reason}" if result else "not a candidate"
            raise ModelError(f"The forced candidate {name} was not verified ({what}).")
    exact = contenders[forced.exact_shape] if forced.exact_shape else None
    choice = Choice(contenders[forced.general], inputs, outputs, exact_shape=exact)
    by_name[choice.selected.name].status = "selected"
    reason = "forced (not measured)"
    return Selection(choice, reason, reason if exact is not None else "")


def choose_per_batch(
    results: list[CandidateResult],
    by_batch: dict[int, dict[str, LatencyStats]],
    chosen: CandidateResult,
    why: str,
    options: Options,
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
            r.throughput = r.latency.samples_per_s(size)
        picked, picked_why = select(at_size, ranked_by(options), options.latency_budget_ms)
        reasons = {r.name: r.reason for r in at_size if r is not picked}
        choices.append(BatchResult(size, picked.name, picked_why, stats, reasons))
    return choices


def select(
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
    _say_why_not(measured, over_budget, chosen, beaten, tied, objective, latency_budget_ms)
    return chosen, why + close_call(chosen, measured, objective)


def _say_why_not(
    measured: list[CandidateResult],
    over_budget: list[CandidateResult],
    chosen: CandidateResult,
    beaten: dict[int, CandidateResult | None],
    tied: list[CandidateResult],
    objective: str,
    latency_budget_ms: float | None,
) -> None:
    """Each candidate not chosen gets the reason: over the latency budget, within noise of
    the choice, slower than it, or beaten round by round by another."""
    statistic, unit = _STATISTICS[objective]
    cost = partial(_cost, objective=objective)
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


# A choice whose runner-up is within this share of it is a close call, said in the report:
# on an idle machine the runs of optimize() on one model moved by up to 5% (the stability
# benchmark's measure of a repeatable choice), so a runner-up this close may win another run.
CLOSE_CALL = 0.05


def close_call(chosen: CandidateResult, measured: list[CandidateResult], objective: str) -> str:
    """ "; close call: ..." where the runner-up is within CLOSE_CALL of the choice (its name
    and the margin), else ""."""
    cost = partial(_cost, objective=objective)
    others = [r for r in measured if r is not chosen]
    if not others:
        return ""
    runner_up = min(others, key=cost)
    margin = cost(runner_up) / cost(chosen) - 1
    if margin > CLOSE_CALL:
        return ""
    return (
        f"; close call: the runner-up {runner_up.name} is {margin:+.1%} "
        f"({_STATISTICS[objective][1]} {cost(runner_up):.4g} ms)"
    )


def threads_of(name: str) -> int | None:
    """A candidate's thread setting from its name (`:threads=N`), None for the runtime's own
    (every core: ONNX Runtime, OpenVINO, LiteRT's default and TensorFlow)."""
    marker = ":threads="
    if marker not in name:
        return None
    return int(name.split(marker)[1].split(":")[0])


def other_thread_setting(
    chosen: str, results: list[CandidateResult], contenders: dict[str, Backend]
) -> CandidateResult | None:
    """The fastest measured candidate whose thread setting is the other kind than the
    chosen one's (one thread against several), by p50; None where there is none."""
    single = threads_of(chosen) == 1
    other = [
        r
        for r in results
        if r.name != chosen and r.name in contenders and r.latency is not None
        and (threads_of(r.name) == 1) != single and contenders[r.name].exact_shapes is None
    ]  # fmt: skip
    return min(other, key=lambda r: r.latency.p50, default=None)


def settled(
    selection: Selection,
    results: list[CandidateResult],
    contenders: dict[str, Backend],
    winner: str,
    why: str,
    sample_batch: int | None,
) -> Selection:
    """The selection after the head-to-head (pipeline/measuring.py `head_to_head`): the
    general choice `winner`, the sample's batch size served by it too; `why` said in the
    reason (and in the loser's, where the winner changed)."""
    choice = selection.choice
    by_name = {r.name: r for r in results}
    loser = choice.general.name
    if winner == loser:
        selection.reason += f"; {why}"
        return selection
    by_batch = None
    if choice.by_batch is not None:
        by_batch = {**choice.by_batch, sample_batch: contenders[winner]}
    choice = Choice(contenders[winner], choice.inputs, choice.outputs, by_batch=by_batch)
    by_name[loser].status, by_name[loser].reason = "ok", f"lost the head-to-head: {why}"
    by_name[winner].status, by_name[winner].reason = "selected", ""
    for batch in selection.batches:
        if batch.batch_size == sample_batch:
            batch.selected, batch.reason = winner, why
    return Selection(choice, why, "", selection.batches)


def ranked_by(options: Options) -> str:
    """The objective candidates are ranked by: optimize()'s, but "throughput" (the mean call)
    under several callers. There a runtime whose calls contend for the cores is fast in
    some calls and slow in others: its median hides the slow ones, and the mean per call
    under N callers is N / the calls per second a service gets (measured: the demo
    transformer under 2 callers, LiteRT's two-thread interpreters served 4,751 samples/s and
    its one-thread ones 6,396, benchmarks/concurrency.py)."""
    return "throughput" if options.concurrency > 1 else options.objective


# What each objective ranks candidates by: (the per-round statistic, its name in reasons).
_STATISTICS = {"latency": ("median", "p50"), "throughput": ("mean", "mean")}


def _cost(r: CandidateResult, objective: str) -> float:
    """ms per call by the objective's statistic."""
    return r.latency.p50 if objective == "latency" else r.latency.mean


# How far above the lowest median (mean, for throughput) a candidate that nothing beats
# round by round still ties: the stability tolerance of the measurement (pipeline/timing.py).
_TIE_REL = 0.05


def select_exact_shape(
    results: list[CandidateResult], exact: set[str], general: CandidateResult, options: Options
) -> tuple[CandidateResult | None, str]:
    """The candidate among those that run only the sample's exact shapes (`exact`, by name)
    that serves calls at the sample's shapes instead of `general`, the choice among those that
    run any shape; and why. (None, "") where none beats `general`.

    By select's rules among `general` and the exact-shape candidates measured, with one
    more: a tie stays with `general`. A fast path holds a second prepared model and splits
    the calls between two runtimes, so it must be faster beyond noise: clearly faster round
    by round, or its median (mean, for throughput) more than _TIE_REL below, or within the
    latency budget where `general` is not."""
    measured = [
        r for r in results if r.name in exact and r.status == "ok" and r.latency is not None
    ]
    if not measured:
        return None, ""
    stand_in = replace(general, status="ok", reason="")  # select sets its status and reason
    picked, why = select([stand_in, *measured], ranked_by(options), options.latency_budget_ms)
    if picked is stand_in:
        return None, ""
    statistic, unit = _STATISTICS[ranked_by(options)]
    cost = partial(_cost, objective=ranked_by(options))
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
