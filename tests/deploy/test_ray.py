"""infertune.ray on a real local Ray: Ray Data's map_batches with the Predictor, the Ray Serve
deployment answering tritonclient over the Open Inference Protocol, the deployment under a
burst of bad requests (decompression bombs among them) and a replica killed with SIGKILL, and
`infertune serve` stopped with Ctrl-C and with SIGTERM.

One Ray for this module's tests (`ray.init(num_cpus=2)`, 7-10 s), bound to 127.0.0.1, with
its files in a temporary directory and its authentication token in the environment rather
than in ~/.ray. After the module no process it started is left running and its files are
removed (the documentation's Ray snippets, tested later, start a Ray of their own);
`infertune serve`'s own Ray is checked the same way.
"""

from __future__ import annotations

import json
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
import zlib
from http.client import HTTPConnection, HTTPException
from pathlib import Path

import numpy as np
import pytest
from helpers import dense_model

import infertune

# Ray reads its authentication settings when it is imported: a token in the environment
# (rather than the one it would write to ~/.ray/auth_token). It stays set for the rest of the
# test process: Ray keeps token mode once imported, and a later Ray of this process (the
# documentation's snippets) without the token would never start its GCS server.
os.environ.setdefault("RAY_AUTH_MODE", "token")
os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(16))

ray = pytest.importorskip("ray", reason='pip install "infertune[ray]" (in the test extra)')
http = pytest.importorskip("tritonclient.http", reason='pip install "tritonclient[http]"')
from tritonclient.utils import InferenceServerException  # noqa: E402

