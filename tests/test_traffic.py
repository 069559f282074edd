"""optimize(traffic=...): the traffic read and checked, padding proven exact per model,
buckets planned from measured costs, and requests dispatched through them (tiny models:
tests/traffic_models.py)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from helpers import choice_with_buckets, needs_onnxruntime, weight_copying
from traffic_models import lossy_encoder, masked_encoder, request, traffic

import infertune
from infertune.errors import InputError, OptionError
from infertune.model.inputs import build_signature
from infertune.model.traffic import read_traffic
from infertune.pipeline.bucket_plan import best_plan
from infertune.pipeline.padding import check_padding, pad_values_for
from infertune.result.buckets import Bucket, Buckets, bucketed

pytestmark = needs_onnxruntime


@pytest.fixture(scope="module")
def encoder():
    return masked_encoder()


def _signature(model, sample):
    from infertune.model.source import load_model

    source = load_model(model)
    signature, _ = build_signature(sample, source.declared_inputs, source.default_float)
    return source, signature


def _close(got: dict, model, x: dict) -> None:
    want = model(x)
    for key in want:
        # float32 round-off of two attention blocks, as every exact runtime verifies
        np.testing.assert_allclose(got[key], np.asarray(want[key]), rtol=1e-4, atol=1e-5)


# -- reading the traffic ----------------------------------------------------------------------
def test_the_free_dimension_is_found_and_shared_by_ids_and_mask(encoder):
    _, signature = _signature(encoder, request(8))
    read = read_traffic(traffic(40), signature)
    assert [d.name for d in read.dims] == ["length"]
    assert sorted(read.dims[0].members) == [(0, 1), (1, 1)]  # both inputs' axis 1, one length
    assert len(read) == 40 and read.batches.tolist() == [1] * 40
    shapes = read_traffic([((1, 7), (1, 7)), ((2, 30), (2, 30))], signature)
    assert shapes.lengths(0).tolist() == [7, 30] and shapes.batches.tolist() == [1, 2]


def test_bad_traffic_is_refused_before_any_long_work(encoder):
    x = request(8)
    cases = [
        ([], OptionError, "traffic is empty"),
        (np.zeros((3, 8)), OptionError, "list of requests"),
        ([request(5), {"token_ids": np.zeros((1, 5, 2), "int32"), "padding_mask": x["padding_mask"]}],  # noqa: E501
         InputError, r"traffic\[1\].*rank 3"),
        ([{"token_ids": np.zeros((1, 5), "float32"), "padding_mask": np.ones((1, 5), "int32")}],
         InputError, r"traffic\[0\].*float32"),
        ([request(5), ((1, 5), (1, 5))], OptionError, "same way"),
    ]  # fmt: skip
    for given, error, words in cases:
        with pytest.raises(error, match=words):
            infertune.optimize(encoder, x, traffic=given, verbose=False)
    # Named as one dimension, ids and mask must share their length in every request.
    one = {"length": ["token_ids:1", "padding_mask:1"]}
    with pytest.raises(InputError, match="differ in size"):
        infertune.optimize(encoder, x, traffic=[((1, 5), (1, 6))], free_dims=one, verbose=False)
    with pytest.raises(OptionError, match="pad_value= applies to traffic="):
        infertune.optimize(encoder, x, pad_value=1, verbose=False)
    with pytest.raises(OptionError, match="not free"):
        infertune.optimize(
            encoder, x, traffic=traffic(10), free_dims={"n": ["token_ids:0"]}, verbose=False
        )


# -- padding proven exact ---------------------------------------------------------------------
def test_padding_a_masked_encoder_is_exact_and_its_sequence_output_is_cut_back(encoder):
    source, signature = _signature(encoder, request(8))
    read = read_traffic(traffic(60), signature)
    check = check_padding(
        lambda flat: source.call_flat(signature, flat)[0], signature, read, 0,
        pad_values_for(0, signature), 1e-3, 1e-5,
    )  # fmt: skip
    assert check.exact, check.reason
    # The outputs, flat in the model's order (pooled, sequence): the sequence's axis 1.
    assert check.sliced == ((1, 1),)
    assert check.batch_exact
    assert len(check.checked) >= 3


def test_a_model_whose_outputs_change_under_padding_is_refused_padding_with_the_cause():
    model = lossy_encoder()
    ids = np.random.default_rng(0).integers(1, 50, (1, 9)).astype("int32")
    source, signature = _signature(model, ids)
    rng = np.random.default_rng(1)
    read = read_traffic([ids[:, : int(n)] for n in rng.integers(3, 10, 30)], signature)
    check = check_padding(
        lambda flat: source.call_flat(signature, flat)[0], signature, read, 0,
        pad_values_for(0, signature), 1e-3, 1e-5,
    )  # fmt: skip
    assert not check.exact
    assert "changed the outputs" in check.reason and "padding mask" in check.reason
    assert check.max_rel_err > 1e-2
    opt = infertune.optimize(
        model, ids, traffic=[ids[:, : int(n)] for n in rng.integers(3, 10, 30)],
        backends=["onnxruntime-cpu"], verbose=False,
    )  # fmt: skip
    note = next(n for n in opt.report.notes if n.startswith("traffic:"))
    assert "every request at its own length" in note and "padding mask" in note
    for n in (3, 7, 12):
        x = ids[:, :n] if n <= 9 else np.tile(ids, (1, 2))[:, :n]
        np.testing.assert_allclose(opt(x), np.asarray(model(x)), rtol=1e-4, atol=1e-5)


# -- planning ---------------------------------------------------------------------------------
def test_the_plan_pads_where_that_is_faster_and_runs_exact_lengths_where_that_is():
    """Costs as measured: "fixed" is fast at a bound but cannot switch shapes cheaply (an
    interpreter resized), "free" runs any length at a cost that grows with it."""
    points = [8, 16, 32, 64]
    planning = np.array([4, 6, 8, 10, 12, 14, 16] * 10 + [40, 60])
    costs = {"fixed": np.array([1.0, 1.2, 1.6, 2.4]), "free": np.array([1.5, 2.0, 3.0, 5.0])}
    switch = {"fixed": 5.0, "free": 0.0}
    plan = best_plan(points, planning, costs, switch, ["fixed", "free"], padding_ok=True)
    assert [(c.upper, c.name, c.padded) for c in plan][:2] == [
        (8, "fixed", True),
        (16, "fixed", True),
    ]
    assert plan[-1].upper == 64
    # Without padding (not exact for the model): the requests at their own lengths only.
    exact = best_plan(points, planning, costs, switch, ["fixed", "free"], padding_ok=False)
    assert all(not c.padded for c in exact) and {c.name for c in exact} == {"free"}
    # A bucket that saves nothing is not made: one cost everywhere, one bucket.
    flat = {"free": np.array([1.0, 1.0, 1.0, 1.0])}
    assert len(best_plan(points, planning, flat, {"free": 0.0}, ["free"], True)) == 1


# -- dispatch ---------------------------------------------------------------------------------
def test_requests_pad_into_their_bucket_and_come_back_at_their_length(encoder):
    """Buckets given (not measured): each request of the traffic, and one longer than any
    bucket, through the dispatch, against the model itself."""
    from helpers import prepared_backend

    from infertune.backends.onnxruntime.cpu import OnnxRuntimeCpu
    from infertune.model.traffic import FreeDim

    backend, signature = prepared_backend(OnnxRuntimeCpu(), encoder, request(8))
    dim = FreeDim("length", ((0, 1), (1, 1)))
    buckets = Buckets(
        dim, [Bucket(8, backend, True), Bucket(20, backend, True), Bucket(32, backend, False)],
        backend, pad_values_for(0, signature), ((1, 1),),
    )  # fmt: skip
    run = bucketed(buckets)
    for n in (1, 5, 8, 9, 17, 20, 25, 45):
        x = request(n, seed=n)
        pooled, sequence = run(signature.flatten(x))
        assert sequence.shape == (1, n, 16)
        _close({"pooled": pooled, "sequence": sequence}, encoder, x)


@pytest.mark.slow
def test_a_saved_bucketed_result_loads_and_serves_threads(encoder, tmp_path):
    opt = infertune.optimize(
        encoder, request(12), traffic=traffic(80), backends=["onnxruntime-cpu", "litert"],
        verbose=False,
    )  # fmt: skip
    note = next(n for n in opt.report.notes if n.startswith("traffic:"))
    assert "80 requests" in note
    loaded = infertune.load(opt.save(tmp_path / "saved"), verbose=False)
    paths = len(opt.report.traffic["buckets"]) + 1  # each bucket, and longer requests
    warmed = next(n for n in loaded.report.notes if n.startswith("warmed up"))
    assert f": {paths} call path" in warmed and "failed" not in warmed, warmed
    lengths = [2, 6, 11, 19, 33, 47, 90]  # 90: longer than any request seen
    requests = [request(n, seed=n) for n in lengths for _ in range(4)]
    results: dict[int, dict] = {}

    def serve(offset: int) -> None:
        for i in range(offset, len(requests), 4):
            results[i] = loaded(requests[i])

    threads = [threading.Thread(target=serve, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == len(requests)
    for i, x in enumerate(requests):
        _close(results[i], encoder, x)


@pytest.mark.slow
def test_a_package_carries_the_traffic_and_is_tuned_without_the_model(encoder, tmp_path):
    """The padding check and the model's outputs at the traffic's lengths are made where the
    model is; tuning from the package plans the buckets from them, with the same checks."""
    path = infertune.package(encoder, request(12), tmp_path / "pkg", traffic=traffic(60),
                             verbose=False)  # fmt: skip
    opt = infertune.optimize(path, backends=["onnxruntime-cpu", "litert"], verbose=False)
    note = next(n for n in opt.report.notes if n.startswith("traffic:"))
    assert "60 requests" in note
    for n in (3, 14, 40, 70):
        x = request(n, seed=n)
        _close(opt(x), encoder, x)


@pytest.mark.slow
def test_the_tuning_cache_keeps_the_buckets_and_keys_on_the_traffic(encoder, tmp_path):
    kwargs = dict(backends=["onnxruntime-cpu"], cache=tmp_path / "cache", verbose=False)
    first = infertune.optimize(encoder, request(12), traffic=traffic(40), **kwargs)
    again = infertune.optimize(encoder, request(12), traffic=traffic(40), **kwargs)
    assert again.report.from_cache
    assert again._choice.to_dict().get("buckets") == first._choice.to_dict().get("buckets")
    other = infertune.optimize(encoder, request(12), traffic=traffic(40, seed=5), **kwargs)
    assert not other.report.from_cache  # another distribution: another key


def test_a_triton_export_says_which_shapes_each_bucket_takes():
    from infertune.deploy.triton import _choice_notes, bucket_words

    choice = {
        "general": "onnxruntime-cpu",
        "buckets": {
            "buckets": [
                {"upper": 16, "backend": "litert", "padded": True},
                {"upper": 64, "backend": "onnxruntime-cpu", "padded": False},
            ],
            "beyond": "onnxruntime-cpu",
        },
    }
    words = bucket_words(choice["buckets"])
    assert words == (
        "(0, 16] litert padded to 16; (16, 64] onnxruntime-cpu at its own length; "
        "longer: onnxruntime-cpu"
    )
    (python,) = _choice_notes(choice, "python")
    assert words in python and "infertune_buckets" in python
    (native,) = _choice_notes(choice, None)
    assert "holds onnxruntime-cpu for every length" in native


def test_a_server_runs_the_requests_of_one_bucket_as_one_batch(encoder, tmp_path):
    """Requests of lengths 5, 9 and 14 (one padded bucket up to 16) run as one batch of 3,
    each one's outputs cut back to its length; 30 (the next bucket) runs apart."""
    from helpers import forced

    from infertune.deploy.served import ServedModel
    from infertune.model.traffic import FreeDim

    opt = forced(encoder, request(8), "onnxruntime-cpu")
    backend, signature = opt._choice.general, opt.input_signature
    opt._choice.buckets = Buckets(
        FreeDim("length", ((0, 1), (1, 1))),
        [Bucket(16, backend, True), Bucket(64, backend, True)],
        backend, pad_values_for(0, signature), ((1, 1),),
    )  # fmt: skip
    served = ServedModel(opt.save(tmp_path / "saved"))
    lengths = (5, 9, 14, 30)
    requests = [request(n, seed=n) for n in lengths]
    runs = []
    outputs = served.run_batch(
        [served.check(x, cast=False) for x in requests], record=lambda n, ns: runs.append(n)
    )
    assert sorted(runs) == [1, 3]  # the three of the first bucket together, 30 alone
    names = [spec.name for spec in served.outputs]
    for x, flat, n in zip(requests, outputs, lengths):
        got = dict(zip(names, flat))
        assert got["sequence"].shape == (1, n, 16)
        _close(got, encoder, x)
    served.close()


