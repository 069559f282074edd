"""infertune.ray on a real local Ray: Ray Data's map_batches with the Predictor, the Ray Serve
deployment answering tritonclient over the Open Inference Protocol, and `infertune serve`
stopped with Ctrl-C.

One Ray for the whole session (`ray.init(num_cpus=2)`, 7-10 s), bound to 127.0.0.1, with its
files in a temporary directory and its authentication token in the environment rather than
in ~/.ray. At the end of the session no process it started is left running and its files are
removed; `infertune serve`'s own Ray is checked the same way.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import dense_model

import infertune

# Ray reads its authentication settings when it is imported: a token in the environment
# (rather than the one it would write to ~/.ray/auth_token) for the session's Ray.
_RAY_ENV = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
_ENV_BEFORE = {key: os.environ.get(key) for key in _RAY_ENV}
os.environ.update(_RAY_ENV)

ray = pytest.importorskip("ray", reason='pip install "infertune[ray]" (in the test extra)')
http = pytest.importorskip("tritonclient.http", reason='pip install "tritonclient[http]"')
from tritonclient.utils import InferenceServerException  # noqa: E402

import infertune.ray  # noqa: E402

# The same ONNX Runtime result on the same rows, alone or batched with others: float32
# round-off of a 2-layer network (a few ulps), far below any real difference.
RTOL, ATOL = 1e-5, 1e-6


# -- processes and files ------------------------------------------------------------------------
def _processes() -> dict[int, tuple[int, int, str, str]]:
    """Every process: pid -> (parent pid, session id, state, start time) from /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it ended while we looked
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        found[int(entry.name)] = (int(fields[1]), int(fields[3]), fields[0], fields[19])
    return found


def _descendants(root: int) -> set[tuple[int, str]]:
    """(pid, start time) of every live process below `root`."""
    table = _processes()
    children: dict[int, list[int]] = {}
    for pid, (parent, *_rest) in table.items():
        children.setdefault(parent, []).append(pid)
    found, stack = set(), list(children.get(root, []))
    while stack:
        pid = stack.pop()
        found.add((pid, table[pid][3]))
        stack += children.get(pid, [])
    return found


