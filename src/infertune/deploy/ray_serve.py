"""A saved result as a Ray Serve application that speaks the Open Inference Protocol v2.

    app = infertune.ray.deployment("tuned/", max_batch_size=32)
    serve.run(app)                      # http://127.0.0.1:8000/v2/models/tuned/infer

One class, in the shape Ray Serve's docs use: the model is loaded once per replica in
`__init__`; `__call__` takes the HTTP request, parses it (protocol.py) and answers it;
`infer_batch`, decorated with `serve.batch`, takes the parsed inputs of up to
`max_batch_size` concurrent requests as a list and returns their outputs as a list, running
them as one batch of the model. A request that does not fit gets 400 with the reason before
it reaches the batch, so it never fails the requests it would have been batched with.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from pathlib import Path

import numpy as np
from ray import serve
from starlette.requests import Request
from starlette.responses import Response

from ..errors import OptionError, one_line
from ..result.saved import read_manifest
from .protocol import (
    BINARY_HEADER,
    InferenceStatistics,
    ProtocolError,
    encode_response,
    error_body,
    model_metadata,
    parse_request,
    route,
    server_metadata,
)
from .served import ServedModel

__all__ = ["OpenInferenceServer", "deployment", "serve_until_interrupted", "served_name"]

logger = logging.getLogger("ray.serve")


@serve.deployment
class OpenInferenceServer:
    """One replica: the saved result, behind the Open Inference Protocol's HTTP endpoints."""

    def __init__(self, path: str, name: str, max_batch_size: int, batch_wait_timeout_s: float):
        self._model = ServedModel(path)
        self._name = name
        self._statistics = InferenceStatistics()
        self.infer_batch.set_max_batch_size(max_batch_size)
        self.infer_batch.set_batch_wait_timeout_s(batch_wait_timeout_s)

    async def __call__(self, request: Request) -> Response:
        try:
            endpoint = route(request.method, request.url.path, self._name)
        except ProtocolError as exc:
            return _error(exc.status, str(exc))
        if endpoint == "infer":
            return await self._infer(request)
        if endpoint in ("live", "ready", "model_ready"):
            return Response(status_code=200)
        document = {
            "server": server_metadata,
            "metadata": lambda: model_metadata(self._model, self._name),
            "stats": lambda: self._statistics.to_dict(self._name),
        }[endpoint]()
        return _json(document)

    async def _infer(self, request: Request) -> Response:
        start = time.perf_counter_ns()
        try:
            parsed = parse_request(
                await request.body(),
                self._model,
                request.headers.get(BINARY_HEADER),
                request.headers.get("content-encoding"),
            )
        except ProtocolError as exc:
            self._statistics.record_request(False, time.perf_counter_ns() - start)
            return _error(exc.status, str(exc))
        try:
            outputs = await self.infer_batch(parsed.inputs)
        except Exception as exc:  # the model failed on valid inputs: a server error, logged
            logger.exception("infertune: the model failed on a request")
            self._statistics.record_request(False, time.perf_counter_ns() - start)
            return _error(500, f"The model failed on this request: {one_line(exc)}")
        content, headers = encode_response(self._name, self._model, parsed, outputs)
        self._statistics.record_request(True, time.perf_counter_ns() - start)
        return Response(content, status_code=200, headers=headers)

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005)
    async def infer_batch(self, requests: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
        """The inputs of concurrent requests; their outputs, in the same order. The model runs
        in a worker thread, so the replica goes on reading requests for the next batch."""
        return await asyncio.to_thread(
            self._model.run_batch, requests, self._statistics.record_execution
        )


def _json(document: dict) -> Response:
    import json

    return Response(json.dumps(document), status_code=200, media_type="application/json")


def _error(status: int, message: str) -> Response:
    return Response(error_body(message), status_code=status, media_type="application/json")


def deployment(
    path: str | os.PathLike,
    *,
    max_batch_size: int = 32,
    batch_wait_timeout_s: float = 0.005,
    num_replicas: int = 1,
    name: str | None = None,
) -> serve.Application:
    """A Ray Serve application serving the result saved in `path` over the Open Inference
    Protocol v2 (as Triton does): `serve.run(deployment(path))`.

    Args:
        path: a directory written by `Optimized.save()`. Every replica loads it with
            `infertune.load`, so on a cluster it must be readable at this path on every node
            (a shared filesystem).
        max_batch_size: the most concurrent requests run as one batch of the model.
        batch_wait_timeout_s: how long a batch waits for more requests once it has one.
        num_replicas: replicas, each a Ray actor with its own copy of the model.
        name: the model's name in the URLs (`/v2/models/NAME/infer`); default: the name of
            the directory `path`.
    """
    path = Path(path).resolve()
    read_manifest(path)  # a wrong path fails here, not in every replica
    name = served_name(path, name)
    for option, value in (("max_batch_size", max_batch_size), ("num_replicas", num_replicas)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise OptionError(f"{option} must be an integer >= 1. Received: {option}={value!r}.")
    if not isinstance(batch_wait_timeout_s, int | float) or not batch_wait_timeout_s >= 0:
        raise OptionError(
            f"batch_wait_timeout_s must be a number of seconds >= 0. Received: "
            f"batch_wait_timeout_s={batch_wait_timeout_s!r}."
        )
    # One batch runs while the next one fills: room for two batches of requests per replica.
    return OpenInferenceServer.options(
        num_replicas=num_replicas, max_ongoing_requests=2 * max_batch_size
    ).bind(str(path), name, max_batch_size, float(batch_wait_timeout_s))


def served_name(path: Path, name: str | None) -> str:
    """The model's name in the URLs: `name`, or the saved directory's name; checked."""
    name = path.name if name is None else name
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise OptionError(
            f"The model name must be letters, digits, '_', '-' or '.' (it is part of the "
            f"URLs). Received: name={name!r}; pass name=... ."
        )
    return name


def serve_until_interrupted(
    path: str | os.PathLike,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_batch_size: int = 32,
    num_replicas: int = 1,
    name: str | None = None,
    address: str | None = None,
) -> None:
    """`infertune serve`: start Ray (or join the cluster at `address`), run the deployment
    with HTTP on host:port, print where, and stop it all on Ctrl-C (or SIGTERM)."""
    import signal

    import ray

    model_name = served_name(Path(path).resolve(), name)
    app = deployment(path, max_batch_size=max_batch_size, num_replicas=num_replicas, name=name)
    stop = _Stop()
    # Both set here, not left to Python's default: a process started in the background of a
    # non-interactive shell (`cmd &` in a script, a CI job) inherits SIGINT as ignored, and
    # Python then installs no KeyboardInterrupt handler: Ctrl-C would do nothing.
    signal.signal(signal.SIGTERM, stop.handle)
    signal.signal(signal.SIGINT, stop.handle)
    if address is None:  # a Ray of our own, on this machine only when serving on loopback
        loopback = {"_node_ip_address": "127.0.0.1"} if host == "127.0.0.1" else {}
        ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING,
                 **loopback)  # fmt: skip
    else:
        ray.init(address=address, logging_level=logging.WARNING)
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(app, name=model_name, route_prefix="/")
        print(
            f"infertune: serving '{model_name}' at http://{host}:{port}/v2/models/{model_name} "
            f"(Open Inference Protocol v2; {num_replicas} replica(s), batches of up to "
            f"{max_batch_size}). Ctrl-C to stop.",
            flush=True,
        )
        while not stop.requested:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        print("infertune: stopping", flush=True)
        if address is None:
            serve.shutdown()
        else:  # a cluster others use: remove this application only
            serve.delete(model_name)
        ray.shutdown()


class _Stop:
    """SIGINT (Ctrl-C) or SIGTERM ends the serving loop."""

    requested = False

    def handle(self, signum, frame) -> None:
        self.requested = True