def test_batch_sizes_are_read_from_the_traffic():
    from infertune.model.traffic import Traffic
    from infertune.pipeline.tune import traffic_batch_sizes

    def sizes(batches, sample=1):
        traffic = Traffic((), np.asarray(batches), np.zeros((len(batches), 0)))
        return traffic_batch_sizes(traffic, sample)

    assert sizes([1, 1, 1]) is None  # one batch size: nothing to choose per batch
    assert sizes([4, 4], sample=4) is None  # the sample's only
    assert sizes([1, 4, 4, 2]) == (1, 2, 4)
    many = sizes(list(range(1, 33)))
    assert many[0] == 1 and many[-1] == 32 and len(many) <= 4
    # A size with a tuned one at most 1.25x above it is left to that one (the sample's too):
    # a request goes to the choice for the smallest tuned size at or above its own.
    assert sizes([1, 5, 5, 8, 31], sample=6) == (1, 8, 31)
    assert sizes([1, 4, 5], sample=1) == (1, 5)


@pytest.mark.slow
def test_a_traffic_of_batch_sizes_tunes_a_choice_per_batch_size():
    from helpers import dense_model

    rng = np.random.default_rng(0)
    requests = [rng.random((int(n), 6), np.float32) for n in rng.choice([1, 2, 8], 30)]
    opt = infertune.optimize(
        dense_model(), requests[0], traffic=requests,
        backends=["onnxruntime-cpu", "onnxruntime-cpu:threads=1", "litert", "tf-function"],
        verbose=False,
    )  # fmt: skip
    assert sorted(opt.backends_by_batch) == [1, 2, 8]
    # Beyond the sample's batch size, only the fastest few there are timed (traffic_plan's
    # MEASURED), the choice among them.
    from infertune.pipeline.traffic_plan import MEASURED

    sample_batch = requests[0].shape[0]
    timed = {b.batch_size: set(b.latency) for b in opt.report.batches}
    assert len(timed[sample_batch]) > MEASURED
    fastest = sorted(
        opt.report.batches[[b.batch_size for b in opt.report.batches].index(sample_batch)]
        .latency.items(), key=lambda item: item[1].p50,
    )  # fmt: skip
    for size, names in timed.items():
        if size != sample_batch:
            assert names <= {name for name, _ in fastest[:MEASURED]}
            assert opt.backends_by_batch[size] in names
    assert "time only the fastest few" in str(opt.report)
    x = rng.random((5, 6), np.float32)
    np.testing.assert_allclose(opt(x), np.asarray(dense_model()(x)), rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("ai_edge_litert") is None, reason="LiteRT"
)
def test_litert_buckets_keep_interpreters_of_their_own_shapes(encoder):
    """Each padded bucket runs interpreters of its own, allocated at its bound once: calls
    alternating between buckets resize nobody's, and each bucket's outputs match."""
    from helpers import prepared_backend

    from infertune.backends.litert.backend import LiteRT
    from infertune.model.traffic import FreeDim

    backend, signature = prepared_backend(LiteRT(), encoder, request(8))
    buckets = Buckets(
        FreeDim("length", ((0, 1), (1, 1))), [Bucket(8, backend, True), Bucket(20, backend, True)],
        backend, pad_values_for(0, signature), ((1, 1),),
    )  # fmt: skip
    for n in (3, 15, 7, 19, 8, 12):
        x = request(n, seed=n)
        pooled, sequence = buckets.run(signature.flatten(x))
        _close({"pooled": pooled, "sequence": sequence}, encoder, x)
    shapes = [pool.idle[0].shapes for pool in backend._bucket_pools]
    assert shapes == [[(1, 8), (1, 8)], [(1, 20), (1, 20)]]


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("ai_edge_litert") is None, reason="LiteRT"
)
def test_warm_up_allocates_each_buckets_interpreters_at_its_bound_before_any_request(encoder):
    """What load(), a tuning-cache hit and a served model do before their first request
    (calling.warm_up): each padded bucket's own interpreters are allocated at its bound, not
    at the bucket's first request."""
    from helpers import target_for

    from infertune.backends.litert.backend import LiteRT
    from infertune.backends.onnxruntime.cpu import OnnxRuntimeCpu
    from infertune.model.traffic import FreeDim
    from infertune.result.calling import warm_up

    target = target_for(encoder, request(8))
    litert, free = LiteRT(), OnnxRuntimeCpu()
    for backend in (litert, free):
        backend.prepare(target)
    buckets = Buckets(
        FreeDim("length", ((0, 1), (1, 1))),
        [Bucket(12, litert, True), Bucket(20, litert, True), Bucket(40, free, False)],
        free, pad_values_for(0, target.signature), ((1, 1),),
    )  # fmt: skip
    buckets.run  # noqa: B018 (the dispatch built, as a call path builds it: no call yet)
    before = [pool.idle[0].shapes for pool in litert._bucket_pools]
    assert before == [[], []]  # opened, allocated at no shape yet
    note = warm_up(choice_with_buckets(target, free, buckets))
    assert note.startswith("warmed up before the first call: 4 call paths in ")
    shapes = [pool.idle[0].shapes for pool in litert._bucket_pools]
    assert shapes == [[(1, 12), (1, 12)], [(1, 20), (1, 20)]]
    assert [len(pool.idle) for pool in litert._bucket_pools] == [1, 1]