def _still_running(processes: set[tuple[int, str]], timeout_s: float) -> list[int]:
    """The pids of `processes` still running (zombies have ended) after up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        table = _processes()
        alive = [pid for pid, start in processes
                 if pid in table and table[pid][3] == start and table[pid][2] != "Z"]  # fmt: skip
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def _session(sid: int) -> set[tuple[int, str]]:
    return {(pid, info[3]) for pid, info in _processes().items() if info[1] == sid}


@pytest.fixture(scope="session")
def local_ray():
    """One local Ray for the session; afterwards nothing of it runs or stays on disk."""
    ray_home = Path.home() / ".ray"
    had_ray_home = ray_home.exists()
    # Ray puts unix sockets under its temp dir: keep the path short (108 bytes at most).
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    context = ray.init(num_cpus=2, _temp_dir=temp_dir, include_dashboard=False,
                       _node_ip_address="127.0.0.1", logging_level=logging.WARNING)  # fmt: skip
    try:
        yield context
    finally:
        started = _descendants(os.getpid())
        ray.shutdown()
        left = _still_running(started, timeout_s=30)
        shutil.rmtree(temp_dir, ignore_errors=True)
        for key, value in _ENV_BEFORE.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        assert not left, f"Ray processes still running after ray.shutdown(): {left}"
        assert had_ray_home or not ray_home.exists(), "the tests' Ray wrote ~/.ray"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_line(log: Path, text: str, process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text(errors="replace"):
        if process.poll() is not None:
            raise AssertionError(f"the server exited with {process.returncode}:\n"
                                 f"{log.read_text(errors='replace')[-3000:]}")  # fmt: skip
        if time.monotonic() > deadline:
            raise AssertionError(f"no {text!r} after {timeout_s} s")
        time.sleep(0.5)


def _infer(url: str, x: np.ndarray, name: str = "dense") -> np.ndarray:
    """One request, with its own client (tritonclient.http clients are not thread-safe)."""
    client = http.InferenceServerClient(url)
    tensor = http.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    try:
        return client.infer(name, [tensor]).as_numpy("output")
    finally:
        client.close()


def test_deployment_checks_its_arguments_before_ray_runs_it(dense_saved, tmp_path):
    with pytest.raises(infertune.OptionError, match="max_batch_size must be an integer >= 1"):
        infertune.ray.deployment(dense_saved, max_batch_size=0)
    with pytest.raises(infertune.OptionError, match="model name must be letters"):
        infertune.ray.deployment(dense_saved, name="a/b")
    with pytest.raises(infertune.ArtifactError, match="has no manifest.json"):
        infertune.ray.deployment(tmp_path)


# -- Ray Data -----------------------------------------------------------------------------------
def test_ray_data_predictor_on_two_actors(local_ray, dense_saved):
    x = np.random.default_rng(1).standard_normal((64, 6)).astype("float32")
    dataset = ray.data.from_numpy(np.array_split(x, 4))  # from_numpy(x) would be one block
    assert dataset.num_blocks() == 4
    predicted = dataset.map_batches(
        infertune.ray.Predictor,
        fn_constructor_kwargs={"path": str(dense_saved)},
        batch_size=8,
        compute=ray.data.ActorPoolStrategy(size=2),
    ).take_all()
    assert len(predicted) == 64 and set(predicted[0]) == {"output"}
    got = np.stack([row["output"] for row in predicted])
    expected = np.asarray(dense_model()(x))
    # Ray Data does not keep the rows' order: compare both sorted by their first value.
    got, expected = (a[np.argsort(a[:, 0])] for a in (got, expected))
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


# -- Ray Serve ----------------------------------------------------------------------------------
def test_ray_serve_answers_tritonclient_in_batches(local_ray, dense_saved):
    from ray import serve

    port = _free_port()
    url = f"127.0.0.1:{port}"
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        # A long wait for more requests: 16 requests sent at once must form batches > 1.
        app = infertune.ray.deployment(dense_saved, max_batch_size=16, batch_wait_timeout_s=0.05)
        serve.run(app, name="dense", route_prefix="/")
        client = http.InferenceServerClient(url)
        assert client.is_server_ready() and client.is_model_ready("dense")
        metadata = client.get_model_metadata("dense")
        assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 6]}]
        assert metadata["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [-1, 3]}]
        assert metadata["parameters"]["backend"] == "onnxruntime-cpu"

        x = np.random.default_rng(2).standard_normal((32, 6)).astype("float32")
        answers: dict[int, np.ndarray] = {}
        start = threading.Barrier(16)

        def send(thread: int) -> None:
            start.wait()
            for row in range(thread, 32, 16):
                answers[row] = _infer(url, x[row : row + 1])

        threads = [threading.Thread(target=send, args=(i,)) for i in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert sorted(answers) == list(range(32))
        got = np.concatenate([answers[row] for row in range(32)])
        np.testing.assert_allclose(got, dense_model()(x), rtol=RTOL, atol=ATOL)
        stats = client.get_inference_statistics("dense")["model_stats"][0]
        assert stats["inference_count"] == 32
        assert max(b["batch_size"] for b in stats["batch_stats"]) > 1, stats["batch_stats"]

        with pytest.raises(InferenceServerException, match=r"\[400\].*'x' has shape \(1, 5\)"):
            _infer(url, x[:1, :5])
        np.testing.assert_allclose(_infer(url, x[:2]), got[:2], rtol=RTOL, atol=ATOL)
        client.close()
    finally:
        serve.shutdown()


def test_serve_command_stops_on_ctrl_c(dense_saved, tmp_path):
    """`infertune serve` on its own local Ray; Ctrl-C (SIGINT to its process group, as a
    terminal sends it) stops the server and every Ray process, and exits 0."""
    port = _free_port()
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    env = {**os.environ, **_RAY_ENV, "RAY_TMPDIR": temp_dir}
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "infertune", "serve", str(dense_saved), "--port", str(port),
             "--max-batch-size", "4"],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
    try:
        _wait_for_line(log, "infertune: serving 'dense' at http://127.0.0.1", process, 120)
        x = np.random.default_rng(3).standard_normal((3, 6)).astype("float32")
        np.testing.assert_allclose(
            _infer(f"127.0.0.1:{port}", x), dense_model()(x), rtol=RTOL, atol=ATOL
        )
        started = _session(process.pid)
        os.killpg(process.pid, signal.SIGINT)
        try:
            code = process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 60 s after Ctrl-C; its output:\n{log.read_text()[-3000:]}")
        assert code == 0, log.read_text()[-3000:]
        assert not _still_running(started, timeout_s=30), "Ray processes outlived the server"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        shutil.rmtree(temp_dir, ignore_errors=True)
