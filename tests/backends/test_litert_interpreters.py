"""LiteRT's interpreters: one per call running at once, taken from a free list, never shared."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from helpers import (
    dense_model,
    dict_model,
    dict_sample,
    flatten_cnn,
    needs_litert,
    prepared_backend,
)

from infertune.backends.litert import pool as litert
from infertune.backends.litert.backend import LiteRT

pytestmark = needs_litert


def _dense_input(batch: int) -> np.ndarray:
    return np.random.default_rng(batch).standard_normal((batch, 6)).astype("float32")


def _dict_input(batch: int) -> dict:
    return dict_sample(np.random.default_rng(batch), batch)


# dense_model takes run's one-input path (_run_one), dict_model the general one.
MODELS = [(dense_model, _dense_input), (dict_model, _dict_input)]


def pools(backend):
    """The backend's interpreter lists: the sample's fixed shape, and the free batch."""
    return [p for p in (backend._fixed_run, backend._free) if p is not None]


def prepared(model, sample):
    return prepared_backend(LiteRT(), model, sample)


@pytest.mark.parametrize("make_model, make_input", MODELS)
def test_a_call_that_finds_every_interpreter_busy_opens_another(make_model, make_input):
    backend, signature = prepared(make_model(), make_input(4))
    flat = signature.flatten(make_input(3))  # not the sample's batch: the free-batch model
    expected = backend.run(flat)
    busy = backend._free.idle.pop()  # stands for a call in progress in another thread
    got = backend.run(flat)
    assert len(backend._free.idle) == 1 and backend._free.idle[0] is not busy  # it stays
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)  # same model, same kernels: bit-identical


@pytest.mark.parametrize("make_model, make_input", MODELS)
def test_calls_at_once_never_share_an_interpreter(make_model, make_input):
    backend, signature = prepared(make_model(), make_input(4))
    inputs = [signature.flatten(make_input(1 + i % 4)) for i in range(64)]
    expected = [backend.run(flat) for flat in inputs]
    running, overlap = set(), []
    lock = threading.Lock()

    def watched(session):  # records an interpreter entered while it was already running
        invoke = session.invoke

        def checked_invoke():
            with lock:
                overlap.append(id(session) in running)
                running.add(id(session))
            try:
                time.sleep(0.001)  # holds it busy, so that the other threads' calls overlap
                invoke()
            finally:
                with lock:
                    running.discard(id(session))

        session.invoke = checked_invoke
        return session

    for interpreters in pools(backend):
        for session in interpreters.idle:
            watched(session)
        interpreters._session = lambda opened=interpreters._session: watched(opened())
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(backend.run, inputs))
    assert not any(overlap)
    sizes = [len(interpreters.idle) for interpreters in pools(backend)]
    assert sum(sizes) > len(sizes)  # more opened for the overlap...
    assert all(size <= 8 for size in sizes)  # ...at most one per thread
    for got, want in zip(results, expected):
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)


def test_a_closed_backend_cannot_be_called():
    backend, signature = prepared(dense_model(), _dense_input(2))
    backend.close()
    for batch in (2, 3):  # the sample's batch size and another
        with pytest.raises(RuntimeError, match="closed"):
            backend.run(signature.flatten(_dense_input(batch)))
    dict_backend, dict_signature = prepared(dict_model(), _dict_input(2))
    dict_backend.close()  # the general path (two inputs)
    with pytest.raises(RuntimeError, match="closed"):
        dict_backend.run(dict_signature.flatten(_dict_input(3)))


def test_the_single_array_runner_at_the_tuned_shape_never_shares_an_interpreter():
    rng = np.random.default_rng(0)
    backend, signature = prepared(flatten_cnn(), rng.random((4, 8, 8, 1), dtype=np.float32))
    single = backend.single_runner((4, 8, 8, 1))
    assert single is not None
    inputs = [rng.random((4, 8, 8, 1), dtype=np.float32) for _ in range(64)]
    expected = [backend.run([x])[0] for x in inputs]
    running, overlap = set(), []
    lock = threading.Lock()
    for session in backend._fixed_run.idle:

        def checked_invoke(session=session, invoke=session.invoke):
            with lock:
                overlap.append(id(session) in running)
                running.add(id(session))
            try:
                time.sleep(0.001)
                invoke()
            finally:
                with lock:
                    running.discard(id(session))

        session.invoke = checked_invoke
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(single, inputs))
    # Interpreters opened for the overlap are not watched; the watched one never ran twice
    # at once, and every result is the sequential one.
    assert overlap and not any(overlap)
    assert len(backend._fixed_run.idle) > 1
    for got, want in zip(results, expected):
        np.testing.assert_array_equal(got, want)
    backend.close()
    with pytest.raises(RuntimeError, match="closed"):
        single(inputs[0])


@pytest.mark.parametrize("make_model, make_input", MODELS)
def test_the_native_calls_and_the_public_methods_give_the_same_results(
    make_model, make_input, monkeypatch
):
    """Calls go to the interpreter's native wrapper; an ai-edge-litert whose wrapper lacks one
    of its methods (stood for by asking for a method no wrapper has) gets the public ones."""
    model = make_model()
    batches = (4, 1, 9, 9)  # the sample's batch (fixed model), then resizes of the free one
    native, _ = prepared(model, make_input(4))
    session = native._free.idle[-1]
    assert session.invoke.__self__ is session.interpreter._interpreter  # the native path
    with monkeypatch.context() as patch:
        patch.setattr(litert, "_NATIVE_CALLS", (*litert._NATIVE_CALLS, "NoSuchMethod"))
        public, signature = prepared(model, make_input(4))
    session = public._free.idle[-1]
    assert session.invoke == session.interpreter.invoke  # the public path
    for batch in batches:
        flat = signature.flatten(make_input(batch))
        for a, b in zip(native.run(flat), public.run(flat)):
            np.testing.assert_array_equal(a, b)  # same model, same kernels: bit-identical


def test_a_single_array_runner_at_another_batch_size_resizes_only_when_the_shape_changed():
    backend, _ = prepared(dense_model(), _dense_input(4))
    single = backend.single_runner((3, 6))  # not the sample's batch: the free-batch model
    resizes = []
    for session in backend._free.idle:
        resize = session.resize

        def counting_resize(index, shape, resize=resize):
            resizes.append(tuple(shape))
            return resize(index, shape)

        session.resize = counting_resize
    x3, x5 = _dense_input(3), _dense_input(5)
    expected3 = backend.run([x3])[0]  # resizes to 3 (the first call at any size does)
    runs = [single(x3) for _ in range(3)]  # already at 3: no resize
    backend.run([x5])  # another call resizes the interpreter to 5...
    runs.append(single(x3))  # ...and the runner resizes it back
    runs.append(single(x3))
    assert resizes == [(3, 6), (5, 6), (3, 6)]
    for got in runs:
        np.testing.assert_array_equal(got, expected3)
