"""Tuning for several batch sizes: a choice per batch size, dispatch at call time, and the
latency budget; carried through save()/load() and the tuning cache."""

from __future__ import annotations

import time

import numpy as np
import pytest
from helpers import dense_model

import infertune
import infertune.backends.registry as registry
from infertune.backends.tf_function import TfFunction
from infertune.pipeline.timing import LatencyStats
from infertune.report import BatchResult, Report

# Two real tf.functions of the model whose speed depends on the batch size, so that the
# choice per batch size is known in advance: one sleeps at large batches, the other at
# small ones. 50 ms is far above any real call of the tiny model here (keras-eager included),
# so the fast one at each size wins by a margin no machine noise can close.
_SLOW_S = 0.05
_SWITCH = 16


class _Counting(TfFunction):
    def __init__(self):
        self.calls: list[int] = []

    def run(self, inputs):
        self.calls.append(len(inputs[0]))
        if self.slow_at(len(inputs[0])):
            time.sleep(_SLOW_S)
        return super().run(inputs)


class FastAtSmallBatch(_Counting):
    """tf.function, 50 ms slower from batch 16 on."""

    name = "fast-small"

    @staticmethod
    def slow_at(batch: int) -> bool:
        return batch >= _SWITCH


class FastAtLargeBatch(_Counting):
    """tf.function, 50 ms slower below batch 16."""

    name = "fast-large"

    @staticmethod
    def slow_at(batch: int) -> bool:
        return batch < _SWITCH


@pytest.fixture
def registered(monkeypatch):
    """The two classes as registered candidates, so that save()/load() can rebuild them."""
    monkeypatch.setitem(registry.BACKENDS, FastAtSmallBatch.name, FastAtSmallBatch)
    monkeypatch.setitem(registry.BACKENDS, FastAtLargeBatch.name, FastAtLargeBatch)


def _sample(batch: int = 4, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 6)).astype("float32")


def _tuned(**kwargs):
    small, large = FastAtSmallBatch(), FastAtLargeBatch()
    model = dense_model()
    opt = infertune.optimize(
        model, _sample(), backends=[small, large], batch_sizes=[1, 64], verbose=False, **kwargs
    )
    return model, opt, small, large


@pytest.mark.slow
def test_each_call_goes_to_the_choice_for_its_batch_size():
    model, opt, small, large = _tuned()
    assert opt.backends_by_batch == {1: "fast-small", 4: "fast-small", 64: "fast-large"}
    assert opt.backend == "fast-small"  # the choice at the sample's batch size (4)
    small.calls.clear(), large.calls.clear()
    for batch in (1, 3, 4, 5, 16, 64, 100):
        x = _sample(batch, seed=batch)
        # float32 round-off of the same graph: tf.function against the eager model.
        np.testing.assert_allclose(opt(x), model(x).numpy(), rtol=1e-5, atol=1e-6)
    # The smallest tuned batch size at or above the call's; the largest one beyond them.
    assert small.calls == [1, 3, 4]
    assert large.calls == [5, 16, 64, 100]


@pytest.mark.slow
def test_the_report_has_a_table_and_a_choice_per_batch_size():
    _, opt, _, _ = _tuned()
    report = opt.report
    assert [b.batch_size for b in report.batches] == [1, 4, 64]
    at_64 = report.batches[-1]
    assert at_64.selected == "fast-large"
    assert at_64.latency["fast-small"].p50 > _SLOW_S * 1e3  # it slept there
    assert "fast-large" in at_64.reasons["fast-small"] or "slower" in at_64.reasons["fast-small"]
    text = str(report)
    assert "per batch size" in text and "choice per batch size: 1: fast-small" in text
    data = report.to_dict()
    assert data["backends_by_batch"] == {"1": "fast-small", "4": "fast-small", "64": "fast-large"}
    again = Report.from_dict(data)
    assert again.backends_by_batch == opt.backends_by_batch
    # Every tuned batch size was verified, not only measured.
    assert "random input at batch 64" in " ".join(report.notes)


@pytest.mark.slow
def test_only_the_chosen_candidates_stay_alive():
    _, opt, small, large = _tuned()
    assert {b.name for b in opt.backends} == {"fast-small", "fast-large"}
    assert small._fn is not None and large._fn is not None
    opt.close()
    assert small._fn is None and large._fn is None


def test_one_candidate_everywhere_takes_the_single_path():
    small = FastAtSmallBatch()
    opt = infertune.optimize(
        dense_model(), _sample(), backends=[small], batch_sizes=[2, 8], verbose=False
    )
    assert opt.backends_by_batch == {2: "fast-small", 4: "fast-small", 8: "fast-small"}
    assert len(opt.backends) == 1


