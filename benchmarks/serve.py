"""Scaling out: infertune's result on Ray Serve and Ray Data against the same code written by
hand around the Keras model; and infertune's deployment under hostile input and a fault.

    python benchmarks/serve.py [--models small-cnn,mobilenet-v2] [--concurrency 16]
                               [--seconds 20] [--runs serve,data,fault] [--out DIR] [--json FILE]

One local Ray (`ray.init(num_cpus=2)`, bound to 127.0.0.1), one replica per deployment, the
same client for both:

- Ray Serve: `infertune.ray.deployment(saved)` (Open Inference Protocol, binary tensors,
  `serve.batch` up to 32 requests) against `KerasByHand` below: the model loaded with
  `keras.saving.load_model`, a `serve.batch` method that concatenates the requests and calls
  `model(x)`, raw float32 bytes in and out (less HTTP work than the protocol). A fixed number
  of client threads (`--concurrency`), each with its own keep-alive HTTP connection, send
  one-sample requests for `--seconds` after a warm-up; requests/s, p50 and p99 latency.
  A third deployment, `NoModel`, answers each request with its own bytes through the same
  `serve.batch` path: the most requests/s this Ray, this client and this machine allow.
- Ray Data: `map_batches(infertune.ray.Predictor, compute=ActorPoolStrategy(size=2))` over
  the same array as `model.predict(x)` in this process (and infertune's callable in this
  process, batch by batch); samples/s, wall time from the call to the last batch (the
  actors' start and model loading included, as a user waits for it).

- The fault run (`--runs fault`, on the first model): infertune's deployment with its
  default limits (64 MiB body, 64 MiB decoded), one replica. `--fault-clients` threads send
  well-formed requests at a steady rate (one each per 50 ms) and check every answer
  against the Keras model. After a quiet spell, a burst of bad requests is sent at once:
  decompression bombs (1 GiB of zeros gzipped to 1 MB), bodies past 64 MiB, batches past
  `max_batch_size`, malformed JSON, shapes, datatypes and binary sizes; each must get its
  4xx/413, while the replica's resident memory is sampled every 10 ms. Then the replica's
  worker process is killed (SIGKILL), 5 ms after 8 more requests were sent (so that some
  are in flight), and the clients go on until Ray has replaced it.
  Reported: requests sent, answered right, answered with an error (by status), answered
  wrong and lost (no answer at all; both must be 0), the time from the kill to the first
  right answer, and the replica's memory before and at its peak during the burst.

Both deployments' first answers are checked against the Keras model before timing.
Targets (exit code 1 if one fails): in the fault run, no request lost or answered wrongly,
and every bad request answered with its 4xx/413.

Results: docs/benchmarks/serve/<date>/ (--out).
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Ray reads its authentication settings when imported: a token in the environment, so that
# this run writes nothing to ~/.ray.
os.environ.setdefault("RAY_AUTH_MODE", "token")
os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(16))

import harness  # noqa: E402
import numpy as np  # noqa: E402
import ray  # noqa: E402
from ray import serve  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import Response  # noqa: E402

import infertune  # noqa: E402
import infertune.ray  # noqa: E402
from infertune.demo import demo_model  # noqa: E402

BENCHMARK = "serve"

MAX_BATCH_SIZE = 32
BATCH_WAIT_S = 0.005
DATA = {"small-cnn": (20000, 256), "mobilenet-v2": (512, 32)}  # rows, batch size


@serve.deployment(max_ongoing_requests=2 * MAX_BATCH_SIZE)
class KerasByHand:
    """What one writes by hand: load the Keras model, batch with serve.batch, call model(x)."""

    def __init__(self, path: str, feature_shape: tuple[int, ...]):
        import keras

        self.model = keras.saving.load_model(path)
        self.feature_shape = feature_shape

    async def __call__(self, request: Request) -> Response:
        x = np.frombuffer(await request.body(), dtype=np.float32).reshape(-1, *self.feature_shape)
        y = await self.predict(x)
        return Response(y.tobytes(), media_type="application/octet-stream")

    @serve.batch(max_batch_size=MAX_BATCH_SIZE, batch_wait_timeout_s=BATCH_WAIT_S)
    async def predict(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        outputs = np.asarray(self.model(np.concatenate(inputs)))
        return np.split(outputs, np.cumsum([len(x) for x in inputs])[:-1])


@serve.deployment(max_ongoing_requests=2 * MAX_BATCH_SIZE)
class NoModel:
    """The ceiling: KerasByHand's request path (body, serve.batch, response) with no model,
    answering each request with its own bytes. No deployment on this Ray and this client
    can answer more requests/s than this."""

    async def __call__(self, request: Request) -> Response:
        return Response(await self.echo(await request.body()))

    @serve.batch(max_batch_size=MAX_BATCH_SIZE, batch_wait_timeout_s=BATCH_WAIT_S)
    async def echo(self, bodies: list[bytes]) -> list[bytes]:
        return bodies


# -- the client ---------------------------------------------------------------------------------
def _protocol_body(x: np.ndarray) -> tuple[bytes, dict[str, str]]:
    header = json.dumps({
        "inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes}}],
        "parameters": {"binary_data_output": True},
    }).encode()  # fmt: skip
    return header + x.tobytes(), {"Inference-Header-Content-Length": str(len(header))}


def _decode(body: bytes, headers: http.client.HTTPMessage) -> np.ndarray:
    length = headers.get("Inference-Header-Content-Length")
    if length is None:  # the by-hand deployment: raw float32
        return np.frombuffer(body, dtype=np.float32)
    output = json.loads(body[: int(length)])["outputs"][0]
    return np.frombuffer(body[int(length) :], dtype=np.float32).reshape(output["shape"])


def _post(connection, path: str, body: bytes, headers: dict) -> tuple[bytes, object]:
    connection.request("POST", path, body=body, headers=headers)
    response = connection.getresponse()
    data = response.read()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {data[:300]!r}")
    return data, response.headers


def load_test(port: int, path: str, body: bytes, headers: dict, concurrency: int,
              seconds: float, warmup_s: float = 3.0) -> dict:  # fmt: skip
    """Requests/s and latency percentiles of `concurrency` threads sending `body` for
    `seconds` after `warmup_s`."""
    start_at = time.perf_counter() + warmup_s
    stop_at = start_at + seconds
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    errors: list[str] = []

    def client(index: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        try:
            while (now := time.perf_counter()) < stop_at:
                _post(connection, path, body, headers)
                if now >= start_at:
                    latencies[index].append(time.perf_counter() - now)
        except Exception as exc:  # reported with the results, never silently dropped
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            connection.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(f"{len(errors)} client(s) failed, first: {errors[0]}")
    all_ms = np.array([t for per in latencies for t in per]) * 1e3
    return {
        "requests": int(all_ms.size),
        "requests_per_s": all_ms.size / seconds,
        "p50_ms": float(np.percentile(all_ms, 50)),
        "p99_ms": float(np.percentile(all_ms, 99)),
    }


# -- one model ----------------------------------------------------------------------------------
def bench_serve(name: str, model, saved: Path, keras_path: Path, sample: np.ndarray,
                args) -> list[dict]:  # fmt: skip
    port = args.port
    x = sample[:1]
    expected = np.asarray(model(x))
    rows = []
    deployments = [
        ("infertune", infertune.ray.deployment(saved, max_batch_size=MAX_BATCH_SIZE,
                                               batch_wait_timeout_s=BATCH_WAIT_S, name="m"),
         "/v2/models/m/infer", *_protocol_body(x)),
        ("Keras by hand", KerasByHand.bind(str(keras_path), tuple(x.shape[1:])), "/",
         x.tobytes(), {}),
        ("no model (ceiling)", NoModel.bind(), "/", x.tobytes(), {}),
    ]  # fmt: skip
    for label, app, path, body, headers in deployments:
        serve.run(app, name="bench", route_prefix="/")
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        got = _decode(*_post(connection, path, body, headers))
        connection.close()
        if label.startswith("no model"):
            expected_bytes = x.tobytes()
            if got.tobytes() != expected_bytes:
                raise RuntimeError(f"{label}: the echo differs from the request")
        else:
            _check_answer(label, name, got.reshape(expected.shape), expected)
        result = load_test(port, path, body, headers, args.concurrency, args.seconds)
        if label == "infertune":
            connection = http.client.HTTPConnection("127.0.0.1", port)
            connection.request("GET", "/v2/models/m/stats")
            stats = json.loads(connection.getresponse().read())["model_stats"][0]
            connection.close()
            result["mean_batch"] = stats["inference_count"] / stats["execution_count"]
        rows.append({"model": name, "deployment": label, **result})
        print(f"  serve {label}: {result}", file=sys.stderr, flush=True)
        serve.delete("bench")
    return rows


def _check_answer(label: str, name: str, got: np.ndarray, expected: np.ndarray) -> None:
    # Same model, same input: Keras' float32 round-off against the tuned runtime's.
    scale = float(np.abs(expected).max())
    if not np.allclose(got, expected, rtol=1e-3, atol=1e-3 * scale):
        raise RuntimeError(f"{label} on {name}: the answer differs from model(x)")


# -- the fault run ------------------------------------------------------------------------------
def _replica_pids() -> list[int]:
    """Pids of the OpenInferenceServer replicas of this process's Ray (not of another Ray on
    the machine): Ray titles a replica's worker process
    `ray::ServeReplica:APP:OpenInferenceServer`."""
    parents: dict[int, int] = {}
    commands: dict[int, bytes] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            commands[int(entry.name)] = (entry / "cmdline").read_bytes()
        except OSError:  # it ended while we looked
            continue
        parents[int(entry.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])

    def ours(pid: int) -> bool:
        for _ in range(64):  # a bounded walk up the tree
            pid = parents.get(pid, 0)
            if pid == os.getpid():
                return True
            if pid <= 1:
                return False
        return False

    return [pid for pid, command in commands.items()
            if command.startswith(b"ray::ServeReplica:") and b"OpenInferenceServer" in command
            and ours(pid)]  # fmt: skip


def _resident_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def _send(port: int, path: str, body: bytes, headers: dict, timeout_s: float = 120):
    """One request on its own connection: (status, body, headers); raises where no answer."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.read(), response.headers
    finally:
        connection.close()


