"""close(): a result releases every runtime it holds (each candidate of its choice), refuses
calls afterwards with ClosedError, and closes at the end of a `with` block.

What is alive is counted on the runtimes' own objects: a weak reference to every native
ONNX Runtime session (`InferenceSession._sess`), OpenVINO compiled model and infer request,
and LiteRT interpreter made while a test runs, counted after a garbage collection.
"""

from __future__ import annotations

import functools
import gc
import importlib.util
import weakref
from collections.abc import Callable

import numpy as np
import pytest
from helpers import assert_matches_model, dense_model

import infertune
from infertune.deploy.served import ServedModel
from infertune.optimized import Optimized
from infertune.result.choice import Choice
from infertune.result.saved import open_saved, restore

CLOSED = r"was closed \(opt\.close\(\) or the end of its `with` block\).*infertune\.optimize"


class LiveObjects:
    """Weak references to the native objects each runtime made since the fixture started."""

    def __init__(self):
        self.refs: dict[str, list[weakref.ref]] = {"onnxruntime": [], "openvino": [], "litert": []}

    def add(self, runtime: str, obj: object) -> None:
        self.refs[runtime].append(weakref.ref(obj))

    def count(self, runtime: str) -> int:
        """How many of them are alive once every cycle is collected."""
        gc.collect()
        return sum(ref() is not None for ref in self.refs[runtime])


def _counting(cls: type, name: str, record: Callable[[object, object], None]) -> Callable:
    """Wrap `cls.name` so that `record(self, result)` sees every object it makes."""
    original = getattr(cls, name)

    @functools.wraps(original)
    def made(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        record(self, result)
        return result

    return made


@pytest.fixture
def live(monkeypatch) -> LiveObjects:
    import onnxruntime

    objects = LiveObjects()
    session = onnxruntime.InferenceSession
    monkeypatch.setattr(
        session,
        "__init__",
        _counting(session, "__init__", lambda s, _: objects.add("onnxruntime", s._sess)),
    )
    if importlib.util.find_spec("openvino") is not None:
        import openvino

        for cls, method in (
            (openvino.Core, "compile_model"),
            (openvino.CompiledModel, "create_infer_request"),
        ):
            made = _counting(cls, method, lambda _, made: objects.add("openvino", made))
            monkeypatch.setattr(cls, method, made)
    if importlib.util.find_spec("ai_edge_litert") is not None:
        from ai_edge_litert.interpreter import Interpreter

        def native(interpreter, _):  # what the calls hold: its native wrapper's methods
            objects.add("litert", interpreter._interpreter)

        made = _counting(Interpreter, "__init__", native)
        monkeypatch.setattr(Interpreter, "__init__", made)
    return objects


def _sample(batch: int = 4, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 6)).astype("float32")


def _optimize(backend: str) -> Optimized:
    return infertune.optimize(
        dense_model(), _sample(), backends=[backend], isolation="off", verbose=False
    )


@pytest.mark.slow
def test_close_releases_the_onnxruntime_session_and_refuses_calls(live, tmp_path):
    model, x = dense_model(), _sample()
    opt = _optimize("onnxruntime-cpu")
    assert opt.backend == "onnxruntime-cpu"
    assert live.count("onnxruntime") == 1  # the chosen candidate's session, nothing else
    assert_matches_model(model(x), opt(x))

    opt.close()
    assert live.count("onnxruntime") == 0
    with pytest.raises(infertune.ClosedError, match=CLOSED):
        opt(x)
    assert issubclass(infertune.ClosedError, infertune.InfertuneError)
    assert issubclass(infertune.ClosedError, RuntimeError)
    with pytest.raises(infertune.ClosedError, match=CLOSED):
        opt.save(tmp_path / "saved")
    opt.close()  # again: nothing to do
    assert opt.report.selected == "onnxruntime-cpu"  # what it was stays readable
    assert repr(opt).endswith(" closed>")


def test_close_releases_every_backend_of_the_choice(live, dense_saved):
    """A choice with a candidate per batch size and an exact-shape path, each a session of
    its own (three loads of one saved result): all three released by one close()."""
    (first, report), (second, _), (third, _) = (restore(open_saved(dense_saved)) for _ in "123")
    choice = Choice(
        first.general,
        first.inputs,
        first.outputs,
        by_batch={1: first.general, 16: second.general},
        exact_shape=third.general,  # serves the sample's shape, (4, 6)
    )
    opt = Optimized(choice, report, {})
    del first, second, third, choice
    assert len(opt.backends) == 3 and live.count("onnxruntime") == 3
    model = dense_model()
    for batch in (1, 4, 16, 32):  # the general, the exact-shape path, the large, the large
        x = _sample(batch, seed=batch)
        assert_matches_model(model(x), opt(x))

    opt.close()
    assert live.count("onnxruntime") == 0
    with pytest.raises(infertune.ClosedError, match=CLOSED):
        opt(_sample(16))


def test_a_with_block_closes_a_loaded_result(live, dense_saved):
    with infertune.load(dense_saved, verbose=False) as opt:
        assert live.count("onnxruntime") == 1
        assert opt(_sample()).shape == (4, 3)
    assert live.count("onnxruntime") == 0
    with pytest.raises(infertune.ClosedError, match=CLOSED):
        opt(_sample())

    # An error inside the block closes it too.
    with pytest.raises(KeyError), infertune.load(dense_saved, verbose=False) as opt:
        raise KeyError("inside the block")
    assert live.count("onnxruntime") == 0
    with pytest.raises(infertune.ClosedError):
        opt(_sample())


def test_a_runner_kept_past_close_holds_no_session(live, dense_saved):
    """The call path's pieces, kept beyond close() (here by the test; in a traceback, say),
    let the session go and refuse to run: close() cuts their hold on it."""
    opt = infertune.load(dense_saved, verbose=False)
    (backend,) = opt.backends
    single, run = backend.single_runner((4, 6)), backend.run
    x = _sample()
    np.testing.assert_array_equal(single(x), run([x])[0])

    opt.close()
    assert live.count("onnxruntime") == 0
    for kept in (single, lambda x: run([x])):
        with pytest.raises(infertune.ClosedError, match="onnxruntime-cpu backend was closed"):
            kept(x)


def test_a_served_model_releases_its_runtime_on_close(live, dense_saved):
    served = ServedModel(dense_saved)
    assert live.count("onnxruntime") == 1
    served.close()
    served.close()
    assert live.count("onnxruntime") == 0
    with pytest.raises(infertune.ClosedError, match="was closed"):
        served.run([_sample()])


@pytest.mark.parametrize(
    ("backend", "runtime"), [("openvino-cpu", "openvino"), ("litert", "litert")]
)
def test_close_releases_openvino_and_litert(live, backend, runtime):
    pytest.importorskip({"openvino": "openvino", "litert": "ai_edge_litert"}[runtime])
    x = _sample()
    with _optimize(backend) as opt:
        assert opt.backend == backend
        assert live.count(runtime) > 0
        assert_matches_model(dense_model()(x), opt(x))
    assert live.count(runtime) == 0
    with pytest.raises(infertune.ClosedError, match=CLOSED):
        opt(x)
