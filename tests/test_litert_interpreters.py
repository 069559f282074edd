"""LiteRT's interpreters: one per call running at once, taken from a free list, never shared."""

from __future__ import annotations

import importlib.util
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import dense_model, dict_model, dict_sample

from infertune.backends.litert import LiteRT
from infertune.inputs import build_signature
from infertune.models import load_model
from infertune.target import Target

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ai_edge_litert") is None, reason="ai-edge-litert not installed"
)


def _dense_input(batch: int) -> np.ndarray:
    return np.random.default_rng(batch).standard_normal((batch, 6)).astype("float32")


def _dict_input(batch: int) -> dict:
    return dict_sample(np.random.default_rng(batch), batch)


# dense_model takes run's one-input path (_run_one), dict_model the general one.
MODELS = [(dense_model, _dense_input), (dict_model, _dict_input)]


def prepared(model, sample):
    source = load_model(model)
    signature, flat = build_signature(sample, source.declared_inputs, source.default_float)
    reference, structure = source.call_flat(signature, flat)
    backend = LiteRT()
    backend.prepare(Target(source, signature, structure, [r.dtype for r in reference]))
    return backend, signature


@pytest.mark.parametrize("make_model, make_input", MODELS)
def test_a_call_that_finds_every_interpreter_busy_opens_another(make_model, make_input):
    backend, signature = prepared(make_model(), make_input(4))
    flat = signature.flatten(make_input(3))
    expected = backend.run(flat)
    busy = backend._idle.pop()  # stands for a call in progress in another thread
    got = backend.run(flat)
    assert len(backend._idle) == 1 and backend._idle[0] is not busy  # the new one stays
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)  # same model, same kernels: bit-identical


@pytest.mark.parametrize("make_model, make_input", MODELS)
def test_calls_at_once_never_share_an_interpreter(make_model, make_input):
    backend, signature = prepared(make_model(), make_input(4))
    inputs = [signature.flatten(make_input(1 + i % 4)) for i in range(64)]
    expected = [backend.run(flat) for flat in inputs]
    running, overlap = set(), []
    lock = threading.Lock()

    def watched(interpreter):  # records an interpreter entered while it was already running
        invoke = interpreter.invoke

        def checked_invoke():
            with lock:
                overlap.append(id(interpreter) in running)
                running.add(id(interpreter))
            try:
                time.sleep(0.001)  # holds it busy, so that the other threads' calls overlap
                invoke()
            finally:
                with lock:
                    running.discard(id(interpreter))

        interpreter.invoke = checked_invoke

    opened = type(backend._open)(backend._open.func, **backend._open.keywords)
    for session in backend._idle:
        watched(session.interpreter)

    def open_watched():
        interpreter = opened()
        watched(interpreter)
        return interpreter

    backend._open = open_watched
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(backend.run, inputs))
    assert not any(overlap)
    assert 1 < len(backend._idle) <= 8  # more opened for the overlap, at most one per thread
    for got, want in zip(results, expected):
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)


def test_a_closed_backend_cannot_be_called():
    backend, signature = prepared(dense_model(), _dense_input(2))
    backend.close()
    with pytest.raises(AttributeError):
        backend.run(signature.flatten(_dense_input(2)))
