"""Where memory is tight: fewer copies of the weights held at once.

Memory is tight for a model here when the candidates that copy its weights would hold more
than INFERTUNE_HOLD_ALL_BYTES at once (2 GiB: a BERT-base-sized model's eleven candidates
held 5.2 GB at the end of verification). Then:

- variants that differ from another candidate only in a session option, or for one caller in
  running on fewer threads than the cores, are not tried (`skip_variant`): each holds its own
  copy of the weights, for a choice they seldom change;
- at most KEEP_AT_ONCE verified candidates that copy the weights stay for the measurement:
  each one verified is timed against the one kept (champion and challenger), on the sample
  or, with traffic=, on requests spread over the traffic's lengths, and the slower is closed
  at once (`keep`).
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING

from ..system.environment import usable_cores
from ..system.resources import release_freed_memory
from ..system.settings import hold_all_bytes
from .context import skip
from .timing import measure_interleaved

if TYPE_CHECKING:
    from .context import Candidate, Preparation

__all__ = [
    "CLEARLY_SLOWER",
    "KEEP_AT_ONCE",
    "keep",
    "memory_tight",
    "skip_variant",
    "wait_for_rehearsals",
]

# At most this many verified candidates that copy the weights stay for the measurement.
# BERT-base-sized, one run each: 3 kept peaked at 8.3x the weights, 1 at 6.5x.
KEEP_AT_ONCE = 1
# ... and one whose verification calls were more than this much slower than the fastest such
# candidate's is closed at once (the measurement's own race drops a candidate 1.5x behind).
CLEARLY_SLOWER = 1.5
# Seconds of the tournament's interleaved rounds (at least 3 rounds).
TOURNAMENT_S = 2.0


def memory_tight(others: list[Candidate], run: Preparation) -> str | None:
    """Why memory is tight for the model here (the candidates that copy its weights would
    hold more than INFERTUNE_HOLD_ALL_BYTES at once), or None."""
    if run.target.source is None and run.target.weights_measured is None:
        return None
    try:
        weights = run.target.weights_bytes()
    except Exception:  # the trace fails: the candidates' own stages will say why
        return None
    options = run.options
    holders = [
        s.backend
        for s in others
        if s.backend.memory_factor > 0
        and s.backend.precision in options.precision
        and not (s.backend.callers_only and options.concurrency == 1)
        and s.backend.available() is None
    ]
    held = sum(b.memory_factor for b in holders) * weights
    limit = hold_all_bytes()
    if held <= limit:
        return None
    return (
        f"the {len(holders)} candidates that copy the weights' {weights / 1e9:.2f} GB would "
        f"hold about {held / 1e9:.1f} GB at once, past {limit / 1e9:.1f} GB"
    )


def skip_variant(state: Candidate, run: Preparation, others: list[Candidate]) -> bool:
    """Where memory is tight, skip a candidate that differs from another one tried only in a
    session option (Backend.session_variant) or, for one caller, in running on fewer threads
    than the cores (Backend.threads_variant): each one holds its own copy of the weights.
    True where it was skipped."""
    backend = state.backend
    threads = backend.threads_variant if run.options.concurrency == 1 else None
    if run.memory_tight is None or (backend.session_variant is None and threads is None):
        return False
    base = next(
        (
            s.name
            for s in others
            if type(s.backend) is type(backend)
            and s.backend.session_variant is None
            and s.backend.threads_variant is None
        ),
        None,
    )
    if base is None:
        return False
    if threads is not None:
        why = (
            f"it differs from {base} only in running on {threads} thread(s) of "
            f"{usable_cores()}, which one caller on a model this large seldom gains from"
        )
    else:
        why = f"it differs from {base} only in a session option ({backend.session_variant})"
    skip(
        state,
        run,
        f"not tried on a model this large: {why}, and would hold its own copy of the "
        f"weights ({run.memory_tight})",
    )
    return True


def keep(state: Candidate, run: Preparation) -> None:
    """Where memory is tight, after a candidate that copies the weights is verified: while
    more than KEEP_AT_ONCE such candidates are held, they are timed against each other in a
    few interleaved rounds on the sample (a tournament: verification's own call times, taken
    beside a conversion, put OpenVINO 1.5x behind where it was the fastest); the slowest, and
    any CLEARLY_SLOWER than the fastest, are closed at once (`skipped`, with their times)."""
    if run.memory_tight is None or state.backend.memory_factor <= 0:
        return
    with run.lock:
        run.alive.append(state)
        if len(run.alive) <= KEEP_AT_ONCE:
            return
    # Multi-threaded sessions lost 1.9x to single-threaded ones timed beside a conversion
    # (ONNX Runtime 246 ms, 115-129 ms alone): the tournament waits for the conversions to
    # be done. This background thread compiles nothing meanwhile, so no more is held.
    run.converted.wait()
    # ... and for the rehearsals in the child: beside one, ONNX Runtime's default session
    # (two threads) lost 2.2x where it was as fast as OpenVINO alone.
    wait_for_rehearsals(run)
    with run.lock:
        requests = _requests(run)
        runners = {s.name: (lambda b=s.backend: [b.run(x) for x in requests]) for s in run.alive}
        with run.exclusive.timing():
            measured = measure_interleaved(
                runners,
                budget_s=TOURNAMENT_S,
                min_rounds=3,
                per_call_estimate_s={s.name: len(requests) * _call_s(s, run) for s in run.alive},
                cooldown_s={s.name: s.backend.cooldown_s for s in run.alive},
            )
        run.progress.times.add_background(state.name, measured.seconds, "tournament")
        p50 = {name: stats.p50 for name, stats in measured.stats.items()}
        ranked = sorted((s for s in run.alive if s.name in p50), key=lambda s: p50[s.name])
        best = ranked[0].name if ranked else None
        kept = [s for s in ranked[:KEEP_AT_ONCE] if p50[s.name] <= CLEARLY_SLOWER * p50[best]]
        for out in run.alive:
            if out not in kept:
                _drop(out, run, p50, best, measured.errors.get(out.name))
        run.alive = kept


def _requests(run: Preparation) -> list:
    """What the candidates are timed on: with traffic=, requests spread over its lengths,
    where every candidate held runs any shape with its run(); else the sample."""
    spread = run.tournament_requests
    if spread and all(
        s.backend.exact_shapes is None and not s.backend.builds_per_shape for s in run.alive
    ):
        return spread
    return [run.checks[0].inputs]


def wait_for_rehearsals(run: Preparation) -> None:
    """Wait for every rehearsal submitted to the child to be done (not with a time budget:
    each candidate's own wait is bounded by it)."""
    if run.budget.limited:
        return
    for other in run.states:
        if other.rehearsal is not None:
            with contextlib.suppress(Exception):  # its own wait says what went wrong
                other.rehearsal.wait(math.inf)


def _call_s(state: Candidate, run: Preparation) -> float:
    """Seconds per call on the sample in its verification (its first call where no other)."""
    known = run.call_estimates.get(state.name)
    if known is not None:
        return known
    return (state.result.first_call_ms or 1e3) / 1e3


def _drop(
    state: Candidate,
    run: Preparation,
    p50: dict[str, float],
    best: str | None,
    error: str | None,
) -> None:
    """Close a verified candidate that lost the tournament (or failed in it)."""
    state.dropped = True
    name, result = state.name, state.result
    run.contenders.pop(name, None)
    verified = f"verified (relative error {result.max_rel_err or 0.0:.1e})"
    if error is not None or best is None:
        result.status = "failed"
        result.reason = f"{verified}, then failed while timed against the others: {error}"
    else:
        ratio = p50[name] / p50[best]
        kept = "the fastest is" if KEEP_AT_ONCE == 1 else f"the {KEEP_AT_ONCE} fastest are"
        rule = (
            f"more than {CLEARLY_SLOWER:g}x"
            if ratio > CLEARLY_SLOWER
            else f"only {kept} kept of those that copy the weights"
        )
        result.status = "skipped"
        count = len(_requests(run))
        on = "" if count == 1 else f" on {count} requests of the traffic's lengths (ms for all)"
        result.reason = (
            f"{verified}, then closed before the measurement to hold memory: timed against "
            f"the others held{on}, p50 {p50[name]:.1f} ms against {best}'s {p50[best]:.1f} ms "
            f"({ratio:.2f}x; {rule}); {run.memory_tight}"
        )
    run.progress.say(f"{name}: closed, {result.reason}")
    with contextlib.suppress(Exception):  # what it held goes when it is collected
        state.backend.close()
    # Its runtime's buffers go back to the heap, where glibc keeps them unless asked.
    release_freed_memory()
