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
`Inference-Header-Content-Length` header says where the JSON ends. Outputs come back binary
where the request asks for it (`parameters.binary_data` on an output, or
`binary_data_output` on the request, as tritonclient sends by default). A request compressed
with `Content-Encoding: gzip` or `deflate` is decompressed.

Nothing here knows Ray: the Serve deployment passes the bytes in and sends back what comes
out. A request that does not fit raises `ProtocolError` with the HTTP status and the reason;
the error body is `{"error": "..."}`, as Triton's.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from .served import ServedModel, TensorSpec

__all__ = [
    "BINARY_HEADER",
    "InferRequest",
    "InferenceStatistics",
    "ProtocolError",
    "datatype",
    "encode_response",
    "error_body",
    "model_metadata",
    "parse_request",
    "route",
    "server_metadata",
]

BINARY_HEADER = "Inference-Header-Content-Length"
VERSION = "1"

_DATATYPES = {
    "BOOL": np.dtype("bool"),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
_NAMES = {dtype.name: name for name, dtype in _DATATYPES.items()}
_UNSUPPORTED = {
    "BYTES": "BYTES tensors (strings) are not supported: the model takes numbers",
    "BF16": "BF16 tensors are not supported: send FP32",
}


class ProtocolError(InputError):
    """A request the server cannot answer: `status` is the HTTP status, the message the reason."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def datatype(dtype: np.dtype) -> str:
    """The protocol's name for a numpy dtype ("FP32" for float32)."""
    return _NAMES[np.dtype(dtype).name]


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


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


# -- infer requests ----------------------------------------------------------------------------
@dataclass
class InferRequest:
    """A parsed request: its id, the model's inputs in order, the outputs to send and how."""

    id: str | None
    inputs: list[np.ndarray]
    outputs: list[tuple[int, bool]]  # (index among the model's outputs, send as binary)


def parse_request(
    body: bytes,
    model: ServedModel,
    header_length: str | None = None,
    content_encoding: str | None = None,
) -> InferRequest:
    """The request `body` (with the values of its `Inference-Header-Content-Length` and
    `Content-Encoding` headers) as the model's inputs. Raises ProtocolError (400) saying what
    does not fit."""
    body = _decompressed(body, content_encoding)
    header, binary = _split(body, header_length)
    try:
        request = json.loads(header)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"The request is not valid JSON: {exc}.") from None
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
        raise ProtocolError(
            'The request must be a JSON object with "inputs": a list of tensors, each '
            '{"name", "shape", "datatype", "data"}.'
        )
    named: dict[str, np.ndarray] = {}
    offset = 0
    for tensor in request["inputs"]:
        array, used = _input_array(tensor, binary, offset)
        offset += used
        if array is None:
            continue
        name = tensor["name"]
        if name in named:
            raise ProtocolError(f"Input '{name}' is given twice.")
        named[name] = array
    if offset != len(binary):
        raise ProtocolError(
            f"The request carries {len(binary)} bytes of binary data after its JSON header, but "
            f"its inputs' binary_data_size add up to {offset}."
        )
    known = {spec.name for spec in model.inputs}
    unknown = [name for name in named if name not in known]
    if unknown:
        raise ProtocolError(
            f"Unknown input {', '.join(map(repr, unknown))}. The model takes: "
            f"{model.describe_inputs()}."
        )
    try:
        arrays = model.check(named, cast=False)
    except InputError as exc:
        raise ProtocolError(str(exc)) from None
    request_id = request.get("id")
    return InferRequest(
        None if request_id is None else str(request_id),
        arrays,
        _requested_outputs(request, model),
    )


def _decompressed(body: bytes, content_encoding: str | None) -> bytes:
    encoding = (content_encoding or "identity").lower()
    try:
        if encoding == "gzip":
            return gzip.decompress(body)
        if encoding == "deflate":
            return zlib.decompress(body)
    except (OSError, zlib.error) as exc:
        raise ProtocolError(f"The request body is not valid {encoding} data: {exc}.") from None
    if encoding != "identity":
        raise ProtocolError(f"Content-Encoding {encoding!r} is not supported (gzip, deflate).")
    return body


def _split(body: bytes, header_length: str | None) -> tuple[bytes, memoryview]:
    if header_length is None:
        return body, memoryview(b"")
    try:
        length = int(header_length)
    except ValueError:
        length = -1
    if not 0 <= length <= len(body):
        raise ProtocolError(
            f"{BINARY_HEADER} is {header_length!r}; expected the length in bytes of the JSON "
            f"header, at most the body's {len(body)} bytes."
        )
    return body[:length], memoryview(body)[length:]


