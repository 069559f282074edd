"""The TensorRT candidates under optimize(traffic=...): an engine (or a session) per padded
bucket, its optimization profile fixed at the bucket's length, and the traffic's lengths
measured through such engines.

FAKES, because no GPU can exist here: the engine builds themselves. `EngineOnCpu` is
TensorRtEngine with `engine_call(profile)` answered by ONNX Runtime on the CPU, refusing any
input shape outside the profile as a TensorRT engine does; `TensorrtSessionOnCpu` is
OnnxRuntimeTensorrt whose sessions run on the CPU provider, the TensorRT profile each was
given recorded. Everything else is the backends' own: the bucket's runner, its profile
(Profile.at_shapes), closing, and the traffic plan's measurement, verification and dispatch.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from helpers import dense_model, prepared_backend, weight_copying
from traffic_models import masked_encoder, request, traffic

import infertune
from infertune.backends.onnxruntime.cuda import OnnxRuntimeTensorrt
from infertune.backends.tensorrt.engine import TensorRtEngine
from infertune.backends.tensorrt.profiles import (
    PROFILE_MAX_BATCH,
    Profile,
    default_batch_sizes,
    profile_shapes,
)
from infertune.errors import ClosedError


class _ProfiledSession:
    """An ONNX Runtime CPU session standing for a TensorRT engine built for `profile`."""

    def __init__(self, session: ort.InferenceSession, profile: Profile, input_names, wrong):
        self.session, self.profile, self.names = session, profile, list(input_names)
        self.closed, self.wrong = False, wrong

    def run(self, inputs):
        if self.closed:
            raise ClosedError("the TensorRT engine was closed: it is released")
        for name, x in zip(self.names, inputs):
            if not self.profile.covers(name, x.shape):
                raise ValueError(f"input {name} of shape {x.shape} is outside the profile")
        outputs = self.session.run(None, dict(zip(self.names, inputs)))
        return [o + 1.0 for o in outputs] if self.wrong(inputs) else outputs

    def close(self):
        self.closed = True


class EngineOnCpu(TensorRtEngine):
    """FAKE device (see the module's doc): the engines are ONNX Runtime CPU sessions, one per
    profile as the engine cache keeps one per profile on disk; `opened` lists the profile of
    every engine_call (the main engine first)."""

    name = "engine-on-cpu"
    rehearse_in_child = False  # built in this process: the child knows only registered names

    def __init__(self, wrong=lambda inputs: False):
        super().__init__()
        self.cache: dict[Profile, ort.InferenceSession] = {}
        self.opened: list[Profile] = []
        self.wrong = wrong  # which calls it answers wrongly (none by default)

    def available(self):
        return None

    def prepare(self, target):
        # TensorRtEngine.prepare without tensorrt and cuda-python: the export (and the exact
        # shapes, convert() sets them), the profile, the main engine.
        self.convert(target)
        self._model_bytes = self._exported.model_bytes
        self._profile = profile_shapes(
            target.signature, default_batch_sizes(target.signature), self._exported.input_names
        )
        self._main = self.engine_call(self._profile)

    def engine_call(self, profile):
        self.opened.append(profile)
        if profile not in self.cache:
            self.cache[profile] = ort.InferenceSession(
                self._model_bytes, providers=["CPUExecutionProvider"]
            )
        return _ProfiledSession(
            self.cache[profile], profile, self._exported.input_names, self.wrong
        )


class TensorrtSessionOnCpu(OnnxRuntimeTensorrt):
    """FAKE device (see the module's doc): the TensorRT provider's sessions on the CPU
    provider and device, the profile each session was made for in `profiles`."""

    name = "tensorrt-session-on-cpu"
    provider = "CPUExecutionProvider"
    device = "cpu"
    rehearse_in_child = False

    def __init__(self):
        super().__init__()
        self.profiles: list[Profile] = []

    def available(self):
        return None

    def preload_libraries(self):
        return ()

    def profile_providers(self, profile, model_bytes):
        self.profiles.append(profile)
        return [("CPUExecutionProvider", {})]


@pytest.fixture(scope="module")
def encoder():
    return masked_encoder()


def _matches(outputs, model, x) -> None:
    want = model(x)
    # float32 round-off of two attention blocks in ONNX Runtime against TensorFlow
    for got, key in zip(outputs, ("pooled", "sequence")):
        np.testing.assert_allclose(got, np.asarray(want[key]), rtol=1e-4, atol=1e-5)


def test_a_profile_at_a_buckets_shapes_keeps_the_batch_range_and_fixes_the_rest():
    main = Profile((("in_0", (1, 8), (4, 8), (64, 8)), ("in_1", (2, 8, 3), (2, 8, 3), (2, 8, 3))))
    at = main.at_shapes([(1, 32), (2, 32, 3)])
    assert at.shapes == (
        ("in_0", (1, 32), (4, 32), (64, 32)),  # the batch's opt stays the sample's
        ("in_1", (2, 32, 3), (2, 32, 3), (2, 32, 3)),  # a fixed batch stays fixed
    )
    assert at.covers_all([(9, 32), (2, 32, 3)]) and not at.covers_all([(9, 31), (2, 32, 3)])
    assert main.at_shapes([(3, 32), (2, 32, 3)]) == at  # the same bucket, the same engine
    with pytest.raises(ValueError, match="rank 2"):
        main.at_shapes([(1, 32, 1), (2, 32, 3)])
    with pytest.raises(ValueError, match="1 shapes for a profile of 2 inputs"):
        main.at_shapes([(1, 32)])


def test_the_tensorrt_candidates_know_their_exact_shapes_once_converted(encoder):
    """The real classes (convert() needs no GPU: the ONNX export): the exact shapes are
    known after convert(), before the rehearsal in the child runs the checks of them only."""
    from helpers import target_for

    target = target_for(encoder, request(8))
    for backend in (TensorRtEngine(), OnnxRuntimeTensorrt()):
        backend.convert(target)
        assert backend.exact_shapes == [(1, 8), (1, 8)], backend.name
        assert "optimize(traffic=...) builds an engine" in backend.exact_reason
    fixed = target_for(dense_model(), np.zeros((4, 6), "float32"))  # free batch only
    for backend in (TensorRtEngine(), OnnxRuntimeTensorrt()):
        backend.convert(fixed)
        assert backend.exact_shapes is None, backend.name


def test_a_buckets_engine_is_built_for_its_length_and_serves_every_batch(encoder):
    backend, signature = prepared_backend(EngineOnCpu(), encoder, request(8))
    flat = signature.flatten
    with pytest.raises(ValueError, match="outside the profile"):
        backend.run(flat(request(20)))  # the main engine: the sample's length only
    assert backend.exact_shapes == [(1, 8), (1, 8)]  # which the callable knows
    assert "builds an engine for each bucket's length" in backend.exact_reason
    run = backend.shaped_runner()
    for batch in (1, 3, 1, 7):
        x = request(20, batch=batch, seed=batch)
        _matches(run(flat(x)), encoder, x)
    main, bucket = backend.opened  # one engine for the bucket, whatever the batch
    assert bucket == main.at_shapes([(1, 20), (1, 20)])
    assert bucket.shapes[0][1:] == ((1, 20), (1, 20), (PROFILE_MAX_BATCH, 20))
    with pytest.raises(ValueError, match="outside the profile"):
        run(flat(request(21)))  # not this bucket's length
    run.close()
    assert backend._bucket_engines == []
    with pytest.raises(ClosedError):
        run(flat(request(20)))  # a closed bucket opens no engine again
    backend.close()
    with pytest.raises(ClosedError):
        backend.run(flat(request(8)))
    with pytest.raises(ClosedError):
        backend.shaped_runner()(flat(request(20)))


def test_a_bucket_of_the_tensorrt_provider_gets_a_session_for_its_length(encoder):
    backend, signature = prepared_backend(TensorrtSessionOnCpu(), encoder, request(8))
    flat = signature.flatten
    run = backend.shaped_runner()
    for batch in (2, 5):
        x = request(24, batch=batch, seed=batch)
        _matches(run(flat(x)), encoder, x)
    main, bucket = backend.profiles  # the session's own profile, then the bucket's
    assert main.shapes[0][2] == (1, 8)
    assert bucket == main.at_shapes([(1, 24), (1, 24)])
    assert bucket.ort_options()["trt_profile_opt_shapes"] == "in_0:1x24,in_1:1x24"
    run.close()
    with pytest.raises(ClosedError):
        run(flat(request(24)))
    backend.close()
    assert backend._bucket_sessions == []


def test_warm_up_opens_each_buckets_engine_before_the_first_request(encoder):
    """load(), a tuning-cache hit and a served model warm every call path before their
    first request (calling.warm_up): each padded bucket's engine is opened then (read from
    the engine cache, or built there on a host whose cache lacks it), not inside a
    request."""
    from helpers import choice_with_buckets, target_for

    from infertune.backends.onnxruntime.cpu import OnnxRuntimeCpu
    from infertune.model.traffic import FreeDim
    from infertune.pipeline.padding import pad_values_for
    from infertune.result.buckets import Bucket, Buckets
    from infertune.result.calling import warm_up

    target = target_for(encoder, request(8))
    engine, free = EngineOnCpu(), OnnxRuntimeCpu()
    for backend in (engine, free):
        backend.prepare(target)
    signature = target.signature
    buckets = Buckets(
        FreeDim("length", ((0, 1), (1, 1))), [Bucket(16, engine, True), Bucket(32, engine, True)],
        free, pad_values_for(0, signature), ((1, 1),),
    )  # fmt: skip
    warm_up(choice_with_buckets(target, free, buckets))
    main = engine._profile
    assert engine.opened == [main, main.at_shapes([(1, 16)] * 2), main.at_shapes([(1, 32)] * 2)]
    x = request(30, seed=3)
    got = buckets.run(signature.flatten(x))
    _matches(got, encoder, x)
    assert len(engine.opened) == 3  # the request opened no engine


def _tuned_on_traffic(encoder, engine: EngineOnCpu):
    """optimize(traffic=80 requests) with `engine` and a slower candidate that runs any
    length (4 ms a call), in this process: the fake engine is not a registered name."""
    return infertune.optimize(
        encoder, request(8), traffic=traffic(80),
        backends=[engine, weight_copying("free", lambda _: 0.004)],
        isolation="off", verbose=False,
    )  # fmt: skip


@pytest.mark.slow
def test_the_traffic_is_measured_and_served_through_engines_of_each_buckets_length(encoder):
    """The engine candidate, faster than the one that runs any length, is measured at the
    traffic's lengths through engines built for them and serves them padded into buckets,
    reading each bucket's engine from the engine cache (no build beyond the measured ones);
    a request longer than any seen goes to the other candidate at its own length."""
    engine = EngineOnCpu()
    opt = _tuned_on_traffic(encoder, engine)
    summary = opt.report.traffic
    lengths = summary["lengths"]
    assert not np.isnan(summary["p50_ms"]["engine-on-cpu"]).any()
    assert "engine-on-cpu" not in summary["switch_ms"]  # never run at a request's own length
    buckets = summary["buckets"]
    assert buckets and all(b["candidate"] == "engine-on-cpu" and b["padded"] for b in buckets)
    # The main engine, one per measured length, and the kept buckets' from the cache.
    measured = {engine._profile.at_shapes([(1, n), (1, n)]) for n in lengths}
    assert set(engine.cache) == {engine._profile, *measured}
    assert len(engine._bucket_engines) == len(buckets)  # the measuring engines released
    for n in [3, 8, 17, max(lengths), max(lengths) + 9]:
        x = request(n, seed=n)
        got = opt(x)
        _matches([got["pooled"], got["sequence"]], encoder, x)


@pytest.mark.slow
def test_a_bucket_wrong_at_another_batch_size_is_not_kept(encoder):
    """A bucket serves every batch size: it is verified at the traffic's and at another
    (batch 2 for a traffic of single requests). An engine wrong beyond batch 1 loses its
    buckets, and the requests go to the other candidate at their own lengths."""
    engine = EngineOnCpu(wrong=lambda inputs: inputs[0].shape[0] > 1)
    opt = _tuned_on_traffic(encoder, engine)
    summary = opt.report.traffic
    failed = str(summary.get("failed"))
    assert "at batch 2 by engine-on-cpu" in failed, failed
    assert summary["kept"].startswith("exact shapes by free: the buckets failed verification")
    for n, batch in [(5, 1), (12, 2), (30, 3)]:
        x = request(n, batch=batch, seed=n)
        got = opt(x)
        _matches([got["pooled"], got["sequence"]], encoder, x)
