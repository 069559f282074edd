"""A saved result as a Ray Serve application that speaks the Open Inference Protocol v2.

    app = infertune.ray.deployment("tuned/", max_batch_size=32)
    serve.run(app)                      # http://127.0.0.1:8000/v2/models/tuned/infer

One class, in the shape Ray Serve's docs use: the model is loaded once per replica in
`__init__`; `__call__` takes the HTTP request and answers it through `InferenceEndpoints`
(reading, parsing and answering in protocol.py's terms, with no Ray in it, so that tests
call it as it is); `infer_batch`, decorated with `serve.batch`, takes the parsed inputs of up
to `max_batch_size` concurrent requests as a list and returns their outputs as a list,
running them as batches of the model of at most `max_batch_size` samples. A request that
does not fit gets its 4xx with the reason before it reaches the batch, so it never fails the
requests it would have been batched with.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
from ray import serve
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from ..errors import OptionError, one_line
from ..result.saved import read_manifest
from ..system.paths import user_path
from .protocol import (
    BINARY_HEADER,
    InferenceStatistics,
    Limits,
    ProtocolError,
    check_outputs,
    encode_response,
    error_body,
    model_metadata,
    parse_request,
    read_body,
    route,
    server_metadata,
)
from .served import ServedModel, TensorSpec

__all__ = [
    "InferenceEndpoints",
    "OpenInferenceServer",
    "deployment",
    "serve_until_interrupted",
    "served_name",
]

logger = logging.getLogger("ray.serve")

DEFAULT_MAX_BATCH_SIZE = 32
DEFAULT_MAX_BODY_MB = Limits.max_body_mb
DEFAULT_MAX_DECODED_MB = Limits.max_decoded_mb


class InferenceEndpoints:
    """The protocol's endpoints for one loaded model: a Starlette request in, a response out.

    What a replica does with a request, apart from Ray: `run` is the batched call (the
    replica's `serve.batch` method), so a test can call this with a plain coroutine. Every
    request ends in a response: its 4xx where it does not fit (413 past a limit), 500 where
    the model fails on valid inputs; the request is parsed on the replica's event loop, so
    a replica decodes one request at a time (its memory holds one decoded body, not one per
    request in flight).
    """

    def __init__(
        self,
        model: ServedModel,
        name: str,
        limits: Limits,
        run: Callable[[list[np.ndarray]], Awaitable[list[np.ndarray]]],
    ):
        check_outputs(model.outputs)  # numeric outputs only: a string one is refused here, named
        self.model = model
        self.name = name
        self.limits = limits
        self.statistics = InferenceStatistics()
        self._run = run

    async def __call__(self, request: Request) -> Response:
        try:
            endpoint = route(request.method, request.url.path, self.name)
        except ProtocolError as exc:
            return _error(exc.status, str(exc))
        if endpoint == "infer":
            return await self._infer(request)
        if endpoint in ("live", "ready", "model_ready"):
            return Response(status_code=200)
        document = {
            "server": server_metadata,
            "metadata": lambda: model_metadata(self.model, self.name),
            "stats": lambda: self.statistics.to_dict(self.name),
        }[endpoint]()
        return Response(json.dumps(document), status_code=200, media_type="application/json")

    async def _infer(self, request: Request) -> Response:
        start = time.perf_counter_ns()
        headers = request.headers
        try:
            body = await read_body(request.stream(), headers.get("content-length"), self.limits)
            parsed = parse_request(body, self.model, headers.get(BINARY_HEADER),
                                   headers.get("content-encoding"), self.limits)  # fmt: skip
        except ProtocolError as exc:
            return self._failed(start, exc.status, str(exc))
        except ClientDisconnect:
            return self._failed(start, 400, "The client disconnected before the body ended.")
        except Exception as exc:  # a request the parser did not foresee: a bug, logged
            logger.exception("infertune: could not parse a request")
            return self._failed(start, 500, f"infertune could not parse this request (a bug: "
                                f"please report it with the request): {one_line(exc)}")  # fmt: skip
        del body  # a compressed body is not needed past parsing (the arrays hold the decoded)
        try:
            outputs = await self._run(parsed.inputs)
        except Exception as exc:  # the model failed on valid inputs: a server error, logged
            logger.exception("infertune: the model failed on a request")
            return self._failed(start, 500, f"The model failed on this request: {one_line(exc)}")
        content, response_headers = encode_response(self.name, self.model, parsed, outputs)
        self.statistics.record_request(True, time.perf_counter_ns() - start)
        return Response(content, status_code=200, headers=response_headers)

    def _failed(self, start: int, status: int, message: str) -> Response:
        self.statistics.record_request(False, time.perf_counter_ns() - start)
        return _error(status, message)


def _error(status: int, message: str) -> Response:
    return Response(error_body(message), status_code=status, media_type="application/json")


@serve.deployment
class OpenInferenceServer:
    """One replica: the saved result, behind the Open Inference Protocol's HTTP endpoints."""

    def __init__(self, path: str, name: str, max_batch_size: int, batch_wait_timeout_s: float,
                 limits: Limits):  # fmt: skip
        self._model = ServedModel(path)
        self._max_batch_size = max_batch_size
        # As many batches run at once as the result was tuned for callers
        # (optimize(concurrency=N)), each in a worker thread of its own; one more fills
        # meanwhile. The batcher is made here, where N is known, not at class definition.
        self.infer_batch = serve.batch(
            max_batch_size=max_batch_size,
            batch_wait_timeout_s=batch_wait_timeout_s,
            max_concurrent_batches=self._model.concurrency,
        )(self._infer)
        self._endpoints = InferenceEndpoints(self._model, name, limits, self.infer_batch)

    async def __call__(self, request: Request) -> Response:
        return await self._endpoints(request)

    async def _infer(self, requests: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
        """The inputs of concurrent requests; their outputs, in the same order. The model runs
        in a worker thread, so the replica goes on reading requests for the next batch."""
        return await asyncio.to_thread(
            self._model.run_batch,
            requests,
            self._endpoints.statistics.record_execution,
            self._max_batch_size,
        )


def deployment(
    path: str | os.PathLike,
    *,
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    batch_wait_timeout_s: float = 0.005,
    num_replicas: int = 1,
    name: str | None = None,
    max_body_mb: float = DEFAULT_MAX_BODY_MB,
    max_decoded_mb: float = DEFAULT_MAX_DECODED_MB,
) -> serve.Application:
    """A Ray Serve application serving the result saved in `path` over the Open Inference
    Protocol v2 (as Triton does): `serve.run(deployment(path))`.

    Each replica runs as many batches at once as the result was tuned for callers
    (`optimize(..., concurrency=N)`: N batches, each in a thread of its own; 1 by default),
    and takes up to (N + 1) x max_batch_size requests (Ray Serve's `max_ongoing_requests`).

    Args:
        path: a directory written by `Optimized.save()`. Every replica loads it with
            `infertune.load`, so on a cluster it must be readable at this path on every node
            (a shared filesystem).
        max_batch_size: the most samples the model runs at once: concurrent requests are
            batched up to this many, and a request carrying more is refused (400, naming
            it), as Triton refuses one.
        batch_wait_timeout_s: how long a batch waits for more requests once it has one.
        num_replicas: replicas, each a Ray actor with its own copy of the model.
        name: the model's name in the URLs (`/v2/models/NAME/infer`); default: the name of
            the directory `path`.
        max_body_mb: the largest request body, as received (compressed or not), in MiB;
            larger ones get 413. Default 64.
        max_decoded_mb: the largest request body once decompressed, in MiB; decompression
            stops there and the request gets 413. Default 64.
    """
    path = user_path(path).resolve()
    manifest = read_manifest(path)  # a wrong path fails here, not in every replica
    # What every replica would refuse (string outputs), said before Ray runs it.
    check_outputs([TensorSpec.from_dict(spec) for spec in manifest["outputs"].get("specs", [])])
    name = served_name(path, name)
    for option, value in (("max_batch_size", max_batch_size), ("num_replicas", num_replicas)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise OptionError(f"{option} must be an integer >= 1. Received: {option}={value!r}.")
    if not isinstance(batch_wait_timeout_s, int | float) or not batch_wait_timeout_s >= 0:
        raise OptionError(
            f"batch_wait_timeout_s must be a number of seconds >= 0. Received: "
            f"batch_wait_timeout_s={batch_wait_timeout_s!r}."
        )
    for option, value in (("max_body_mb", max_body_mb), ("max_decoded_mb", max_decoded_mb)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise OptionError(
                f"{option} must be a number of MiB > 0 (default 64). Received: {option}={value!r}."
            )
    limits = Limits(float(max_body_mb), float(max_decoded_mb), max_batch_size)
    # The batches the result was tuned to run at once, and one more filling meanwhile: room
    # for that many batches of requests per replica.
    concurrency = manifest["options"].get("concurrency", 1)
    return OpenInferenceServer.options(
        num_replicas=num_replicas, max_ongoing_requests=(concurrency + 1) * max_batch_size
    ).bind(str(path), name, max_batch_size, float(batch_wait_timeout_s), limits)


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
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    num_replicas: int = 1,
    name: str | None = None,
    address: str | None = None,
    max_body_mb: float = DEFAULT_MAX_BODY_MB,
    max_decoded_mb: float = DEFAULT_MAX_DECODED_MB,
) -> None:
    """`infertune serve`: start Ray (or join the cluster at `address`), run the deployment
    with HTTP on host:port, print where, and stop it all on Ctrl-C or SIGTERM (then return,
    for the command to exit 0)."""
    import signal

    import ray

    model_name = served_name(user_path(path).resolve(), name)
    app = deployment(path, max_batch_size=max_batch_size, num_replicas=num_replicas, name=name,
                     max_body_mb=max_body_mb, max_decoded_mb=max_decoded_mb)  # fmt: skip
    stop = _Stop()

    def on_signals() -> None:
        # Set here, not left to Python's default: a process started in the background of a
        # non-interactive shell (`cmd &` in a script, a CI job) inherits SIGINT as ignored,
        # and Python then installs no KeyboardInterrupt handler: Ctrl-C would do nothing.
        # And set again once Ray runs: ray.init installs its own SIGTERM handler, which kills
        # Ray's processes under the driver and exits 1 (systemd, Docker and Kubernetes stop
        # a service with SIGTERM; it must shut down as Ctrl-C does).
        signal.signal(signal.SIGTERM, stop.handle)
        signal.signal(signal.SIGINT, stop.handle)

    on_signals()
    if address is None:  # a Ray of our own, on this machine only when serving on loopback
        loopback = {"_node_ip_address": "127.0.0.1"} if host == "127.0.0.1" else {}
        ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING,
                 **loopback)  # fmt: skip
    else:
        ray.init(address=address, logging_level=logging.WARNING)
    on_signals()
    try:
        if not stop.requested:
            serve.start(http_options={"host": host, "port": port})
            serve.run(app, name=model_name, route_prefix="/")
            print(
                f"infertune: serving '{model_name}' at http://{host}:{port}/v2/models/"
                f"{model_name} (Open Inference Protocol v2; {num_replicas} replica(s), batches "
                f"of up to {max_batch_size}; bodies up to {max_body_mb:g} MiB, "
                f"{max_decoded_mb:g} MiB decoded). Ctrl-C to stop.",
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
