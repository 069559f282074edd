"""export_triton(..., backend="python") served by a real Triton Inference Server.

The server is the one nvidia-pytriton bundles (Triton 2.51 with its Python backend only). It
pins numpy<2, so it lives in a virtual environment of its own: $INFERTUNE_TRITON_VENV, or
.triton-venv/ at the repository root, built on first use (about 2 minutes; a cache, like
.venv, kept for later runs). Where it cannot be built the test is skipped with pip's reason.

The Python backend runs model.py with that environment's Python (the stub finds it through
PATH) and the interpreter's own libpython (LD_LIBRARY_PATH, else the system's is loaded).
infertune comes from this checkout: a .pth file, written for the session and removed after,
puts a directory holding a link to it on that Python's path.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import dense_model, dict_model, dict_sample, needs_litert

import infertune

try:
    import tritonclient.http as http
# ImportError: no tritonclient; RuntimeError: tritonclient installed without its http extra
except (ImportError, RuntimeError) as exc:
    pytest.skip(f'pip install "tritonclient[http]" ({exc})', allow_module_level=True)
from tritonclient.utils import InferenceServerException  # noqa: E402

# Tiers (tests/conftest.py): a real Triton server started for the test, in a virtual
# environment that pip builds from the package index on first use (about 2 minutes).
pytestmark = [pytest.mark.slow, pytest.mark.network]
ROOT = Path(__file__).resolve().parents[2]  # the repository's root, above tests/deploy/
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
# The same result run by infertune in Triton and here, on the same inputs: float32 round-off
# (a few ulps of a 2-layer network), far below any real difference.
RTOL, ATOL = 1e-5, 1e-6


def _site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{PYTHON}" / "site-packages"


def _requirements() -> list[str]:
    """pytriton, and the runtimes of the results served, at the versions tuned with here."""
    wanted = ["nvidia-pytriton==0.7.0"]
    for package in ("onnxruntime", "ai-edge-litert"):
        try:
            wanted.append(f"{package}=={importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return wanted


def _constraints() -> list[str]:
    """The versions this environment last passed with (constraints-triton.txt), so that a new
    release of one of pytriton's dependencies cannot break the test overnight."""
    if os.environ.get("INFERTUNE_TRITON_UNPINNED"):
        return []
    return ["-c", str(ROOT / "constraints-triton.txt")]


@pytest.fixture(scope="session")
def triton_venv() -> Path:
    venv = Path(os.environ.get("INFERTUNE_TRITON_VENV") or ROOT / ".triton-venv")
    server = _site_packages(venv) / "pytriton" / "tritonserver" / "bin" / "tritonserver"
    if not server.is_file():
        started = time.perf_counter()
        steps = [
            [sys.executable, "-m", "venv", "--clear", str(venv)],
            [str(venv / "bin" / "pip"), "install", "-q", *_constraints(), *_requirements()],
        ]
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                lines = (done.stderr or done.stdout).strip().splitlines()
                pytest.skip(f"cannot build the Triton environment ({' '.join(step[:4])}...): "
                            f"{lines[-1] if lines else done.returncode}")  # fmt: skip
        print(f"\nbuilt {venv} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    stub = (_site_packages(venv) / "pytriton" / "tritonserver" / "python_backend_stubs" / PYTHON
            / "triton_python_backend_stub")  # fmt: skip
    if not stub.is_file():
        pytest.skip(f"nvidia-pytriton has no Python-backend stub for Python {PYTHON}")
    return venv


