"""The Open Inference Protocol v2 over HTTP (KServe v2; Triton's HTTP API), as functions of bytes.

Endpoints (NAME is the served model's name, version "1" the only one):

    GET  /v2/health/live, /v2/health/ready        200 while the server runs
    GET  /v2                                      server metadata
    GET  /v2/models/NAME[/versions/1]             inputs/outputs: names, datatypes, shapes
    GET  /v2/models/NAME[/versions/1]/ready       200 once the model is loaded
    POST /v2/models/NAME[/versions/1]/infer       tensors in, tensors out
    GET  /v2/models/NAME[/versions/1]/stats       Triton's statistics extension (a subset)

Tensors travel as JSON (`"data"`: the values, flat or nested, row-major) or with Triton's
binary tensor data extension: the JSON header is followed by the raw little-endian bytes of
each input whose `parameters` has `binary_data_size`, and the request's
`Inference-Header-Content-Length` header says where the JSON ends. A string input (a model's
`tf.string` input, dtype object here) is a BYTES tensor: as JSON, its strings; as binary
data, each element's length (4 bytes, little-endian) followed by its bytes, as tritonclient
writes them. Its strings reach the model as bytes (JSON strings encoded as UTF-8; binary
ones as sent, UTF-8 or not). Outputs are numbers: a model with string outputs is refused
(`check_outputs`). Outputs come back binary
where the request asks for it (`parameters.binary_data` on an output, or
`binary_data_output` on the request, as tritonclient sends by default). A request compressed
with `Content-Encoding: gzip` or `deflate` is decompressed.

A request is read as an attacker may write it: `Limits` (limits.py) says what one request may
cost, and every size it declares is checked against them before anything is built from it.

Nothing here knows Ray: the Serve deployment passes the bytes in and sends back what comes
out. A request that does not fit raises `ProtocolError` with the HTTP status (400, 413 past a
limit, 415 for an unknown encoding) and the reason; the error body is `{"error": "..."}`, as
Triton's.

This module routes requests and describes the model; the rest, re-exported here:

    wire.py        ProtocolError, the datatype names, the binary-data header, the version
    limits.py      Limits, and reading the body within them
    decoding.py    parse_request: a request's bytes as the model's inputs
    encoding.py    encode_response: the outputs as a response; check_outputs
    statistics.py  InferenceStatistics, for the statistics extension
"""

from __future__ import annotations

import re

from .decoding import InferRequest, parse_request
from .encoding import check_outputs, encode_response
from .limits import Limits, read_body
from .served import ServedModel, TensorSpec
from .statistics import InferenceStatistics
from .wire import BINARY_HEADER, VERSION, ProtocolError, datatype, error_body

__all__ = [
    "BINARY_HEADER",
    "InferRequest",
    "InferenceStatistics",
    "Limits",
    "ProtocolError",
    "check_outputs",
    "datatype",
    "encode_response",
    "error_body",
    "model_metadata",
    "parse_request",
    "read_body",
    "route",
    "server_metadata",
]

# -- routes ------------------------------------------------------------------------------------
_MODEL_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?(?:/(ready|infer|stats))?/?")


def route(method: str, path: str, name: str) -> str:
    """Which endpoint `method path` is: "live", "ready", "server", "metadata", "model_ready",
    "infer" or "stats". Raises ProtocolError 404 for an unknown path, model or version, 405
    for the wrong method."""
    path = path.rstrip("/") or "/"
    simple = {"/v2/health/live": "live", "/v2/health/ready": "ready", "/v2": "server"}
    if path in simple:
        endpoint = simple[path]
    else:
        match = _MODEL_PATH.fullmatch(path)
        if match is None:
            raise ProtocolError(
                f"No endpoint at {path}: this server speaks the Open Inference Protocol v2 "
                f"(/v2/health/ready, /v2/models/{name}, /v2/models/{name}/infer).",
                404,
            )
        model, version, verb = match.groups()
        if model != name:
            raise ProtocolError(f"Unknown model '{model}': this server serves '{name}'.", 404)
        if version not in (None, VERSION):
            raise ProtocolError(
                f"Unknown version '{version}' of model '{name}': it has version {VERSION} only.",
                404,
            )
        endpoint = {None: "metadata", "ready": "model_ready"}.get(verb, verb)
    wanted = "POST" if endpoint == "infer" else "GET"
    if method.upper() != wanted:
        raise ProtocolError(f"{path} answers {wanted}, not {method}.", 405)
    return endpoint


# -- metadata ----------------------------------------------------------------------------------
def _tensor_metadata(spec: TensorSpec) -> dict:
    return {
        "name": spec.name,
        "datatype": datatype(spec.dtype),
        "shape": [-1 if d is None else d for d in spec.shape],
    }


def server_metadata() -> dict:
    from .._version import __version__

    return {
        "name": "infertune",
        "version": __version__,
        "extensions": ["binary_tensor_data", "statistics"],
    }


def model_metadata(model: ServedModel, name: str) -> dict:
    """Names, datatypes and shapes (-1: any size) of the inputs and outputs, and the candidate
    that runs them (under "parameters", which the protocol leaves free)."""
    return {
        "name": name,
        "versions": [VERSION],
        "platform": "infertune",
        "inputs": [_tensor_metadata(spec) for spec in model.inputs],
        "outputs": [_tensor_metadata(spec) for spec in model.outputs],
        "parameters": {"backend": model.backend},
    }