import infertune.ray  # noqa: E402
from infertune.deploy.protocol import BINARY_HEADER  # noqa: E402

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


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for this module; afterwards nothing of it runs or stays on disk."""
    ray_home = Path.home() / ".ray"
    had_ray_home = ray_home.exists()
    # Ray puts unix sockets under its temp dir: keep the path short (108 bytes at most).
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    try:  # a start that fails leaves nothing behind either
        yield ray.init(num_cpus=2, _temp_dir=temp_dir, include_dashboard=False,
                       _node_ip_address="127.0.0.1", logging_level=logging.WARNING)  # fmt: skip
    finally:
        started = _descendants(os.getpid())
        ray.shutdown()
        left = _still_running(started, timeout_s=30)
        shutil.rmtree(temp_dir, ignore_errors=True)
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
    with pytest.raises(infertune.OptionError, match=r"max_decoded_mb must be a number of MiB > 0"):
        infertune.ray.deployment(dense_saved, max_decoded_mb=0)
    with pytest.raises(infertune.ArtifactError, match="has no manifest.json"):
        infertune.ray.deployment(tmp_path)
    # A result with a string output (its manifest says so): refused by name, before Ray.
    strings = tmp_path / "strings"
    shutil.copytree(dense_saved, strings)
    manifest = json.loads((strings / "manifest.json").read_text())
    manifest["outputs"]["specs"][0]["dtype"] = "object"
    (strings / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(infertune.ModelError, match="output 'output' is strings"):
        infertune.ray.deployment(strings)


# -- Ray Serve with a string input: BYTES tensors -----------------------------------------------
@pytest.mark.slow  # the session's local Ray (tests/conftest.py: tiers)
def test_ray_serve_answers_bytes_tensors(local_ray, text_saved):
    """The text classifier (a (None, 1) string input) served over HTTP: BYTES tensors from
    tritonclient, binary (length-prefixed) and JSON, answered as Keras answers; metadata
    says BYTES; numbers for the strings, a bad length and a body past max_decoded_mb get
    their 4xx with the reason."""
    import struct

    from preprocessing_models import text_classifier
    from ray import serve

    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        app = infertune.ray.deployment(text_saved, max_batch_size=8, max_body_mb=1,
                                       max_decoded_mb=1 / 16)  # fmt: skip
        serve.run(app, name="text", route_prefix="/")
        client = http.InferenceServerClient(f"127.0.0.1:{port}")
        metadata = client.get_model_metadata("text")
        assert metadata["inputs"] == [{"name": "x", "datatype": "BYTES", "shape": [-1, 1]}]
        assert metadata["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [-1, 3]}]
        texts = np.array([["the cat sat on the mat"], ["a dog ate my homework"],
                          ["my cat and the dög"]], dtype=object)  # fmt: skip
        # The saved chain (TensorFlow head, ONNX Runtime body) against Keras: round-off.
        expected = np.asarray(text_classifier()(texts.astype(str)))
        for binary in (True, False):
            tensor = http.InferInput("x", [3, 1], "BYTES")
            tensor.set_data_from_numpy(texts, binary_data=binary)
            got = client.infer("text", [tensor]).as_numpy("output")
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=str(binary))
        client.close()

        numbers = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1]}]}
        blob = struct.pack("<I", 99) + b"the cat"  # a length past the bytes that follow
        header = json.dumps(
            {
                "inputs": [
                    {
                        "name": "x",
                        "shape": [1, 1],
                        "datatype": "BYTES",
                        "parameters": {"binary_data_size": len(blob)},
                    }
                ]
            }
        )
        large = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "BYTES",
                             "data": ["word " * 20_000]}]}  # fmt: skip
        for body, headers, status, reason in [
            (json.dumps(numbers).encode(), {}, 400, "the model takes strings there: send "
             "datatype BYTES"),
            (header.encode() + blob, {BINARY_HEADER: str(len(header))}, 400,
             "string 0 of 1 declares 99 bytes, but only 7"),
            (json.dumps(large).encode(), {}, 413, "max_decoded_mb"),
        ]:  # fmt: skip
            got_status, answer, _ = _post(port, body, headers, name="text")
            assert got_status == status and reason in json.loads(answer)["error"], answer[:300]
    finally:
        serve.shutdown()


# -- Ray Data -----------------------------------------------------------------------------------
@pytest.mark.slow  # the session's local Ray (tests/conftest.py: tiers)
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
@pytest.mark.slow  # the session's local Ray (tests/conftest.py: tiers)
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
        strings = {"inputs": [{"name": "x", "shape": [1, 6], "datatype": "BYTES",
                               "data": ["a"] * 6}]}  # fmt: skip
        status, body, _ = _post(port, json.dumps(strings).encode(), {})
        assert status == 400 and "the model takes numbers there: send datatype FP32" in \
            json.loads(body)["error"], body  # fmt: skip
        np.testing.assert_allclose(_infer(url, x[:2]), got[:2], rtol=RTOL, atol=ATOL)
        client.close()
    finally:
        serve.shutdown()


@pytest.mark.slow  # `infertune serve` starts a Ray of its own, twice
@pytest.mark.parametrize(("signum", "to_group"), [(signal.SIGINT, True), (signal.SIGTERM, False)],
                         ids=["ctrl-c", "sigterm"])  # fmt: skip
def test_serve_command_stops_on_ctrl_c_and_sigterm(dense_saved, tmp_path, signum, to_group):
    """`infertune serve` on its own local Ray, with its limits from the command line; Ctrl-C
    (SIGINT to its process group, as a terminal sends it) or SIGTERM to its process alone (as
    Docker and Kubernetes stop a container) stops the server and every Ray process, and
    exits 0."""
    port = _free_port()
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    env = {**os.environ, "RAY_TMPDIR": temp_dir}  # the token above among them
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "infertune", "serve", str(dense_saved), "--port", str(port),
             "--max-batch-size", "4", "--max-body-mb", "1"],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
    try:
        _wait_for_line(log, "infertune: serving 'dense' at http://127.0.0.1", process, 120)
        assert "bodies up to 1 MiB, 64 MiB decoded" in log.read_text()
        x = np.random.default_rng(3).standard_normal((3, 6)).astype("float32")
        np.testing.assert_allclose(
            _infer(f"127.0.0.1:{port}", x), dense_model()(x), rtol=RTOL, atol=ATOL
        )
        status, body, _ = _post(port, bytes(2 * 2**20), {})
        assert status == 413 and "--max-body-mb" in json.loads(body)["error"], body[:300]
        started = _session(process.pid)
        if to_group:
            os.killpg(process.pid, signum)
        else:
            process.send_signal(signum)
        try:
            code = process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 60 s after {signal.Signals(signum).name}; its output:\n"
                        f"{log.read_text()[-3000:]}")  # fmt: skip
        assert code == 0, log.read_text()[-3000:]
        left = _still_running(started, timeout_s=30)
        assert not left, f"Ray processes outlived the server: {_names(left)}"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _names(pids: list[int]) -> list[str]:
    names = []
    for pid in pids:
        try:
            names.append(Path(f"/proc/{pid}/cmdline").read_bytes()[:60].decode(errors="replace"))
        except OSError:  # it ended meanwhile
            names.append(f"{pid} (ended)")
    return names


# -- Ray Serve under hostile input and faults ---------------------------------------------------
def _replica_pids() -> list[int]:
    """The pids of the OpenInferenceServer replicas of the Ray this test started (not of another
    Ray on the machine): Ray titles a replica's worker process
    `ray::ServeReplica:APP:OpenInferenceServer`."""
    pids = []
    for pid, _ in _descendants(os.getpid()):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:  # it ended while we looked
            continue
        if command.startswith(b"ray::ServeReplica:") and b"OpenInferenceServer" in command:
            pids.append(pid)
    return pids


def _resident_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def _post(port: int, body: bytes, headers: dict[str, str], timeout_s: float = 60,
          name: str = "dense"):  # fmt: skip
    """One POST to the model's infer endpoint on its own connection: (status, body, the
    length of the response's JSON header)."""
    connection = HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        connection.request("POST", f"/v2/models/{name}/infer", body=body, headers=headers)
        response = connection.getresponse()
        length = int(response.getheader("Inference-Header-Content-Length") or 0)
        return response.status, response.read(), length
    finally:
        connection.close()


