"""The timing engine: interleaved rounds, statistics over every call, failures reported.

The runners busy-wait for a set time, so a call is never timed shorter than its wait (a lower
bound no machine can break); which runner comes out faster, and how long a run takes, also
depend on the scheduler: another process on the two cores can preempt 0.5 ms calls by whole
time slices. Those checks are in the `timing` tier (tests/conftest.py); what the engine must
do whatever the machine's load is checked in the unit tier.
"""

from __future__ import annotations

import time

import pytest

from infertune.pipeline.timing import (
    EARLY_RACE_RATIO,
    RACE_RATIO,
    RACE_ROUNDS,
    measure_interleaved,
    time_once,
    warm_up,
)


def _busy(seconds):
    def run():
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    return run


@pytest.mark.timing
def test_interleaved_rounds_order_candidates_by_speed():
    runners = {"slower": _busy(0.0006), "fast": _busy(0.0005)}
    result = measure_interleaved(runners, budget_s=0.5, block_s=0.01)
    slower, fast = result.stats["slower"], result.stats["fast"]
    # interleaved: the same number of rounds; 1.2x apart, neither leaves them
    assert slower.rounds == fast.rounds >= 5
    assert slower.left_after is None and fast.left_after is None
    # 1.2x apart by construction; the median over every call keeps the order
    assert slower.p50 > fast.p50
    assert fast.p50 >= 0.5  # ms: a busy-wait of 0.5 ms cannot be timed shorter


@pytest.mark.timing
def test_a_candidate_far_behind_another_in_every_round_leaves_the_rounds():
    # Busy-waits 4x, 2x and 1.2x the fastest: the gaps hold round by round whatever the
    # scheduling noise, and 2x sits between the two ratios of the race.
    assert RACE_RATIO < 2 < EARLY_RACE_RATIO < 4
    runners = {
        "slow": _busy(0.002),
        "fast": _busy(0.0005),
        "close": _busy(0.0006),
        "behind": _busy(0.001),  # 2x: under the first rounds' 3x, over RACE_RATIO after
    }
    result = measure_interleaved(runners, budget_s=0.5, block_s=0.01)
    slow, fast, close, behind = (result.stats[n] for n in ("slow", "fast", "close", "behind"))
    assert behind.left_after == behind.rounds == RACE_ROUNDS
    # 4x: more than the first rounds' 3x, it leaves after two; it keeps its statistics
    assert slow.left_after == slow.rounds == 2
    assert slow.p50 > 2 * fast.p50
    assert fast.rounds == close.rounds > RACE_ROUNDS  # the two close ones are measured on
    assert fast.left_after is None and close.left_after is None
    assert fast.n > slow.n  # a block holds more calls of the faster runner


def test_without_the_race_a_runner_far_behind_stays_to_the_end():
    # A benchmark's ratio against a runtime far behind (float32 against int8) rests on the
    # p50 of that runtime: with race=False it is timed in every round, not two calls.
    runners = {"slow": _busy(0.005), "fast": _busy(0.0005)}
    result = measure_interleaved(runners, budget_s=0.3, block_s=0.005, race=False)
    slow, fast = result.stats["slow"], result.stats["fast"]
    assert slow.left_after is None and fast.left_after is None
    assert slow.rounds == fast.rounds > 2
    assert slow.p50 >= 5.0  # ms: its busy-wait


def test_failing_runner_is_reported_and_dropped():
    calls = {"n": 0}

    def flaky():
        calls["n"] += 1
        if calls["n"] > 3:
            raise RuntimeError("device lost")

    result = measure_interleaved({"ok": _busy(0.0002), "flaky": flaky}, budget_s=0.3)
    assert result.errors == {"flaky": "RuntimeError: device lost"}
    assert "ok" in result.stats and "flaky" not in result.stats


def test_warm_up_and_first_call():
    value, seconds = time_once(lambda: 42)
    assert value == 42 and seconds >= 0
    # A busy-wait is never timed shorter than its wait: a lower bound no load can break.
    assert warm_up(_busy(0.001), min_s=0.02) >= 0.001


@pytest.mark.timing
def test_warm_up_gives_the_time_of_one_call():
    # The median call, not the 20 ms of the warm-up: within 2x of 1 ms unless most calls
    # were preempted, which a quiet machine does not do.
    assert warm_up(_busy(0.001), min_s=0.02) == pytest.approx(0.001, rel=1.0)


