"""Selection (pipeline/selection.py): the fastest candidate beyond the measured noise, ties
broken by precision, exactness, start cost and steadiness; the exact-shape path only where
it is clearly faster."""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from infertune.options import Options
from infertune.pipeline.selection import select, select_exact_shape
from infertune.pipeline.timing import (
    LatencyStats,
    clearly_slower,
)
from infertune.report import CandidateResult


def _result(
    name, rounds, err=1e-7, precision="fp32", prepare_s=1.0, means=None, p50=None, p90=None
):
    """A measured candidate with these per-round medians (ms), as interleaved rounds give;
    its p50 over all calls is theirs unless given (rounds hold different numbers of calls),
    and its p90 is its p50 unless given."""
    p50 = float(np.median(rounds)) if p50 is None else p50
    p90 = p50 if p90 is None else p90
    means = means or rounds
    stats = LatencyStats(
        p50, p90, p90, float(np.mean(means)), min(rounds), 100, len(rounds), 0.0, True,
        tuple(rounds), tuple(means),
    )  # fmt: skip
    return CandidateResult(
        name, "ok", precision=precision, latency=stats, max_rel_err=err, prepare_s=prepare_s
    )


def test_select_needs_a_margin_beyond_noise():
    base = _result("keras-eager", [2.0] * 6)
    # Round by round, "fast" and "cheap" trade places: neither is clearly faster.
    fast = _result("fast", [1.00, 1.06, 0.98, 1.07, 0.99, 1.05], prepare_s=5.0)
    cheap = _result("cheap", [1.03, 1.01, 1.04, 1.00, 1.03, 1.02], prepare_s=0.1)
    chosen, why = select([base, fast, cheap], "latency")
    assert chosen is cheap and "cheaper to start" in why
    assert "within noise" in fast.reason


def test_select_sees_a_small_but_consistent_gain():
    # 3% faster in every round: a real difference, though within the spread of the rounds.
    slow = _result("slow", [1.00, 1.20, 0.90, 1.10, 1.00, 1.30], prepare_s=0.1)
    quick = _result("quick", [0.97, 1.16, 0.87, 1.07, 0.97, 1.26], prepare_s=5.0)
    chosen, _ = select([_result("keras-eager", [3.0] * 6), slow, quick], "latency")
    assert chosen is quick and "slower than quick" in slow.reason


def test_select_never_takes_a_candidate_clearly_slower_than_another():
    # On a machine whose other core is busy, a two-thread runtime is erratic (full speed in
    # some rounds, half in others; its fast rounds hold the most calls, so its p50 over all
    # calls is the lowest): clearly faster than no one, so everything ties with it. A steady
    # candidate cheaper to start must still not win the tie when a steady third is clearly
    # faster than it (measured: tf-function at 10.8 ms chosen over ONNX Runtime at 9.0 ms).
    erratic = _result(
        "erratic", [16.0, 12.0, 15.1, 15.9, 8.7, 8.5, 8.8, 8.9], prepare_s=3.0, p50=8.75, p90=16
    )
    steady = _result("steady", [9.2, 8.9, 9.3, 9.0, 9.0, 9.0, 9.1, 8.7], prepare_s=3.0, p90=9.3)
    cheap = _result("cheap", [13.6, 9.8, 10.5, 11.1, 10.8, 10.7, 10.6, 10.7], prepare_s=0.2)
    base = _result("keras-eager", [11.4, 11.4, 11.9, 11.8, 11.4, 11.4, 11.1, 11.4], prepare_s=0)
    chosen, why = select([base, erratic, steady, cheap], "latency")
    # Tied with the erratic one on the median, at the same start cost: the steadier tail.
    assert chosen is steady and "within noise of erratic, preferred (steadier" in why
    assert erratic.reason.startswith("within noise of steady")
    assert cheap.reason.startswith("1.19x slower than steady")


def test_select_breaks_a_tie_on_the_median_by_the_tail():
    # Medians within noise, same precision, error and start cost: the lower p90 wins for
    # latency, whichever has the lower median; the lower mean for throughput.
    rounds = [1.00, 1.02, 0.99, 1.01, 1.00, 0.98]
    tail = _result("tail", rounds, p50=0.99, p90=1.8, means=[1.3] * 6)
    even = _result("even", rounds, p50=1.00, p90=1.1, means=[1.05] * 6)
    chosen, why = select([_result("keras-eager", [3.0] * 6), tail, even], "latency")
    assert chosen is even and "steadier: lower p90" in why
    tail.status = even.status = "ok"
    assert select([_result("keras-eager", [3.0] * 6), tail, even], "throughput")[0] is even


