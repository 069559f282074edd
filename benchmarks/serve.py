"""Scaling out: infertune's result on Ray Serve and Ray Data against the same code written by
hand around the Keras model.

    python benchmarks/serve.py [--models small-cnn,mobilenet-v2] [--concurrency 16]
                               [--seconds 20] [--json FILE]

One local Ray (`ray.init(num_cpus=2)`, bound to 127.0.0.1), one replica per deployment, the
same client for both:

- Ray Serve: `infertune.ray.deployment(saved)` (Open Inference Protocol, binary tensors,
  `serve.batch` up to 32 requests) against `KerasByHand` below: the model loaded with
  `keras.saving.load_model`, a `serve.batch` method that concatenates the requests and calls
  `model(x)`, raw float32 bytes in and out (less HTTP work than the protocol). A fixed number
  of client threads (`--concurrency`), each with its own keep-alive HTTP connection, send
  one-sample requests for `--seconds` after a warm-up; requests/s, p50 and p99 latency.
- Ray Data: `map_batches(infertune.ray.Predictor, compute=ActorPoolStrategy(size=2))` over
  the same array as `model.predict(x)` in this process (and infertune's callable in this
  process, batch by batch); samples/s, wall time from the call to the last batch (the
  actors' start and model loading included, as a user waits for it).

Both deployments' first answers are checked against the Keras model before timing.
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Ray reads its authentication settings when imported: a token in the environment, so that
# this run writes nothing to ~/.ray.
os.environ.setdefault("RAY_AUTH_MODE", "token")
os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(16))

import numpy as np  # noqa: E402
import ray  # noqa: E402
from ray import serve  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import Response  # noqa: E402

import infertune  # noqa: E402
import infertune.ray  # noqa: E402
from infertune.demo import demo_model  # noqa: E402

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
    ]  # fmt: skip
    for label, app, path, body, headers in deployments:
        serve.run(app, name="bench", route_prefix="/")
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        got = _decode(*_post(connection, path, body, headers)).reshape(expected.shape)
        connection.close()
        # Same model, same input: Keras' float32 round-off against the tuned runtime's.
        scale = float(np.abs(expected).max())
        if not np.allclose(got, expected, rtol=1e-3, atol=1e-3 * scale):
            raise RuntimeError(f"{label} on {name}: the answer differs from model(x)")
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="small-cnn,mobilenet-v2")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="infertune-serve-bench-"))
    ray_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths
    serve_rows, data_rows, tuned = [], [], {}
    try:
        prepared = []
        for name in args.models.split(","):
            model, sample = demo_model(name)
            print(f"{name}: tuning", file=sys.stderr, flush=True)
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
            print(f"{name}: serving ({tuned[name]})", file=sys.stderr, flush=True)
            serve_rows += bench_serve(name, model, saved, keras_path, sample, args)
            data_rows += bench_data(name, model, saved, args)
    finally:
        if ray.is_initialized():
            serve.shutdown()
            ray.shutdown()
        shutil.rmtree(ray_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    print_tables(serve_rows, data_rows, tuned, args)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"serve": serve_rows, "data": data_rows, "tuned": tuned,
             "concurrency": args.concurrency, "seconds": args.seconds}, indent=2))  # fmt: skip


def print_tables(serve_rows: list[dict], data_rows: list[dict], tuned: dict, args) -> None:
    print(f"\nRay Serve, 1 replica, {args.concurrency} concurrent clients, one-sample requests, "
          f"{args.seconds:.0f} s each, batches of up to {MAX_BATCH_SIZE}:\n")  # fmt: skip
    print("| model | deployment | requests/s | p50 ms | p99 ms | vs by hand |")
    print("|---|---|---|---|---|---|")
    by_hand = {
        r["model"]: r["requests_per_s"] for r in serve_rows if r["deployment"] != "infertune"
    }
    for row in serve_rows:
        label = row["deployment"]
        if label == "infertune":
            label = f"infertune ({tuned[row['model']]}, mean batch {row['mean_batch']:.1f})"
        ratio = row["requests_per_s"] / by_hand[row["model"]]
        print(f"| {row['model']} | {label} | {row['requests_per_s']:.0f} | {row['p50_ms']:.1f} "
              f"| {row['p99_ms']:.1f} | {ratio:.1f}x |")  # fmt: skip
    print("\nRay Data over one array (wall time from the call to the last batch):\n")
    print("| model | way | samples | seconds | samples/s | vs model.predict |")
    print("|---|---|---|---|---|---|")
    predict = {r["model"]: r["samples_per_s"] for r in data_rows if "predict" in r["way"]}
    for row in data_rows:
        ratio = row["samples_per_s"] / predict[row["model"]]
        print(f"| {row['model']} | {row['way']} | {row['samples']} | {row['seconds']:.1f} | "
              f"{row['samples_per_s']:.0f} | {ratio:.1f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