def test_a_failing_warm_up_call_is_named_and_warned_about_and_the_rest_still_run(encoder):
    """A path whose warm-up call raises (here a request at a length its runtime refuses) is
    named in the note and a warning; the paths after it are still run."""
    from helpers import target_for

    from infertune.backends.onnxruntime.cpu import OnnxRuntimeCpu
    from infertune.model.traffic import FreeDim
    from infertune.result.calling import warm_up

    target = target_for(encoder, request(8))
    free = OnnxRuntimeCpu()
    free.prepare(target)
    calls = []

    def refusing(flat):
        calls.append(flat[0].shape)
        if flat[0].shape[1] == 12:
            raise ValueError("length 12 is outside the profile")
        return OnnxRuntimeCpu.run(free, flat)

    free.run = refusing
    buckets = Buckets(
        FreeDim("length", ((0, 1), (1, 1))), [Bucket(12, free, True), Bucket(20, free, True)],
        free, pad_values_for(0, target.signature), ((1, 1),),
    )  # fmt: skip
    choice = choice_with_buckets(target, free, buckets)
    calls.clear()
    with pytest.warns(UserWarning, match="the bucket up to 12: ValueError: length 12 is out"):
        note = warm_up(choice)
    assert "(the warm-up call failed for the bucket up to 12: ValueError" in note
    assert calls == [(1, 12), (1, 20), (1, 8)]  # every path, the failed one included