def _binary_request(x: np.ndarray, shape: list[int] | None = None) -> tuple[bytes, dict]:
    header = json.dumps({
        "inputs": [{"name": "x", "shape": shape or list(x.shape), "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes}}],
        "parameters": {"binary_data_output": True},
    }).encode()  # fmt: skip
    return header + x.tobytes(), {"Inference-Header-Content-Length": str(len(header))}


def _output(body: bytes, length: int) -> np.ndarray:
    """The one output of a response with binary outputs."""
    output = json.loads(body[:length])["outputs"][0]
    return np.frombuffer(body[length:], dtype="<f4").reshape(output["shape"])


def _well_formed(port: int, x: np.ndarray, want: np.ndarray) -> tuple[float, float, str]:
    """One well-formed request: (sent, answered, outcome), the outcome "right", "wrong" (200
    with other outputs), "5xx", "4xx" or "lost" (no answer: the connection failed or timed
    out), the times from time.monotonic()."""
    sent = time.monotonic()
    try:
        status, body, length = _post(port, *_binary_request(x))
    except (OSError, HTTPException):  # reset, refused, timed out: no answer
        return sent, time.monotonic(), "lost"
    if status != 200:
        return sent, time.monotonic(), f"{status // 100}xx"
    try:
        got = _output(body, length)
    except (ValueError, KeyError):  # not the response the protocol gives
        got = np.zeros(0)
    # The same ONNX Runtime result on the same rows: float32 round-off.
    right = got.shape == want.shape and np.allclose(got, want, rtol=RTOL, atol=ATOL)
    return sent, time.monotonic(), "right" if right else "wrong"


class _SteadyClient:
    """Well-formed requests at a steady rate from `threads` threads until stopped, each
    thread one request per `interval_s`; `outcomes` as `_well_formed` gives them."""

    def __init__(self, port: int, inputs: list[np.ndarray], expected: list[np.ndarray],
                 threads: int = 3, interval_s: float = 0.1):  # fmt: skip
        self.outcomes: list[tuple[float, float, str]] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._send, args=(port, inputs, expected, i, interval_s))
            for i in range(threads)
        ]

    def _send(self, port, inputs, expected, first, interval_s) -> None:
        index = first
        while not self._stop.is_set():
            i = index % len(inputs)
            self.outcomes.append(_well_formed(port, inputs[i], expected[i]))
            index += 1
            self._stop.wait(interval_s)

    def __enter__(self):
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=90)


def _one_replica(timeout_s: float = 30) -> int:
    """The pid of the one replica, once the replicas of earlier tests have exited."""
    deadline = time.monotonic() + timeout_s
    while len(pids := _replica_pids()) != 1:
        if time.monotonic() > deadline:
            raise AssertionError(f"expected one replica process, found {pids}")
        time.sleep(0.2)
    return pids[0]