def _bad_requests(x: np.ndarray) -> list[tuple[str, bytes, dict, int]]:
    """(what, body, headers, the status it must get): the burst."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(2**20)
    bomb = b"".join([*(compressor.compress(zeros) for _ in range(1024)), compressor.flush()])
    big = np.zeros((MAX_BATCH_SIZE + 1, *x.shape[1:]), "float32")

    def request(shape: list[int], kind: str, **tensor) -> bytes:
        return json.dumps({"inputs": [{"name": "x", "shape": shape, "datatype": kind,
                                       **tensor}]}).encode()  # fmt: skip

    wrong_shape = request([1, 3], "FP32", data=[0, 0, 0])
    wrong_type = request(list(x.shape), "FP64", data=[0] * x.size)
    huge = request([2**62, *x.shape[1:]], "FP32", parameters={"binary_data_size": 4})
    body, headers = _protocol_body(x)
    return [
        *[("decompression bomb (1 GiB of zeros)", bomb, {"Content-Encoding": "gzip"}, 413)] * 8,
        *[("body past 64 MiB", bytes(65 * 2**20), {}, 413)] * 2,
        *[("batch past max_batch_size", *_protocol_body(big), 400)] * 4,
        *[("not JSON", b"{not json", {}, 400)] * 4,
        *[("JSON nested 100000 deep", b"[" * 100_000, {}, 400)] * 2,
        *[("wrong shape", wrong_shape, {}, 400)] * 4,
        *[("wrong datatype", wrong_type, {}, 400)] * 4,
        *[("2**62 samples declared", huge, {}, 400)] * 2,
        *[("binary data cut short", body[:-4], headers, 400)] * 4,
        *[("gzip that is not", b"\x1f\x8b" + bytes(100), {"Content-Encoding": "gzip"}, 400)] * 2,
    ]


def bench_faults(name: str, model, saved: Path, sample: np.ndarray, args) -> dict:
    """The deployment with its default limits under a burst of bad requests and a replica
    killed mid-load: see the module's docstring."""
    path = "/v2/models/m/infer"
    serve.run(infertune.ray.deployment(saved, max_batch_size=MAX_BATCH_SIZE,
                                       batch_wait_timeout_s=BATCH_WAIT_S, name="m"),
              name="bench", route_prefix="/")  # fmt: skip
    (replica,) = _replica_pids()
    extra: list[threading.Thread] = []
    rng = np.random.default_rng(3)
    inputs = [rng.random((1, *sample.shape[1:]), dtype=np.float32) for _ in range(16)]
    expected = [np.asarray(model(x)) for x in inputs]
    outcomes: list[tuple[float, float, str]] = []  # (sent, answered, outcome)
    stop = threading.Event()

    def one(index: int) -> None:
        """One well-formed request; its (sent, answered, outcome) into `outcomes`."""
        x, want = inputs[index % len(inputs)], expected[index % len(inputs)]
        sent = time.monotonic()
        try:
            status, data, headers = _send(args.port, path, *_protocol_body(x))
        except (OSError, http.client.HTTPException):  # no answer at all
            outcome = "lost"
        else:
            if status == 200:
                got = _decode(data, headers)
                scale = float(np.abs(want).max())
                # Keras' float32 round-off against the tuned runtime's, as _check_answer.
                right = got.shape == want.shape and np.allclose(
                    got, want, rtol=1e-3, atol=1e-3 * scale
                )
                outcome = "right" if right else "wrong"
            else:
                outcome = str(status)
        outcomes.append((sent, time.monotonic(), outcome))

    def client(first: int) -> None:
        index = first
        while not stop.is_set():
            one(index)
            index += 1
            stop.wait(0.05)

    bad = _bad_requests(inputs[0])
    answers: list[tuple[int, int, bytes]] = []

    def send_bad(index: int) -> None:
        what, body, headers, _ = bad[index]
        try:
            answers.append((index, *_send(args.port, path, body, headers)[:2]))
        except (OSError, http.client.HTTPException) as exc:
            answers.append((index, 0, f"{type(exc).__name__}: {exc}".encode()))

    clients = [threading.Thread(target=client, args=(i,)) for i in range(args.fault_clients)]
    for thread in clients:
        thread.start()
    try:
        time.sleep(args.seconds / 2)
        baseline = peak = _resident_mib(replica)
        burst_at = time.monotonic()
        senders = [threading.Thread(target=send_bad, args=(i,)) for i in range(len(bad))]
        for thread in senders:
            thread.start()
        while any(thread.is_alive() for thread in senders):
            peak = max(peak, _resident_mib(replica))
            time.sleep(0.01)
        burst_s = time.monotonic() - burst_at
        time.sleep(args.seconds / 2)
        # Requests in flight at the kill, whatever the clients' timing: 8 more sent just before.
        extra = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        for thread in extra:
            thread.start()
        time.sleep(0.005)
        kill_at = time.monotonic()
        os.kill(replica, signal.SIGKILL)
        recovered_at = None
        while recovered_at is None and time.monotonic() < kill_at + 300:
            time.sleep(0.1)
            # The first right answer to a request sent after the kill: the new replica's.
            right = [done for sent, done, outcome in list(outcomes)
                     if sent > kill_at and outcome == "right"]  # fmt: skip
            recovered_at = min(right) if right else None
        time.sleep(args.seconds / 2)
    finally:
        stop.set()
        for thread in clients + extra:
            thread.join()
        serve.delete("bench")
    wrong_status = [(bad[i][0], status, body[:200].decode(errors="replace"))
                    for i, status, body in answers if status != bad[i][3]]  # fmt: skip
    counts: dict[str, int] = {}
    for _, _, outcome in outcomes:
        counts[outcome] = counts.get(outcome, 0) + 1
    after_kill = [outcome for _, done, outcome in outcomes if done >= kill_at]
    result = {
        "model": name,
        "clients": args.fault_clients,
        "sent": len(outcomes),
        "right": counts.get("right", 0),
        "error": {k: v for k, v in counts.items() if k not in ("right", "wrong", "lost")},
        "wrong": counts.get("wrong", 0),
        "lost": counts.get("lost", 0),
        "errors_before_kill": sum(o != "right" for _, done, o in outcomes if done < kill_at),
        "errors_after_kill": sum(o != "right" for o in after_kill),
        "in_flight_at_kill": sum(sent < kill_at <= done for sent, done, _ in outcomes),
        "recover_s": None if recovered_at is None else recovered_at - kill_at,
        "bad_requests": len(bad),
        "bad_answered_as_expected": len(bad) - len(wrong_status),
        "bad_unexpected": wrong_status,
        "burst_s": burst_s,
        "replica_rss_before_mib": baseline,
        "replica_rss_peak_mib": peak,
    }
    print(f"  faults: {result}", file=sys.stderr, flush=True)
    return result