@pytest.mark.slow
def test_where_memory_is_tight_the_copy_kept_is_the_fastest_over_the_traffic(monkeypatch, encoder):
    # Every model counts as large (holding both copies would pass 1 byte): one copy is kept
    # for the measurement. "short" is the faster at the sample's 8 positions (5 ms against
    # 12), "flat" over the traffic's 40-63 (12 ms against 18-27).
    monkeypatch.setenv("INFERTUNE_HOLD_ALL_BYTES", "1")
    rng = np.random.default_rng(0)
    requests = [request(int(n), seed=i) for i, n in enumerate(rng.integers(40, 64, 24))]

    def tuned(**traffic_given):
        backends = [
            weight_copying("short", lambda x: 0.002 + 0.0004 * x[0].shape[-1]),
            weight_copying("flat", lambda _: 0.012),
        ]
        opt = infertune.optimize(
            encoder, request(8), backends=backends, verbose=False, **traffic_given
        )
        return {c.name: c for c in opt.report.candidates}

    at_sample = tuned()
    assert at_sample["short"].latency is not None
    assert at_sample["flat"].status == "skipped"
    over_traffic = tuned(traffic=requests)
    assert over_traffic["flat"].latency is not None
    dropped = over_traffic["short"]
    assert dropped.status == "skipped"
    assert "on 6 requests of the traffic's lengths" in dropped.reason, dropped.reason