@pytest.mark.slow  # the session's local Ray (tests/conftest.py: tiers)
def test_ray_serve_under_a_burst_of_bad_requests_and_a_killed_replica(local_ray, dense_saved):
    """While well-formed requests run at a steady rate: a burst of malformed and oversized
    requests (decompression bombs among them) gets its 4xx/413 and the well-formed ones keep
    their right answers, the replica's memory bounded; then the replica is killed (SIGKILL)
    with requests in flight, and Ray replaces it: every request sent is answered, right or
    with a 5xx, none wrongly and none lost, and the service answers again."""
    from ray import serve

    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        app = infertune.ray.deployment(dense_saved, max_batch_size=8, max_body_mb=4,
                                       max_decoded_mb=4)  # fmt: skip
        serve.run(app, name="dense", route_prefix="/")
        replica = _one_replica()
        rng = np.random.default_rng(7)
        inputs = [rng.standard_normal((1 + i % 3, 6)).astype("float32") for i in range(12)]
        expected = [np.asarray(dense_model()(x)) for x in inputs]
        compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        zeros = bytes(2**20)
        bomb = b"".join([*(compressor.compress(zeros) for _ in range(256)), compressor.flush()])
        x = inputs[0]
        too_many = _binary_request(np.zeros((9, 6), "float32"))
        huge = _binary_request(x, [2**62, 6])
        body, headers = _binary_request(x)
        fp64 = {"inputs": [{"name": "x", "shape": [1, 6], "datatype": "FP64", "data": [0] * 6}]}
        bad = [  # (body, headers, the status it must get), sent all at once
            *[(bomb, {"Content-Encoding": "gzip"}, 413)] * 4,  # 256 MiB of zeros in 250 KiB
            *[(bytes(5 * 2**20), {}, 413)] * 2,  # past max_body_mb
            *[(*too_many, 400)] * 2,  # a batch past max_batch_size
            (b"{not json", {}, 400),
            (b"[" * 100_000, {}, 400),
            (*huge, 400),  # 2**62 samples: past max_batch_size, before any size is computed
            (body[:-4], headers, 400),  # binary data cut short
            (json.dumps(fp64).encode(), {}, 400),
            (b"\x1f\x8b" + bytes(100), {"Content-Encoding": "gzip"}, 400),
            (b"{}", {"Content-Encoding": "br"}, 415),
        ]
        answers: list[tuple[int, int, bytes]] = []
        in_flight: list[tuple[float, float, str]] = []

        def send_bad(index: int) -> None:
            body, headers, _ = bad[index]
            answers.append((index, *_post(port, body, headers)[:2]))

        def send_well_formed(index: int) -> None:
            in_flight.append(_well_formed(port, inputs[index], expected[index]))

        with _SteadyClient(port, inputs, expected) as steady:
            time.sleep(1.0)
            baseline = peak = _resident_mib(replica)
            senders = [threading.Thread(target=send_bad, args=(i,)) for i in range(len(bad))]
            for sender in senders:
                sender.start()
            while any(sender.is_alive() for sender in senders):
                peak = max(peak, _resident_mib(replica))
                time.sleep(0.01)
            for sender in senders:
                sender.join()
            time.sleep(1.0)  # well-formed requests after the burst, too
            # Requests in flight at the kill: sent just before it, a few ms each on the way.
            extra = [threading.Thread(target=send_well_formed, args=(i,)) for i in range(6)]
            for thread in extra:
                thread.start()
            time.sleep(0.005)
            kill_at = time.monotonic()
            os.kill(replica, signal.SIGKILL)
            # Ray's controller notices the death at its next health check (every 10 s by
            # default) and starts a new replica; 60 s is ample on 2 busy cores.
            recovered_at = None
            while recovered_at is None and time.monotonic() < kill_at + 60:
                time.sleep(0.2)
                answered = [done for sent, done, outcome in steady.outcomes
                            if sent > kill_at and outcome == "right"]  # fmt: skip
                recovered_at = min(answered) if answered else None
            time.sleep(1.0)
        for thread in extra:
            thread.join(timeout=60)

        for index, status, body in sorted(answers):
            assert status == bad[index][2], (index, status, body[:300])
            assert json.loads(body)["error"], body
        assert any(b"max_decoded_mb" in body for _, status, body in answers if status == 413)
        # The bomb is refused at 4 MiB decoded, one request decoded at a time: the replica's
        # memory grows by a few MiB (64 leaves room for Python's allocator), never by the
        # 256 MiB the bomb expands to.
        assert peak - baseline < 64, (baseline, peak)
        outcomes = steady.outcomes + in_flight
        before_kill = [outcome for sent, done, outcome in outcomes if done < kill_at]
        assert before_kill and set(before_kill) == {"right"}, before_kill
        around_kill = [outcome for sent, done, outcome in outcomes if done >= kill_at]
        assert set(around_kill) <= {"right", "5xx"}, around_kill  # none wrong, none lost
        assert sum(sent < kill_at <= done for sent, done, _ in outcomes) >= 1  # in flight
        assert recovered_at is not None, f"no right answer 60 s after the kill: {outcomes}"
        new_replicas = _replica_pids()
        assert new_replicas and replica not in new_replicas
        print(f"burst: replica memory {baseline:.0f} -> {peak:.0f} MiB; kill: "
              f"{sum(sent < kill_at <= done for sent, done, _ in outcomes)} requests in flight, "
              f"{around_kill.count('5xx')} answered 5xx, {around_kill.count('right')} right; "
              f"answers again {recovered_at - kill_at:.1f} s after the kill")  # fmt: skip
    finally:
        serve.shutdown()


def test_a_replica_runs_as_many_batches_at_once_as_the_result_was_tuned_for(tmp_path):
    """optimize(concurrency=3): the served model says 3, and the deployment gives Ray Serve
    room for three batches running and one filling."""
    from helpers import dense_model

    from infertune.deploy.served import ServedModel

    x = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    opt = infertune.optimize(
        dense_model(), x, backends=["onnxruntime-cpu"], concurrency=3, isolation="off",
        verbose=False,
    )  # fmt: skip
    saved = opt.save(tmp_path / "tuned3")
    assert ServedModel(saved).concurrency == 3
    app = infertune.ray.deployment(saved, max_batch_size=8)
    assert app._bound_deployment.max_ongoing_requests == 4 * 8