@pytest.fixture
def triton_server(triton_venv, tmp_path):
    """Start Triton on a model repository the test fills first: call with the repository."""
    site = _site_packages(triton_venv)
    dist = site / "pytriton" / "tritonserver"
    backends = tmp_path / "backends" / "python"
    backends.mkdir(parents=True)
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        (backends / name).symlink_to(dist / "backends" / "python" / name)
    (backends / "triton_python_backend_stub").symlink_to(
        dist / "python_backend_stubs" / PYTHON / "triton_python_backend_stub"
    )
    packages = tmp_path / "packages"
    packages.mkdir()
    (packages / "infertune").symlink_to(Path(infertune.__file__).parent)
    pth = site / f"_infertune_test_{os.getpid()}.pth"
    pth.write_text(f"{packages}\n")
    started: list[subprocess.Popen] = []

    def start(repository: Path) -> str:
        port = _free_port()
        libs = [sysconfig.get_config_var("LIBDIR"), str(site / "nvidia_pytriton.libs")]
        env = {**os.environ, "PATH": f"{triton_venv / 'bin'}:{os.environ['PATH']}",
               "LD_LIBRARY_PATH": ":".join(filter(None, libs))}  # fmt: skip
        log = open(tmp_path / "triton.log", "wb")  # noqa: SIM115 (closed with the process)
        process = subprocess.Popen(
            [str(dist / "bin" / "tritonserver"), f"--model-repository={repository}",
             f"--backend-directory={tmp_path / 'backends'}", "--http-address=127.0.0.1",
             f"--http-port={port}", "--allow-grpc=false", "--allow-metrics=false"],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
        log.close()
        started.append(process)
        url = f"127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                pytest.fail(f"Triton exited with {process.returncode}:\n{_tail(tmp_path)}")
            client = http.InferenceServerClient(url)
            try:
                if client.is_server_ready():
                    return url
            except (InferenceServerException, ConnectionError, OSError):
                pass
            finally:  # an open connection would hold Triton's exit for 30 s
                client.close()
            if time.monotonic() > deadline:
                pytest.fail(f"Triton not ready after 120 s:\n{_tail(tmp_path)}")
            time.sleep(0.5)

    try:
        yield start
    finally:
        for process in started:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)  # Triton unloads its models and exits
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
            left = _still_running(process.pid)
            assert not left, f"processes of the Triton server still running: {left}"
        pth.unlink(missing_ok=True)


def _still_running(sid: int, timeout_s: float = 30) -> list[int]:
    """The processes of session `sid` (the server and its Python-backend stubs) still
    running after up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = []
        for entry in Path("/proc").iterdir():
            try:
                stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split() if stat else []
            if fields and int(fields[3]) == sid and fields[0] != "Z":
                alive.append(int(entry.name))
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def _tail(tmp_path: Path) -> str:
    return (tmp_path / "triton.log").read_text(errors="replace")[-4000:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _infer(url: str, name: str, arrays: dict[str, np.ndarray]) -> dict:
    client = http.InferenceServerClient(url)  # one per thread: clients are not thread-safe
    tensors = []
    for key, array in arrays.items():
        tensor = http.InferInput(key, list(array.shape), {"float32": "FP32", "int32": "INT32"}[
            array.dtype.name])  # fmt: skip
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    try:
        result = client.infer(name, tensors)
    finally:
        client.close()
    return {output["name"]: result.as_numpy(output["name"])
            for output in result.get_response()["outputs"]}  # fmt: skip


@needs_litert
def test_python_backend_serves_litert_and_dict_models_on_real_triton(triton_server, tmp_path, rng):
    x = rng.standard_normal((4, 6)).astype("float32")
    litert = infertune.optimize(dense_model(), x, backends=["litert"], isolation="off",
                                verbose=False)  # fmt: skip
    assert litert.backend == "litert", str(litert.report)
    repository = tmp_path / "repository"
    export = litert.export_triton(repository, "dense", backend="python")
    assert "max_batch_size: 32" in export.config and "dynamic_batching" in export.config
    sample = dict_sample(rng)
    scorer = infertune.optimize(dict_model(), sample, backends=["onnxruntime-cpu"],
                                isolation="off", verbose=False)  # fmt: skip
    scorer.export_triton(repository, "scorer", backend="python")
    url = triton_server(repository)

    # concurrent requests of one row each: Triton's dynamic batcher may hand several at once
    rows = rng.standard_normal((16, 6)).astype("float32")
    answers: dict[int, np.ndarray] = {}

    def send(row: int) -> None:
        answers[row] = _infer(url, "dense", {"x": rows[row : row + 1]})["output"]

    threads = [threading.Thread(target=send, args=(row,)) for row in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    got = np.concatenate([answers[row] for row in range(16)])
    np.testing.assert_allclose(got, dense_model()(rows), rtol=RTOL, atol=ATOL)

    outputs = _infer(url, "scorer", sample)
    expected = dict_model()(sample)
    assert set(outputs) == {"probs", "score"}
    for key in outputs:
        np.testing.assert_allclose(outputs[key], expected[key], rtol=RTOL, atol=ATOL)
    with pytest.raises(InferenceServerException, match="unexpected shape"):
        _infer(url, "dense", {"x": rows[:1, :5]})  # Triton checks shapes against config.pbtxt
    np.testing.assert_allclose(_infer(url, "dense", {"x": rows[:2]})["output"], got[:2],
                               rtol=RTOL, atol=ATOL)  # fmt: skip