def test_select_never_takes_an_erratic_candidate_well_above_the_lowest_median():
    # XLA on a loaded machine: most rounds 30% slower than OpenVINO, a few much faster, so
    # it is clearly slower than no one; cheaper to start, it must still not win the tie.
    erratic = _result(
        "erratic",
        [11.5, 8.5, 11.6, 8.4, 11.5, 11.6, 7.7, 9.0, 11.8, 11.2, 11.3, 6.7],
        prepare_s=0.01,
    )
    steady = _result(
        "steady", [8.7, 8.7, 8.7, 9.7, 8.8, 9.0, 8.8, 9.0, 10.6, 8.7, 8.9, 10.0], prepare_s=2.0
    )
    assert not clearly_slower(erratic.latency, steady.latency)
    chosen, _ = select([_result("keras-eager", [20.0] * 12), erratic, steady], "latency")
    assert chosen is steady and erratic.reason.startswith("1.27x slower than steady")


def test_select_explains_a_fastest_median_that_loses_round_by_round():
    # Lowest p50 over all calls (its fast rounds held the most calls), but slower than
    # "steady" in three rounds of four.
    spiky = _result("spiky", [0.5, 1.2, 1.2, 1.2, 1.2, 1.2, 1.2, 0.5], p50=0.6)
    steady = _result("steady", [1.0] * 8)
    chosen, why = select([_result("keras-eager", [3.0] * 8), spiky, steady], "latency")
    assert chosen is steady
    assert "spiky has the lowest p50" in why and "clearly slower than steady" in why


def test_a_loser_with_a_lower_median_is_never_called_slower_by_a_ratio_below_one():
    # The chosen one was faster in 6 rounds of 8; two slow rounds with many calls lifted its
    # median over all calls above the loser's. The loser's reason must not say "0.98x slower".
    steady = _result("keras-eager", [1.0] * 8)
    chosen_one = _result("litert", [0.95] * 6 + [2.0, 2.0], p50=1.02)
    chosen, why = select([steady, chosen_one], "latency")
    assert chosen is chosen_one
    assert steady.reason.startswith("clearly slower than litert round by round")
    assert "faster than keras-eager" not in why  # its median over all calls is not higher


def test_select_says_so_when_every_candidate_is_beaten_by_another():
    # Four candidates, each clearly slower than the one before it (in 3 rounds of 4), the
    # first than the last: a cycle.
    cycle = [
        _result("a", [1.0, 1.1, 1.2, 1.3], p50=1.00),
        _result("b", [1.1, 1.2, 1.3, 1.0], p50=1.01),
        _result("c", [1.2, 1.3, 1.0, 1.1], p50=1.02),
        _result("d", [1.3, 1.0, 1.1, 1.2], p50=1.03),
    ]
    assert all(clearly_slower(cycle[(i + 1) % 4].latency, cycle[i].latency) for i in range(4))
    chosen, why = select(cycle, "latency")
    assert chosen is cycle[0] and "the rounds disagree" in why
    for loser in cycle[1:]:
        assert loser.reason.startswith(("clearly slower than", "1.0"))


def test_select_prefers_full_precision_on_a_tie():
    reduced = _result("int8", [1.0, 1.1, 0.9, 1.1], err=1e-3, precision="int8")
    full = _result("fp32", [1.05, 1.0, 1.0, 1.0])
    chosen, _ = select([_result("keras-eager", [3.0] * 4), reduced, full], "latency")
    assert chosen is full


def test_select_by_throughput_uses_mean():
    steady = _result("steady", [1.0] * 5, means=[1.0] * 5)
    spiky = _result("spiky", [0.8] * 5, means=[1.5] * 5)  # faster median, slower on average
    assert select([_result("keras-eager", [3.0] * 5), steady, spiky], "latency")[0] is spiky
    steady.status = spiky.status = "ok"
    assert select([_result("keras-eager", [3.0] * 5), steady, spiky], "throughput")[0] is steady