def test_cooldown_keeps_a_spinning_runtime_out_of_the_next_block():
    """After a runner with a cooldown, the next block starts only once the cooldown passed."""
    log: list[tuple[str, float, float]] = []

    def recording(name, seconds):
        run = _busy(seconds)

        def call():
            start = time.perf_counter()
            run()
            log.append((name, start, time.perf_counter()))

        return call

    runners = {"spinner": recording("spinner", 0.0005), "next": recording("next", 0.0005)}
    measure_interleaved(runners, budget_s=0.3, block_s=0.005, cooldown_s={"spinner": 0.03})
    gaps = [b[1] - a[2] for a, b in zip(log, log[1:]) if a[0] == "spinner" and b[0] == "next"]
    assert gaps and min(gaps) >= 0.03  # a sleep's lower bound: no load can make it shorter


def test_a_block_ends_at_five_times_its_planned_length():
    # Warm-up said 10 us a call: 1000 calls make the planned 10 ms block. Each call takes
    # 2 ms, so unbounded the block would hold 1000 calls (2 s); it ends once it has run 5x
    # its planned length, 50 ms, which no more than 26 calls of at least 2 ms each can fill.
    # A count of calls, not a clock reading: a busy machine can only make it smaller.
    result = measure_interleaved(
        {"degraded": _busy(0.002)},
        budget_s=0.01,
        block_s=0.01,
        max_rounds=1,
        per_call_estimate_s={"degraded": 1e-5},
    )
    assert 1 <= result.stats["degraded"].n <= 26


@pytest.mark.timing
def test_a_runner_far_slower_than_its_estimate_cannot_spend_the_budget_in_one_block():
    # Warm-up said 10 us a call (a block of 1000 calls); each call now takes 2 ms, as a
    # runtime's threads do on a core another process spins on. Unbounded, its first block
    # alone would take 2 s, four times the budget, and leave one round for everyone.
    runners = {"degraded": _busy(0.002), "steady": _busy(0.0005)}
    started = time.perf_counter()
    result = measure_interleaved(
        runners, budget_s=0.5, block_s=0.01, per_call_estimate_s={"degraded": 1e-5}
    )
    # Twice the budget; unbounded, the first block alone would take 2 s.
    assert time.perf_counter() - started < 1.0
    assert result.stats["steady"].rounds >= 5
    # 4x slower in every round: it leaves them after two, with statistics over those
    assert result.stats["degraded"].rounds == 2


def test_a_candidate_ten_times_behind_leaves_after_the_first_round():
    # 20x: no load spike makes a runtime that much slower in a round's median and mean alike.
    runners = {"eager": _busy(0.01), "compiled": _busy(0.0005)}
    result = measure_interleaved(runners, budget_s=0.5, block_s=0.01)
    assert result.stats["eager"].left_after == result.stats["eager"].rounds == 1
    assert result.stats["compiled"].rounds > 1


def test_one_call_that_waits_for_the_scheduler_does_not_send_a_candidate_out_of_the_rounds():
    """A runtime's first calls after its workers went to sleep can each wait for the
    scheduler's next tick (ONNX Runtime's parallel mode: 8 ms where a call takes 0.13). Its
    first block holds three calls at least, so two such calls (the untimed one that opens the
    block, then one timed) do not make it look 40x slower than it is, and it stays in."""
    calls = {"n": 0}
    normal, stalled = _busy(0.0005), _busy(0.02)

    def wakes_slowly():
        calls["n"] += 1
        (stalled if calls["n"] <= 2 else normal)()

    runners = {"wakes-slowly": wakes_slowly, "steady": _busy(0.0005)}
    result = measure_interleaved(
        runners, budget_s=0.2, block_s=0.01, per_call_estimate_s={"wakes-slowly": 0.02},
        min_rounds=2,
    )  # fmt: skip
    assert result.stats["wakes-slowly"].left_after is None
    assert result.stats["wakes-slowly"].rounds >= 2


@pytest.mark.timing
def test_a_choice_already_decided_stops_the_rounds():
    """ "lead" is steady and about 1.5x ahead of "wobbly" in every round, whose own rounds never
    agree: measured for a choice (until_decided) the rounds stop at the minimum; for every
    candidate's figures (the default) they run on to the budget."""

    state = {"last": 0.0, "slow": False}

    def wobbly():  # 0.8 ms a call in one block, 1.1 ms in the next: its rounds never agree
        now = time.perf_counter()
        if now - state["last"] > 0.0005:  # another runner ran between: a new block
            state["slow"] = not state["slow"]
        end = now + (0.0011 if state["slow"] else 0.0008)
        while time.perf_counter() < end:
            pass
        state["last"] = time.perf_counter()

    runners = {"lead": _busy(0.0006), "wobbly": wobbly}
    decided = measure_interleaved(runners, budget_s=1.0, block_s=0.01, until_decided=True)
    full = measure_interleaved(runners, budget_s=1.0, block_s=0.01, race=False)
    assert decided.stats["lead"].rounds <= 6 < full.stats["lead"].rounds