@pytest.mark.slow
def test_save_load_and_cache_keep_the_choice_per_batch_size(registered, tmp_path):
    model, opt, _, _ = _tuned()
    loaded = infertune.load(opt.save(tmp_path / "saved"), verbose=False)
    assert loaded.backends_by_batch == opt.backends_by_batch
    # Warmed before the first call: each candidate once at each batch size it serves.
    calls = {b.name: sorted(b.calls) for b in loaded.backends}
    for size, name in loaded.backends_by_batch.items():
        assert size in calls[name], (size, calls)
    for batch in (2, 64):
        x = _sample(batch, seed=batch)
        np.testing.assert_allclose(loaded(x), model(x).numpy(), rtol=1e-5, atol=1e-6)
    kinds = {type(b).__name__ for b in loaded.backends}
    assert kinds == {"FastAtSmallBatch", "FastAtLargeBatch"}

    def cached():
        return infertune.optimize(
            model, _sample(), backends=["fast-small", "fast-large"], batch_sizes=[1, 64],
            cache=tmp_path / "cache", verbose=False,
        )  # fmt: skip

    first, hit = cached(), cached()
    assert hit.report.from_cache
    assert hit.backends_by_batch == first.backends_by_batch == opt.backends_by_batch
    # Other batch sizes are another tuning question: a miss, not this entry.
    other = infertune.optimize(
        model, _sample(), backends=["fast-small"], batch_sizes=[1, 8], cache=tmp_path / "cache",
        verbose=False,
    )  # fmt: skip
    assert not other.report.from_cache


@pytest.mark.parametrize("bad", [[0], [1, -2], "8", [], [1.5], [True], object()])
def test_bad_batch_sizes_are_an_option_error(bad):
    with pytest.raises(infertune.OptionError, match="batch_sizes must be"):
        infertune.optimize(dense_model(), _sample(), batch_sizes=bad, verbose=False)


def test_a_fixed_batch_dimension_is_an_option_error():
    import keras

    model = keras.Sequential([keras.Input((6,), batch_size=4), keras.layers.Dense(3)])
    with pytest.raises(infertune.OptionError, match="batch dimension is free"):
        infertune.optimize(model, _sample(), batch_sizes=[1, 8], verbose=False)


def test_latency_budget_needs_the_throughput_objective():
    with pytest.raises(infertune.OptionError, match="objective='throughput'"):
        infertune.optimize(dense_model(), _sample(), latency_budget_ms=5, verbose=False)
    with pytest.raises(infertune.OptionError, match="latency_budget_ms"):
        infertune.optimize(
            dense_model(), _sample(), objective="throughput", latency_budget_ms=-1, verbose=False
        )


@pytest.mark.slow
def test_a_budget_nothing_meets_is_said_with_the_fastest_p99():
    # 1 ns: no call of any runtime returns that fast.
    _, opt, _, _ = _tuned(objective="throughput", latency_budget_ms=1e-6)
    report = opt.report
    assert report.max_batch_size_within_budget is None
    assert "met by no batch size and candidate; the lowest p99 was" in str(report)
    assert "no candidate met latency_budget_ms=1e-06" in report.selection_reason


@pytest.mark.slow
def test_a_budget_excludes_the_slow_candidates():
    # 30 ms: below the 50 ms sleep, far above a real call of the tiny model (its p99 too,
    # on a loaded machine).
    _, opt, _, _ = _tuned(objective="throughput", latency_budget_ms=30)
    report = opt.report
    assert report.max_batch_size_within_budget == 64
    assert opt.backends_by_batch == {1: "fast-small", 4: "fast-small", 64: "fast-large"}
    assert "exceeds latency_budget_ms=30" in report.batches[-1].reasons["fast-small"]
    assert "largest batch size within it 64" in str(report)


def _stats(p99_ms: float, mean_ms: float) -> LatencyStats:
    return LatencyStats(mean_ms, mean_ms, p99_ms, mean_ms, mean_ms, 100, 5, 0.0, True)


def test_budget_arithmetic_picks_the_most_samples_per_second_within_it():
    # Hand-made numbers: latency grows with the batch, samples/s too until the budget.
    batches = [
        BatchResult(1, "a", "", {"a": _stats(1.0, 0.5), "b": _stats(2.0, 1.0)}),
        BatchResult(8, "a", "", {"a": _stats(4.0, 2.0), "b": _stats(3.0, 2.5)}),
        BatchResult(64, "b", "", {"a": _stats(40.0, 20.0), "b": _stats(30.0, 16.0)}),
    ]
    report = Report(
        "m", "x", 1, "throughput", 1e-3, 1e-5, [], {}, "a", "", 0.0, batches=batches,
        latency_budget_ms=5.0,
    )  # fmt: skip
    assert report.max_batch_size_within_budget == 8
    # Within 5 ms: a at 8 gives 8 / 2 ms = 4000 samples/s, b at 8 gives 3200.
    assert "most samples/s within it: a at batch 8 (4,000 samples/s" in report.batch_summary()[-1]