def bench_data(name: str, model, saved: Path, args) -> list[dict]:
    count, batch = DATA[name]
    x = np.random.default_rng(1).random((count, *model.input_shape[1:]), dtype=np.float32)
    rows = []
    start = time.perf_counter()
    dataset = ray.data.from_numpy(np.array_split(x, 8))  # one array would be one block
    done = 0
    for out in dataset.map_batches(
        infertune.ray.Predictor,
        fn_constructor_kwargs={"path": str(saved)},
        batch_size=batch,
        compute=ray.data.ActorPoolStrategy(size=2),
    ).iter_batches(batch_size=None):
        done += len(out["output"])
    elapsed = time.perf_counter() - start
    assert done == count, (done, count)
    way = "Ray Data map_batches + infertune.ray.Predictor (2 actors)"
    rows.append({"model": name, "way": way, "samples": count, "seconds": elapsed,
                 "samples_per_s": count / elapsed})  # fmt: skip
    start = time.perf_counter()
    model.predict(x, batch_size=batch, verbose=0)
    elapsed = time.perf_counter() - start
    rows.append({"model": name, "way": "model.predict (this process)", "samples": count,
                 "seconds": elapsed, "samples_per_s": count / elapsed})  # fmt: skip
    tuned = infertune.load(saved, verbose=False)
    start = time.perf_counter()
    for first in range(0, count, batch):
        tuned(x[first : first + batch])
    elapsed = time.perf_counter() - start
    way = f"infertune's callable (this process, {tuned.backend})"
    rows.append({"model": name, "way": way, "samples": count, "seconds": elapsed,
                 "samples_per_s": count / elapsed})  # fmt: skip
    for row in rows:
        print(f"  data {row['way']}: {row['samples_per_s']:.0f} samples/s", file=sys.stderr)
    return rows


