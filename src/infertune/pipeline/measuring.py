"""The measurement stage: every contender timed in interleaved rounds, at the sample's batch
size and at each other tuned batch size (pipeline/timing.py is the engine)."""

from __future__ import annotations

import contextlib
import time

import numpy as np

from ..backends import Backend
from ..errors import one_line
from ..model.inputs import InputSignature
from ..model.tolerance import compare_outputs
from ..options import Options
from ..report import CandidateResult
from ..report.progress import Progress
from .budget import Budget
from .exclusive import Exclusive
from .reference import Check
from .selection import threads_of
from .timing import LatencyStats, clearly_slower, measure_interleaved, warm_up

__all__ = ["close_quietly", "concurrency_note", "head_to_head", "measure", "measure_batches"]


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
    exclusive: Exclusive | None = None,
    fastest: int | None = None,
    deferred: dict[str, list[Check]] | None = None,
) -> dict[int, dict[str, LatencyStats]]:
    """Measure every contender at the sample's batch size (its statistics go into `results`)
    and at each other tuned batch size, on random inputs drawn like the sample (an exact-shape
    candidate, at the sample's only). A candidate that fails at any batch size is `failed`
    and closed. Returns {batch: {name: stats}}.

    `call_estimates`: seconds per call at the sample's batch size seen in verification; a
    candidate with one needs no warm-up there (its verification calls were its warm-up).
    `exclusive`: the run's turns of work and timing, which every timing here takes.
    `fastest`: at the other batch sizes, only this many of the fastest at the sample's are
    timed, in one size's time between them (None: every one, each in its own);
    optimize(traffic=...) times its lengths the same way.
    `deferred`: by name, checks at other batch sizes left from verification (a candidate
    that compiles for each shape, with `fastest`): run where it is timed at their size, a
    mismatch there closing it as verification would have."""
    sizes = batch_sizes or [signature.sample_batch]
    by_name = {r.name: r for r in results}
    rng = np.random.default_rng(1)
    measured = {}
    leaders: list[str] = []  # with `fastest`: the fastest at the sample's batch size
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
            if size == signature.sample_batch
            or (backend.exact_shapes is None and (fastest is None or name in leaders))
        }
        for name in [n for n in running if (deferred or {}).get(n)]:
            failure = _verify_deferred(running[name], deferred[name], size, options, by_name[name])
            if failure is not None:
                by_name[name].status, by_name[name].reason = failure
                close_quietly(contenders.pop(name))
                del running[name]
        budget_s = options.measure_budget(len(sizes) - i, deadline, after)
        if fastest is not None and i > 0:  # the other sizes share one size's time
            budget_s /= len(sizes) - 1
        stats, errors = measure(
            running,
            inputs,
            budget_s,
            progress,
            where,
            estimates,
            options.concurrency,
            exclusive,
        )
        for name, reason in errors.items():
            by_name[name].status, by_name[name].reason = "failed", f"{reason}{where}"
            close_quietly(contenders.pop(name))
        measured[size] = stats
        if i == 0 and fastest is not None:
            leaders = sorted(
                (n for n in stats if n in contenders and contenders[n].exact_shapes is None),
                key=lambda n: stats[n].p50,
            )[:fastest]
    batch = signature.sample_batch or 1
    for name, stats in measured[signature.sample_batch].items():
        if name in contenders:
            by_name[name].latency = stats
            by_name[name].throughput = stats.samples_per_s(batch)
    return {
        size: {name: s for name, s in stats.items() if name in contenders}
        for size, stats in measured.items()
    }


def _verify_deferred(
    backend: Backend, checks: list[Check], size: int, options: Options, result: CandidateResult
) -> tuple[str, str] | None:
    """Its deferred checks at batch `size` against the model's outputs (the verification
    rule, the errors into its result); (status, reason) where one fails, else None."""
    for check in checks:
        if check.batch != size:
            continue
        try:
            outputs = backend.run(check.inputs)
        except Exception as exc:
            return "failed", f"verification on {check.label}: {one_line(exc)}"
        found = compare_outputs(outputs, check.reference, options.rtol, options.atol)
        result.max_abs_err = max(result.max_abs_err or 0.0, found.max_abs_err)
        result.max_rel_err = max(result.max_rel_err or 0.0, found.max_rel_err)
        if not found:
            return "mismatch", f"on {check.label}: {found.reason}"
    return None