def _compiling(name: str, right_at: int | None = None, seen: list | None = None):
    """tf-xla itself (a runtime that compiles for each shape), named `name`, recording the
    batch size of every call in `seen`, and where `right_at` is set, giving wrong outputs at
    every other batch size."""
    from infertune.backends.tf_xla import TfXla

    class Compiling(TfXla):
        def __init__(self):
            super().__init__()
            self.name = name

        def run(self, inputs):
            if seen is not None:
                seen.append(inputs[0].shape[0])
            outputs = super().run(inputs)
            if right_at is not None and inputs[0].shape[0] != right_at:
                outputs = [o + 1.0 for o in outputs]
            return outputs

    return Compiling()


@pytest.mark.slow
def test_with_traffic_a_compiling_runtime_is_verified_at_a_batch_size_where_it_is_timed(
    monkeypatch,
):
    """Only the fastest at the sample's batch size are timed at the others (one here): XLA,
    which compiles for each shape, is verified at them only where it is timed there, and a
    mismatch found there rejects it as verification would have."""
    from helpers import dense_model

    from infertune.pipeline import contest

    rng = np.random.default_rng(0)
    requests = [rng.random((int(n), 6), np.float32) for n in rng.choice([1, 2, 8], 30)]
    monkeypatch.setattr(contest, "MEASURED", 1)
    seen: list[int] = []
    opt = infertune.optimize(
        dense_model(), requests[0], traffic=requests,
        backends=["onnxruntime-cpu", _compiling("slow-xla", seen=seen)],
        verbose=False,
    )  # fmt: skip
    sample_batch = requests[0].shape[0]
    result = opt.report.candidate("slow-xla")
    assert result.status == "ok", result.reason  # verified, slower than onnxruntime-cpu
    assert set(seen) == {sample_batch}  # never compiled at another batch size
    # Timed at the others (the leader), it is verified there first: wrong outputs reject it.
    monkeypatch.setattr(contest, "MEASURED", 4)
    wrong = infertune.optimize(
        dense_model(), requests[0], traffic=requests,
        backends=["onnxruntime-cpu", _compiling("wrong-xla", right_at=sample_batch)],
        verbose=False,
    )  # fmt: skip
    result = wrong.report.candidate("wrong-xla")
    assert result.status == "mismatch", (result.status, result.reason)
    assert "on random input at batch" in result.reason
    assert sorted(wrong.backends_by_batch) == [1, 2, 8]
    assert set(wrong.backends_by_batch.values()) == {"onnxruntime-cpu"}
    # One batch size in the traffic: nothing is tuned per batch size, so the check at another
    # batch size (which the choice serves too) stays in verification.
    seen.clear()
    monkeypatch.setattr(contest, "MEASURED", 1)
    same = [rng.random((8, 6), np.float32) for _ in range(10)]
    one = infertune.optimize(
        dense_model(), same[0], traffic=same,
        backends=["onnxruntime-cpu", _compiling("slow-xla", seen=seen)], verbose=False,
    )  # fmt: skip
    assert one.backends_by_batch == {8: one.backend}
    assert set(seen) == {8, 1}  # verified at batch 1 as without traffic=