def _from_samples(name: str, round_ms: list[float], prepare_s: float) -> CandidateResult:
    stats = LatencyStats.from_samples(
        [ms / 1e3 for ms in round_ms], [ms / 1e3 for ms in round_ms], True
    )
    return CandidateResult(name, "ok", latency=stats, prepare_s=prepare_s, max_rel_err=1e-7)


def test_an_exact_shape_candidate_must_be_faster_beyond_noise():
    options = Options.checked()
    general = _from_samples("general", [1.00, 0.97, 1.00, 0.97, 1.00, 0.97], prepare_s=5.0)
    general.status = "selected"
    # Within noise (faster in half the rounds, medians 1.5% apart) and cheaper to start: it
    # would win select's tie, but a tie stays with the general choice.
    tied = _from_samples("tied", [0.98, 0.99, 0.98, 0.99, 0.98, 0.99], prepare_s=0.1)
    fast, _ = select_exact_shape([general, tied], {"tied"}, general, options)
    assert fast is None and tied.status == "ok" and "within noise of general" in tied.reason
    assert general.status == "selected" and general.reason == ""
    # Three times faster in every round: the exact-shape path.
    quick = _from_samples("quick", [0.33, 0.32, 0.33, 0.32, 0.33, 0.32], prepare_s=0.1)
    fast, why = select_exact_shape([general, quick], {"quick"}, general, options)
    assert fast is quick and quick.status == "selected"
    assert "faster than general" in why and "general serves the others" in why
    assert "which quick serves" in general.reason


# -- a close call, and one thread against several -------------------------------------------
def test_a_close_call_names_the_runner_up_and_the_margin():
    base = _result("keras-eager", [3.0] * 6)
    chosen_one = _result("a", [1.00, 1.01, 0.99, 1.00, 1.02, 0.99], prepare_s=0.1)
    runner_up = _result("b", [1.03, 1.04, 1.02, 1.03, 1.05, 1.02], prepare_s=0.1)
    chosen, why = select([base, chosen_one, runner_up], "latency")
    assert chosen is chosen_one
    assert "close call: the runner-up b is +3.0%" in why
    far = _result("c", [1.30] * 6)
    _, why = select([_result("keras-eager", [3.0] * 6), _result("a", [1.0] * 6), far], "latency")
    assert "close call" not in why  # 30% behind: no close call


class _Busy:
    """A runner that busy-waits `ms` per call: a workload of known speed for the timing
    engine (no runtime is needed to check which of two the head-to-head keeps)."""

    cooldown_s = 0.0
    exact_shapes = None

    def __init__(self, name: str, ms: float):
        self.name, self.seconds = name, ms / 1e3

    def run(self, inputs):
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            pass


def test_one_thread_against_several_is_settled_head_to_head():
    """The main measurement sent the two-thread candidate out of the rounds (a load at their
    start: its p50 there 2.0 ms), and chose the one-thread one (1.0 ms); alone, head to
    head, the two-thread one is faster (0.5 ms): it is chosen, both reasons say why."""
    from infertune.model.inputs import build_signature
    from infertune.model.outputs import OutputSignature
    from infertune.pipeline.measuring import head_to_head
    from infertune.pipeline.selection import Selection, other_thread_setting, settled
    from infertune.report.progress import Progress
    from infertune.result.choice import Choice

    one = _result("litert:threads=1", [1.0] * 6)
    several = _result("litert", [2.0, 2.1])
    several.latency = dataclasses.replace(several.latency, left_after=2)
    one.status = "selected"
    contenders = {
        name: _Busy(name, ms) for name, ms in (("litert:threads=1", 1.0), ("litert", 0.5))
    }
    results = [_result("keras-eager", [30.0] * 6), one, several]
    assert other_thread_setting(one.name, results, contenders) is several
    with Progress(False) as progress:
        winner, why = head_to_head(one, several, contenders, [], Options(), progress)
    assert winner == "litert" and "settled head to head" in why
    signature, _ = build_signature(np.zeros((1, 2), np.float32), None, np.dtype("float32"))
    choice = Choice(contenders[one.name], signature, OutputSignature(signature.structure, ()))
    after = settled(Selection(choice, "p50 1 ms"), results, contenders, winner, why, 1)
    assert after.choice.general is contenders["litert"]
    assert several.status == "selected" and one.status == "ok"
    assert one.reason.startswith("lost the head-to-head")