def measure(
    contenders: dict[str, Backend],
    inputs: list[np.ndarray],
    budget_s: float,
    progress: Progress,
    where: str = "",
    known: dict[str, float] | None = None,
    callers: int = 1,
    exclusive: Exclusive | None = None,
) -> tuple[dict[str, LatencyStats], dict[str, str]]:
    """Warm up, then time all contenders on `inputs` in interleaved rounds, each block run by
    `callers` threads at once. Returns their statistics and, for those that raised, the
    reason. A contender whose seconds per call on inputs like these are `known` (from its
    verification calls) needs no warm-up."""
    runners = {name: (lambda b=backend: b.run(inputs)) for name, backend in contenders.items()}
    estimates, errors = {}, {}
    known = known or {}
    with exclusive.timing() if exclusive is not None else contextlib.nullcontext():
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
        under = f" under {callers} concurrent callers" if callers > 1 else ""
        progress.say(
            f"measuring {len(runners)} candidates{where}{under} in interleaved rounds (up to "
            f"{budget_s:.1f} s)"
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
                callers=callers,
                until_decided=True,
            )
    errors.update({name: f"measurement: {reason}" for name, reason in measured.errors.items()})
    return measured.stats, errors


def close_quietly(backend: Backend) -> None:
    """Close a candidate that is out; a custom close() that raises must not end optimize()."""
    with contextlib.suppress(Exception):  # what it held goes when it is collected
        backend.close()


# The callers the one-line check measures at, where optimize() was asked for one caller, and
# the loss it reports: more than this share of samples/s behind another candidate there.
CHECKED_CALLERS = (2, 4)
LOSS_WORTH_SAYING = 0.10
# It is cheap only for calls this short: a few rounds of a few candidates stay under a second
# (at 13 ms a call, ResNet50 128's OpenVINO, the check took 2.0 s of optimize()'s 23).
_CHECK_MAX_CALL_S = 0.005
_CHECK_CANDIDATES = 4  # the choice and the three fastest others


def concurrency_note(
    chosen: str,
    results: list[CandidateResult],
    contenders: dict[str, Backend],
    inputs: list[np.ndarray],
    batch: int,
    options: Options,
    progress: Progress,
    memory_tight: bool = False,
    exclusive: Exclusive | None = None,
) -> str | None:
    """With one caller asked for: how much the choice would lose under 2 and 4 callers
    where another candidate does better there by more than LOSS_WORTH_SAYING, in one line
    (None where it would not, or where the check is not cheap: calls over 20 ms, or a time
    budget). The choice and the fastest few others are measured again under each load.
    Not where memory is tight: of the candidates that copy the weights only one is left
    (tournament.keep), and each caller of a TensorFlow candidate may hold a copy of its own
    of a variable in copy-on-read mode (an embedding table a sparse read touched: TensorFlow
    copies it on every read; the 2.46 GB recommender held 7.5 GB more under 4 callers,
    kept by TensorFlow's allocator to the end)."""
    if options.concurrency != 1 or options.time_budget_s is not None or memory_tight:
        return None
    measured = sorted(
        (r for r in results if r.status in ("ok", "selected") and r.latency is not None),
        key=lambda r: r.latency.p50,
    )
    if chosen not in contenders or len(measured) < 2:
        return None
    if next(r for r in measured if r.name == chosen).latency.p50 / 1e3 > _CHECK_MAX_CALL_S:
        return None
    others = [r.name for r in measured if r.name != chosen and r.name in contenders]
    names = [chosen, *others[: _CHECK_CANDIDATES - 1]]
    runners = {name: (lambda b=contenders[name]: b.run(inputs)) for name in names}
    budget_s = min(0.5, options.measure_budget() / 4)
    start = time.perf_counter()
    losses = []
    with (
        progress.timed("concurrency check", text="measuring the choice under 2 and 4 callers"),
        exclusive.timing() if exclusive is not None else contextlib.nullcontext(),
    ):
        for callers in CHECKED_CALLERS:
            stats = measure_interleaved(
                runners, budget_s=budget_s, min_rounds=3, callers=callers,
                cooldown_s={name: contenders[name].cooldown_s for name in names},
            ).stats  # fmt: skip
            if chosen not in stats:
                continue
            rate = {name: s.samples_per_s(batch) for name, s in stats.items()}
            best = max(rate, key=rate.get)
            if best != chosen and rate[best] > rate[chosen] * (1 + LOSS_WORTH_SAYING):
                losses.append(
                    f"{callers} callers: {best} {rate[best]:,.0f} samples/s against "
                    f"{rate[chosen]:,.0f} (the choice loses {1 - rate[chosen] / rate[best]:.0%})"
                )
    for name in names:  # the pools several callers grew stay one call's size
        contenders[name].trim()
    if not losses:
        return None
    return (
        f"under concurrent callers another candidate serves more: {'; '.join(losses)}; "
        f"optimize(..., concurrency=N) chooses for N callers (this check measured "
        f"{len(names)} candidates in {time.perf_counter() - start:.1f} s)"
    )


