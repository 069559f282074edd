"""Many callers at once (a web server's workers): the callable is safe to call from many
threads, and optimize(concurrency=N) measures and chooses under N callers."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from helpers import dict_model, dict_sample, forced

import infertune
from infertune.backends.base import Backend
from infertune.backends.registry import BACKENDS
from infertune.options import Options
from infertune.pipeline.measuring import concurrency_note
from infertune.pipeline.timing import (
    LatencyStats,
    measure_interleaved,
)
from infertune.report import CandidateResult
from infertune.report.progress import Progress

THREADS, CALLS = 8, 200


def _candidates_that_run_here():
    names = []
    for name, factory in BACKENDS.items():
        backend = factory()
        if backend.precision == "fp32" and backend.available() is None:
            names.append(name)
    return ["keras-eager", *names]


@pytest.mark.slow
@pytest.mark.parametrize("name", _candidates_that_run_here())
def test_threads_get_the_same_results_as_sequential_calls(name):
    model = dict_model()
    rng = np.random.default_rng(0)
    # A variant meant for several callers is tried only under several (OpenVINO's THROUGHPUT).
    callers = 2 if name.endswith(":throughput") else 1
    opt = forced(model, dict_sample(rng), name, concurrency=callers)
    assert opt.backend == name
    # Distinct inputs per call (batch sizes 1-4), so a mix-up between threads shows.
    inputs = [dict_sample(np.random.default_rng(i), batch=1 + i % 4) for i in range(CALLS)]
    expected = [opt(x) for x in inputs]

    def worker(offset):
        return [(i, opt(inputs[i])) for i in range(offset, CALLS, THREADS)]

    with ThreadPoolExecutor(THREADS) as pool:
        results = [item for chunk in pool.map(worker, range(THREADS)) for item in chunk]
    assert len(results) == CALLS
    for i, got in results:
        for key in expected[i]:
            np.testing.assert_array_equal(got[key], expected[i][key])  # bit-identical


# -- measured under several callers (optimize(concurrency=N)) --------------------------------
class _Sleeps(Backend):
    """A runtime whose call is a sleep (which releases the GIL, as native runtimes do), under
    a lock where `serial` (a runtime that serializes calls on one instance)."""

    def __init__(self, name: str, seconds: float, serial: bool):
        self.name, self.seconds = name, seconds
        self._lock = threading.Lock() if serial else contextlib.nullcontext()

    def prepare(self, target):
        pass

    def run(self, inputs):
        with self._lock:
            time.sleep(self.seconds)
        return inputs


def test_several_callers_overlap_and_are_counted():
    free = _Sleeps("free", 0.005, serial=False)
    one = measure_interleaved({"free": lambda: free.run([])}, budget_s=0.3, min_rounds=3)
    four = measure_interleaved(
        {"free": lambda: free.run([])}, budget_s=0.3, min_rounds=3, callers=4
    )
    a, b = one.stats["free"], four.stats["free"]
    assert (a.callers, b.callers) == (1, 4)
    # Four sleeping callers overlap: about four times the calls per second, each call still
    # about 5 ms long. Callers run one after another would give 1x; 2x proves the overlap
    # with room for a loaded machine, where a sleep needs no CPU and each wake-up delays the
    # single caller as much as each of the four (a margin for the unit tier, tests/conftest.py).
    assert b.calls_per_s > 2 * a.calls_per_s
    assert b.samples_per_s(2) == pytest.approx(2 * 4 / (b.mean / 1e3))


def test_a_caller_that_raises_is_reported_not_hung():
    count = itertools.count()

    def flaky():
        if next(count) == 9:
            raise RuntimeError("boom in a caller")

    result = measure_interleaved({"flaky": flaky}, budget_s=0.3, callers=4)
    assert "boom in a caller" in result.errors["flaky"]


def test_the_report_says_what_the_choice_would_lose_under_several_callers():
    """One caller: the serialized runtime (4 ms) beats the free one (5 ms). Two and four
    callers: the free one overlaps its calls and serves 2-4x more; the note says so."""
    serial, free = _Sleeps("serial", 0.004, True), _Sleeps("free", 0.005, False)
    results = [
        CandidateResult("serial", "selected", latency=_stats(4.0)),
        CandidateResult("free", "ok", latency=_stats(5.0)),
    ]
    note = concurrency_note(
        "serial", results, {"serial": serial, "free": free}, [np.zeros(1)], 1,
        Options.checked(), Progress(False),
    )  # fmt: skip
    assert note is not None and "2 callers: free" in note and "4 callers: free" in note
    assert "concurrency=N" in note and "measured 2 candidates in" in note
    # Where the choice serves the most under load too, nothing is said.
    results[1].latency = _stats(5.0)
    assert (
        concurrency_note(
            "free",
            results,
            {"serial": serial, "free": free},
            [np.zeros(1)],
            1,
            Options.checked(),
            Progress(False),
        )  # fmt: skip
        is None
    )


def _stats(ms: float) -> LatencyStats:
    return LatencyStats.from_samples([ms / 1e3] * 5, [ms / 1e3] * 5, True)


@pytest.mark.slow
def test_optimize_measures_and_keeps_the_concurrency(tmp_path):
    model = dict_model()
    sample = dict_sample(np.random.default_rng(0))
    opt = infertune.optimize(
        model, sample, backends=["onnxruntime-cpu"], concurrency=2, verbose=False
    )
    measured = [c for c in opt.report.candidates if c.latency is not None]
    assert measured and all(c.latency.callers == 2 for c in measured)
    assert any("measured under 2 concurrent callers" in n for n in opt.report.notes)
    loaded = infertune.load(opt.save(tmp_path / "saved"), verbose=False)
    assert loaded._options["concurrency"] == 2
    first = infertune.optimize(
        model, sample, backends=["onnxruntime-cpu"], concurrency=2, cache=tmp_path / "c",
        verbose=False,
    )  # fmt: skip
    other = infertune.optimize(
        model, sample, backends=["onnxruntime-cpu"], cache=tmp_path / "c", verbose=False
    )
    assert not first.report.from_cache and not other.report.from_cache  # another key


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "4"])
def test_concurrency_must_be_a_positive_integer(bad):
    with pytest.raises(infertune.OptionError, match="concurrency must be an integer"):
        infertune.optimize(dict_model(), dict_sample(np.random.default_rng(0)), concurrency=bad)


@pytest.mark.slow
def test_concurrency_combines_with_batch_sizes_and_a_latency_budget():
    """Every tuned batch size is measured under the callers, and the latency budget is met
    (or not) by the p99 under that load."""
    model = dict_model()
    sample = dict_sample(np.random.default_rng(0))
    opt = infertune.optimize(
        model, sample, backends=["onnxruntime-cpu"], concurrency=2, batch_sizes=[1, 8],
        objective="throughput", latency_budget_ms=1000.0, time_budget_s=60, verbose=False,
    )  # fmt: skip
    assert [b.batch_size for b in opt.report.batches] == [1, 4, 8]
    for batch in opt.report.batches:
        assert all(stats.callers == 2 for stats in batch.latency.values())
    assert opt.report.max_batch_size_within_budget == 8  # 1 s: far above a tiny model's p99