def main() -> int:
    parser = harness.parser(__doc__, "--out", "--json")
    parser.add_argument("--models", default="small-cnn,mobilenet-v2")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--runs", default="serve,data,fault",
                        help="which runs: serve (requests/s), data (Ray Data), fault "
                        "(hostile input and a killed replica, on the first model)")  # fmt: skip
    parser.add_argument("--fault-clients", type=int, default=4)
    args = parser.parse_args()
    runs = set(args.runs.split(","))

    work = Path(tempfile.mkdtemp(prefix="infertune-serve-bench-"))
    ray_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths
    serve_rows, data_rows, tuned, faults = [], [], {}, None
    try:
        prepared = []
        for name in args.models.split(","):
            model, sample = demo_model(name)
            harness.log("serve", f"{name}: tuning")
            opt = infertune.optimize(model, sample, verbose=False)
            tuned[name] = opt.backend
            saved = opt.save(work / name / "tuned")
            keras_path = work / name / "model.keras"
            model.save(keras_path)
            prepared.append((name, model, saved, keras_path, sample))
        ray.init(num_cpus=2, _temp_dir=ray_dir, include_dashboard=False,
                 _node_ip_address="127.0.0.1", logging_level=logging.WARNING)  # fmt: skip
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        for name, model, saved, keras_path, sample in prepared:
            harness.log("serve", f"{name}: serving ({tuned[name]})")
            if "serve" in runs:
                serve_rows += bench_serve(name, model, saved, keras_path, sample, args)
            if "data" in runs:
                data_rows += bench_data(name, model, saved, args)
        if "fault" in runs:
            name, model, saved, _, sample = prepared[0]
            harness.log("serve", f"{name}: faults ({tuned[name]})")
            faults = bench_faults(name, model, saved, sample, args)
    finally:
        if ray.is_initialized():
            serve.shutdown()
            ray.shutdown()
        shutil.rmtree(ray_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    tables = []
    if serve_rows:
        tables.append(serve_table(serve_rows, tuned, args))
    if data_rows:
        tables.append(data_table(data_rows))
    targets = []
    if faults is not None:
        tables += fault_tables(faults, tuned)
        targets = fault_targets(faults)
    data = harness.results(
        BENCHMARK,
        about=harness.about(__doc__),
        rows=[*serve_rows, *data_rows],
        tables=tables,
        targets=targets,
        headline={
            f"{r['model']}: {r['deployment']} requests/s": r["requests_per_s"] for r in serve_rows
        },
        serve=serve_rows,
        data=data_rows,
        faults=faults,
        tuned=tuned,
        concurrency=args.concurrency,
        seconds=args.seconds,
    )
    harness.publish(data, args.out, args.json)
    return harness.exit_code(targets)


def fault_targets(faults: dict) -> list[dict]:
    bad = faults["bad_unexpected"]
    return [
        harness.target("fault run: requests lost", "= 0", faults["lost"], faults["lost"] == 0),
        harness.target(
            "fault run: requests answered wrongly", "= 0", faults["wrong"], faults["wrong"] == 0
        ),
        harness.target(
            "fault run: bad requests answered with an unexpected status", "= 0", len(bad), not bad,
            f"fault run: bad requests answered with an unexpected status: {bad or 'none'}",
        ),
    ]  # fmt: skip


def fault_tables(faults: dict, tuned: dict) -> list[dict]:
    errors = ", ".join(f"{count} x {status}" for status, count in sorted(faults["error"].items()))
    recover = "never" if faults["recover_s"] is None else f"{faults['recover_s']:.1f} s"
    head = [
        "sent", "answered right", "answered with an error", "answered wrong", "lost",
        "recovered after the kill", "replica memory: before the burst, peak",
    ]  # fmt: skip
    row = [
        faults["sent"],
        faults["right"],
        f"{faults['errors_after_kill']} answered after the kill ({errors or 'none'}; "
        f"{faults['in_flight_at_kill']} requests in flight at the kill), "
        f"{faults['errors_before_kill']} before",
        faults["wrong"],
        faults["lost"],
        recover,
        f"{faults['replica_rss_before_mib']:.0f} MiB, {faults['replica_rss_peak_mib']:.0f} MiB",
    ]
    title = (
        f"Faults, {faults['model']} ({tuned[faults['model']]}), {faults['clients']} clients "
        "at one request per 50 ms each:"
    )
    bad = harness.table(
        ["bad requests", "got their 4xx/413", "burst s", "unexpected"],
        [[
            faults["bad_requests"], faults["bad_answered_as_expected"],
            f"{faults['burst_s']:.1f}", faults["bad_unexpected"] or "none",
        ]],
        "Bad requests:",
    )  # fmt: skip
    return [harness.table(head, [row], title), bad]


def serve_table(serve_rows: list[dict], tuned: dict, args) -> dict:
    title = (
        f"Ray Serve, 1 replica, {args.concurrency} concurrent clients, one-sample requests, "
        f"{args.seconds:.0f} s each, batches of up to {MAX_BATCH_SIZE}:"
    )
    by_hand = {
        r["model"]: r["requests_per_s"] for r in serve_rows if r["deployment"] == "Keras by hand"
    }
    rows = []
    for row in serve_rows:
        label = row["deployment"]
        if label == "infertune":
            label = f"infertune ({tuned[row['model']]}, mean batch {row['mean_batch']:.1f})"
        ratio = row["requests_per_s"] / by_hand[row["model"]]
        rows.append([row["model"], label, f"{row['requests_per_s']:.0f}",
                     f"{row['p50_ms']:.1f}", f"{row['p99_ms']:.1f}", f"{ratio:.1f}x"])  # fmt: skip
    head = ["model", "deployment", "requests/s", "p50 ms", "p99 ms", "vs by hand"]
    return harness.table(head, rows, title)


def data_table(data_rows: list[dict]) -> dict:
    predict = {r["model"]: r["samples_per_s"] for r in data_rows if "predict" in r["way"]}
    rows = []
    for row in data_rows:
        ratio = row["samples_per_s"] / predict[row["model"]]
        rows.append([row["model"], row["way"], row["samples"], f"{row['seconds']:.1f}",
                     f"{row['samples_per_s']:.0f}", f"{ratio:.1f}x"])  # fmt: skip
    return harness.table(
        ["model", "way", "samples", "seconds", "samples/s", "vs model.predict"],
        rows,
        "Ray Data over one array (wall time from the call to the last batch):",
    )


if __name__ == "__main__":
    sys.exit(main())