# A choice on one thread against the best on several (or the other way round) is timed again,
# the two alone, where the other is within this ratio of it or left the rounds early: a
# runtime on two threads loses more than one on one thread to anything else on the cores, so
# a load in the first rounds can send it out of them (MobileNetV2 160 chose LiteRT on one
# thread at 8.1 ms in one run of three, where LiteRT on two ran 3.6 ms). The two are timed for
# HEAD_TO_HEAD_S at least, never stopping early for stable rounds: a load that lasts a few
# tenths of a second then slows a few rounds, not all of them (the small CNN, 13 us a call,
# had its 8 rounds done in 0.3 s, and one run in ten chose LiteRT on one thread, 1.16x slower).
HEAD_TO_HEAD_WITHIN = 1.5
HEAD_TO_HEAD_S = 1.0
HEAD_TO_HEAD_ROUNDS = 8


def head_to_head(
    chosen: CandidateResult,
    other: CandidateResult,
    contenders: dict[str, Backend],
    inputs: list[np.ndarray],
    options: Options,
    progress: Progress,
    exclusive: Exclusive | None = None,
) -> tuple[str, str] | None:
    """The chosen candidate and `other`, of the other thread setting, timed together alone in
    interleaved rounds (HEAD_TO_HEAD_ROUNDS at least, every one to the end): the winner (the
    chosen one unless the other is clearly faster round by round) and why, in words. None
    where the two are not worth it (the other far behind, unless it left the rounds early
    while the choice runs on one thread) or one failed."""
    a, b = chosen.latency, other.latency
    # Far behind, it is settled already, unless it left the rounds early while the choice
    # runs on one thread: what a load on the other cores does to a runtime on several.
    suspect = b.left_after is not None and threads_of(chosen.name) == 1
    if b.p50 > HEAD_TO_HEAD_WITHIN * a.p50 and not suspect:
        return None
    names = (chosen.name, other.name)
    statistic = "mean" if options.concurrency > 1 or options.objective != "latency" else "median"
    text = f"settling one thread against several: {chosen.name} and {other.name}, head to head"
    with (
        progress.timed("head-to-head", text=text),
        exclusive.timing() if exclusive is not None else contextlib.nullcontext(),
    ):
        # HEAD_TO_HEAD_ROUNDS rounds at least (two calls of each a round, one untimed).
        rounds_s = HEAD_TO_HEAD_ROUNDS * 2 * (a.p50 + b.p50) / 1e3
        measured = measure_interleaved(
            {name: (lambda b=contenders[name]: b.run(inputs)) for name in names},
            budget_s=max(HEAD_TO_HEAD_S, rounds_s),
            min_rounds=HEAD_TO_HEAD_ROUNDS,
            per_call_estimate_s={chosen.name: a.p50 / 1e3, other.name: b.p50 / 1e3},
            cooldown_s={name: contenders[name].cooldown_s for name in names},
            callers=options.concurrency,
            race=False,
            stable_rel=0.0,  # never stable: the rounds spread over HEAD_TO_HEAD_S
        )
    stats = measured.stats
    if chosen.name not in stats or other.name not in stats:
        return None
    mine, theirs = stats[chosen.name], stats[other.name]
    won = clearly_slower(mine, theirs, statistic=statistic)
    winner, loser = (theirs, mine) if won else (mine, theirs)
    names_by = {id(mine): chosen.name, id(theirs): other.name}
    unit = "mean" if statistic == "mean" else "p50"
    value = (lambda s: s.mean) if statistic == "mean" else (lambda s: s.p50)
    why = (
        f"one thread against several, settled head to head ({mine.rounds} rounds, the two "
        f"alone): {names_by[id(winner)]} {unit} {value(winner):.4g} ms, "
        f"{names_by[id(loser)]} {value(loser):.4g} ms"
    )
    return names_by[id(winner)], why