def _input_array(tensor: object, binary: memoryview, offset: int) -> tuple[np.ndarray, int]:
    """One input tensor of the request as an array, and how many binary bytes it used."""
    if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
        raise ProtocolError(
            f'Each input must be an object with "name", "shape", "datatype" and "data" (or '
            f"binary_data_size). Received: {str(tensor)[:120]}."
        )
    name = tensor["name"]
    shape = tensor.get("shape")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise ProtocolError(f"Input '{name}' has shape {shape!r}; expected a list of sizes >= 0.")
    kind = tensor.get("datatype")
    if kind in _UNSUPPORTED:
        raise ProtocolError(f"Input '{name}': {_UNSUPPORTED[kind]}.")
    if kind not in _DATATYPES:
        raise ProtocolError(
            f"Input '{name}' has datatype {kind!r}; expected one of {', '.join(_DATATYPES)}."
        )
    dtype = _DATATYPES[kind]
    count = math.prod(shape)
    parameters = tensor.get("parameters") or {}
    if "shared_memory_region" in parameters:
        raise ProtocolError(f"Input '{name}': shared memory is not supported; send the data.")
    size = parameters.get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or size != count * dtype.itemsize:
            raise ProtocolError(
                f"Input '{name}' ({kind}, shape {shape}) needs {count * dtype.itemsize} bytes of "
                f"binary data; its binary_data_size is {size!r}."
            )
        if offset + size > len(binary):
            raise ProtocolError(
                f"Input '{name}' has binary_data_size {size}, but only {len(binary) - offset} "
                f"bytes of binary data are left in the request."
            )
        array = np.frombuffer(binary[offset : offset + size], dtype=dtype).reshape(shape)
        return array.astype(dtype.newbyteorder("="), copy=False), size
    if "data" not in tensor:
        raise ProtocolError(f"Input '{name}' has neither \"data\" nor binary_data_size.")
    try:
        array = np.array(tensor["data"], dtype=dtype)
    except (ValueError, TypeError, OverflowError) as exc:
        raise ProtocolError(f"Input '{name}': its data are not {kind} values ({exc}).") from None
    if array.size != count:
        raise ProtocolError(
            f"Input '{name}' has {array.size} values in its data; its shape {shape} needs {count}."
        )
    return array.reshape(shape), 0


def _requested_outputs(request: dict, model: ServedModel) -> list[tuple[int, bool]]:
    parameters = request.get("parameters") or {}
    binary_default = bool(parameters.get("binary_data_output", False))
    index = {spec.name: i for i, spec in enumerate(model.outputs)}
    wanted = request.get("outputs")
    if wanted is None:
        return [(i, binary_default) for i in range(len(model.outputs))]
    if not isinstance(wanted, list):
        raise ProtocolError('"outputs" must be a list of {"name": ...} objects.')
    requested = []
    for output in wanted:
        name = output.get("name") if isinstance(output, dict) else None
        if name not in index:
            raise ProtocolError(
                f"Unknown output {name!r}. The model's outputs: "
                f"{', '.join(spec.describe() for spec in model.outputs)}."
            )
        options = output.get("parameters") or {}
        if "shared_memory_region" in options:
            raise ProtocolError(f"Output '{name}': shared memory is not supported.")
        requested.append((index[name], bool(options.get("binary_data", binary_default))))
    return requested


def encode_response(
    name: str, model: ServedModel, request: InferRequest, outputs: Sequence[np.ndarray]
) -> tuple[bytes, dict[str, str]]:
    """The response body and its headers for `request`, from the model's flat outputs."""
    tensors, chunks = [], []
    for index, binary in request.outputs:
        array = np.asarray(outputs[index])
        tensor = {
            "name": model.outputs[index].name,
            "datatype": datatype(array.dtype),
            "shape": list(array.shape),
        }
        if binary:
            data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
            tensor["parameters"] = {"binary_data_size": len(data)}
            chunks.append(data)
        else:
            tensor["data"] = array.reshape(-1).tolist()
        tensors.append(tensor)
    response = {"model_name": name, "model_version": VERSION, "outputs": tensors}
    if request.id is not None:
        response["id"] = request.id
    header = json.dumps(response).encode()
    if not chunks:
        return header, {"Content-Type": "application/json"}
    headers = {"Content-Type": "application/octet-stream", BINARY_HEADER: str(len(header))}
    return b"".join([header, *chunks]), headers


# -- statistics --------------------------------------------------------------------------------
@dataclass
class InferenceStatistics:
    """Counts for Triton's statistics extension: requests, and the batches they ran in.

    `batch_stats` counts executions by batch size in samples (Triton's meaning): requests of
    one sample each that ran together show as one execution of batch size N.
    """

    success_count: int = 0
    success_ns: int = 0
    fail_count: int = 0
    fail_ns: int = 0
    inference_count: int = 0  # samples
    execution_count: int = 0  # model runs
    batches: Counter = field(default_factory=Counter)  # samples per run -> runs
    batch_ns: Counter = field(default_factory=Counter)  # samples per run -> ns

    def record_request(self, ok: bool, ns: int) -> None:
        if ok:
            self.success_count += 1
            self.success_ns += ns
        else:
            self.fail_count += 1
            self.fail_ns += ns

    def record_execution(self, samples: int, ns: int) -> None:
        self.inference_count += samples
        self.execution_count += 1
        self.batches[samples] += 1
        self.batch_ns[samples] += ns

    def to_dict(self, name: str) -> dict:
        return {
            "model_stats": [
                {
                    "name": name,
                    "version": VERSION,
                    "inference_count": self.inference_count,
                    "execution_count": self.execution_count,
                    "inference_stats": {
                        "success": {"count": self.success_count, "ns": self.success_ns},
                        "fail": {"count": self.fail_count, "ns": self.fail_ns},
                    },
                    "batch_stats": [
                        {
                            "batch_size": size,
                            "compute_infer": {
                                "count": self.batches[size],
                                "ns": self.batch_ns[size],
                            },
                        }
                        for size in sorted(self.batches)
                    ],
                }
            ]
        }
