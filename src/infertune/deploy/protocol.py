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

A request is read as an attacker may write it (`Limits`): its body is refused past
`max_body_mb` before it is read further, its decompression streams and stops past
`max_decoded_mb` (a decompression bomb costs that much, not what it would expand to), and
every size it declares (shapes, binary_data_size, the JSON header's length) is checked
against the model's inputs and the limits before an array is built from it.

Nothing here knows Ray: the Serve deployment passes the bytes in and sends back what comes
out. A request that does not fit raises `ProtocolError` with the HTTP status (400, 413 past a
limit, 415 for an unknown encoding) and the reason; the error body is `{"error": "..."}`, as
Triton's.
"""

from __future__ import annotations

import json
import math
import re
import struct
import sys
import zlib
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError, ModelError
from .served import ServedModel, TensorSpec, check_shape

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
_NAMES["object"] = "BYTES"  # a string tensor (tf.string), as infertune holds it
_UNSUPPORTED = {"BF16": "BF16 tensors are not supported: send FP32"}
# A BYTES element's length, as the binary form writes it: 4 bytes, little-endian.
_LENGTH = struct.Struct("<I")
# What the server holds for each string beside its bytes: a Python bytes object's header and
# its pointer in the object array (41 bytes on CPython 3.11). The decoded-size limit counts
# it, so that a request of many short strings cannot grow a replica past max_decoded_mb.
_STRING_HELD = sys.getsizeof(b"") + np.dtype(object).itemsize


class ProtocolError(InputError):
    """A request the server cannot answer: `status` is the HTTP status, the message the reason."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def datatype(dtype: np.dtype) -> str:
    """The protocol's name for a numpy dtype ("FP32" for float32)."""
    return _NAMES[np.dtype(dtype).name]


def check_outputs(outputs: Sequence[TensorSpec]) -> None:
    """Raises ModelError where the model has string outputs: the server sends numbers only."""
    strings = [spec.name for spec in outputs if spec.dtype.kind == "O"]
    if strings:
        raise ModelError(
            f"The model's output{'s' if len(strings) > 1 else ''} "
            f"{', '.join(map(repr, strings))} {'are' if len(strings) > 1 else 'is'} strings: "
            f"infertune's Open Inference Protocol server sends numeric outputs only (BYTES "
            f"outputs are not supported). Serve a model whose outputs are numbers (keep the "
            f"string postprocessing, e.g. StringLookup(invert=True), in the client), or call "
            f"the result from Python (infertune.load)."
        )


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


# -- limits ------------------------------------------------------------------------------------
MIB = 2**20
_DECOMPRESS_CHUNK = MIB  # output bytes per step of the streaming decompression


@dataclass(frozen=True)
class Limits:
    """What one infer request may carry, so that no request costs the replica more than this.

    `max_body_mb`: the body as received (compressed or not), in MiB (2**20 bytes);
    `max_decoded_mb`: the body once decompressed (the JSON header and binary tensors);
    `max_batch_size`: the most samples one request may carry along a free batch dimension
    (None: no limit). The defaults, 64 MiB each, are Triton's (`--http-max-input-size`): a
    batch of 32 images of 224x224x3 float32 is 18.4 MiB as binary tensors.
    """

    max_body_mb: float = 64.0
    max_decoded_mb: float = 64.0
    max_batch_size: int | None = None

    @property
    def body_bytes(self) -> int:
        return int(self.max_body_mb * MIB)

    @property
    def decoded_bytes(self) -> int:
        return int(self.max_decoded_mb * MIB)


def _raise_body_limit(limits: Limits, received: str) -> None:
    raise ProtocolError(
        f"The request body is {received}, more than {limits.max_body_mb:g} MiB: this server's "
        f"limit per request (max_body_mb). Send fewer samples per request, or raise it: "
        f"max_body_mb= in infertune.ray.deployment(...), --max-body-mb in infertune serve.",
        413,
    )


def _raise_decoded_limit(limits: Limits, what: str) -> None:
    raise ProtocolError(
        f"{what} more than {limits.max_decoded_mb:g} MiB: this server's limit per request "
        f"once decompressed (max_decoded_mb). Send fewer samples per request, or raise it: "
        f"max_decoded_mb= in infertune.ray.deployment(...), --max-decoded-mb in infertune "
        f"serve.",
        413,
    )


async def read_body(
    chunks: AsyncIterator[bytes], content_length: str | None, limits: Limits
) -> bytearray:
    """The request body from its chunks as they arrive, refused (413) as soon as it passes
    `limits.max_body_mb`: at once where its Content-Length says so, else once that much has
    been read; never more than the limit and one chunk is held."""
    limit = limits.body_bytes
    if content_length is not None:
        try:
            declared = int(content_length)
        except ValueError:
            raise ProtocolError(
                f"Content-Length is {content_length[:40]!r}; expected a number of bytes."
            ) from None
        if declared > limit:
            _raise_body_limit(limits, f"{declared} bytes ({declared / MIB:.1f} MiB)")
    body = bytearray()
    async for chunk in chunks:
        body += chunk
        if len(body) > limit:
            _raise_body_limit(limits, f"{len(body)} bytes so far")
    return body


# -- infer requests ----------------------------------------------------------------------------
@dataclass
class InferRequest:
    """A parsed request: its id, the model's inputs in order, the outputs to send and how."""

    id: str | None
    inputs: list[np.ndarray]
    outputs: list[tuple[int, bool]]  # (index among the model's outputs, send as binary)


def parse_request(
    body: bytes | bytearray,
    model: ServedModel,
    header_length: str | None = None,
    content_encoding: str | None = None,
    limits: Limits = Limits(),  # noqa: B008 - frozen: one shared value is safe
) -> InferRequest:
    """The request `body` (with the values of its `Inference-Header-Content-Length` and
    `Content-Encoding` headers) as the model's inputs. Raises ProtocolError saying what does
    not fit: 400, or 413 past one of `limits`, 415 for an encoding other than gzip or
    deflate. Every size the request declares is checked before an array is built from it."""
    if len(body) > limits.body_bytes:
        _raise_body_limit(limits, f"{len(body)} bytes ({len(body) / MIB:.1f} MiB)")
    body = _decompressed(body, content_encoding, limits)
    header, binary = _split(body, header_length)
    try:
        request = json.loads(header)
    except RecursionError:
        raise ProtocolError("The request's JSON is nested too deeply to be a request.") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer too long
        raise ProtocolError(f"The request is not valid JSON: {str(exc)[:200]}.") from None
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
        raise ProtocolError(
            'The request must be a JSON object with "inputs": a list of tensors, each '
            '{"name", "shape", "datatype", "data"}.'
        )
    specs = {spec.name: spec for spec in model.inputs}
    named: dict[str, np.ndarray] = {}
    offset = 0
    for tensor in request["inputs"]:
        name, array, used = _input_array(tensor, model, specs, limits, binary, offset)
        offset += used
        if name in named:
            raise ProtocolError(f"Input '{name}' is given twice.")
        named[name] = array
    if offset != len(binary):
        raise ProtocolError(
            f"The request carries {len(binary)} bytes of binary data after its JSON header, but "
            f"its inputs' binary_data_size add up to {offset}."
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


def _decompressed(body: bytes | bytearray, content_encoding: str | None, limits: Limits):
    """The body decoded, in steps of at most 1 MiB of output, refused (413) as soon as it
    passes `limits.max_decoded_mb`: a bomb costs that much memory, never what it expands to."""
    encoding = (content_encoding or "identity").strip().lower()
    limit = limits.decoded_bytes
    if encoding == "identity":
        if len(body) > limit:
            _raise_decoded_limit(limits, f"The request body is {len(body)} bytes,")
        return body
    if encoding not in ("gzip", "deflate"):
        raise ProtocolError(
            f"Content-Encoding {encoding[:40]!r} is not supported: send gzip, deflate or an "
            f"uncompressed body.",
            415,
        )
    # gzip: one or more gzip members (as `gzip.decompress` reads them); deflate: zlib data
    # (RFC 9110's "deflate"). The input goes in by slices, so that no step copies the rest.
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    out = bytearray()
    rest = memoryview(body)
    try:
        while True:  # one gzip member (or the zlib stream) per turn
            stream = zlib.decompressobj(wbits)
            position = 0  # how much of `rest` went into `stream`
            while not stream.eof:
                pending = stream.unconsumed_tail
                if not pending and position < len(rest):
                    pending = rest[position : position + _DECOMPRESS_CHUNK]
                    position += len(pending)
                room = limit - len(out) + 1  # one byte past the limit tells it was passed
                piece = stream.decompress(pending, min(room, _DECOMPRESS_CHUNK))
                out += piece
                if len(out) > limit:
                    _raise_decoded_limit(limits, f"The request body decodes ({encoding}) to")
                if not (piece or stream.eof or stream.unconsumed_tail or position < len(rest)):
                    raise ProtocolError(
                        f"The request body is not valid {encoding} data: it ends before the "
                        f"end of the compressed stream."
                    )
            rest = rest[position - len(stream.unused_data) :]
            if encoding == "deflate" or rest[:2] != b"\x1f\x8b":  # no further gzip member
                break
    except zlib.error as exc:
        raise ProtocolError(f"The request body is not valid {encoding} data: {exc}.") from None
    if rest:
        raise ProtocolError(
            f"The request body has {len(rest)} bytes after the end of its {encoding} data."
        )
    return out


def _split(body: bytes | bytearray, header_length: str | None) -> tuple[bytes, memoryview]:
    if header_length is None:
        return body, memoryview(b"")
    try:
        length = int(header_length)
    except ValueError:
        length = -1
    if not 0 <= length <= len(body):
        raise ProtocolError(
            f"{BINARY_HEADER} is {header_length[:40]!r}; expected the length in bytes of the "
            f"JSON header, at most the body's {len(body)} bytes."
        )
    return body[:length], memoryview(body)[length:]


def _short(value: object, limit: int = 120) -> str:
    """`value` as text for a message, cut to `limit` characters: the request wrote it."""
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _input_array(
    tensor: object,
    model: ServedModel,
    specs: dict[str, TensorSpec],
    limits: Limits,
    binary: memoryview,
    offset: int,
) -> tuple[str, np.ndarray, int]:
    """One input tensor of the request: its name, its array, and how many binary bytes it
    used. Its name, shape, datatype and sizes are checked against the model's input and
    `limits` first; the array is built (or viewed in the binary data) only then."""
    if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
        raise ProtocolError(
            f'Each input must be an object with "name", "shape", "datatype" and "data" (or '
            f"binary_data_size). Received: {_short(tensor)}."
        )
    name = tensor["name"]
    spec = specs.get(name)
    if spec is None:
        raise ProtocolError(
            f"Unknown input {_short(repr(name))}. The model takes: {model.describe_inputs()}."
        )
    shape = tensor.get("shape")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise ProtocolError(
            f"Input '{name}' has shape {_short(shape)}; expected a list of sizes >= 0."
        )
    try:  # rank and fixed dimensions first: the sizes below multiply at most `rank` numbers
        check_shape(spec, shape)
    except InputError as exc:
        raise ProtocolError(_short(str(exc), 400)) from None
    kind = tensor.get("datatype")
    dtype = _input_dtype(name, kind, spec)
    batch_free = bool(spec.shape) and spec.shape[0] is None
    if batch_free and limits.max_batch_size is not None and shape[0] > limits.max_batch_size:
        raise ProtocolError(
            f"Input '{name}' has a batch of {_short(shape[0])} samples; this deployment takes "
            f"at most {limits.max_batch_size} per request (its max_batch_size). Split the "
            f"request, or raise max_batch_size= in infertune.ray.deployment(...), "
            f"--max-batch-size in infertune serve."
        )
    count = math.prod(shape)
    if count == 0:
        raise ProtocolError(
            f"Input '{name}' has shape {shape}: no values. Every dimension must be at least 1."
        )
    if dtype is None:  # each string held as a bytes object and its bytes: at least the former
        _check_strings_held(limits, name, shape, count * _STRING_HELD, at_least=True)
    elif count * dtype.itemsize > limits.decoded_bytes:
        held = count * dtype.itemsize
        # str() of an int stops at 4300 digits: a shape of JSON's largest ints passes that.
        size = f"{held} bytes" if held < 2**64 else "more than 2**64 bytes"
        _raise_decoded_limit(limits, f"Input '{name}' ({kind}, shape {_short(shape)}) is {size},")
    # The wire form of a string: its length (4 bytes) and its bytes.
    nbytes = count * (_LENGTH.size if dtype is None else dtype.itemsize)
    parameters = _parameters(tensor, f"Input '{name}' has parameters")
    if "shared_memory_region" in parameters:
        raise ProtocolError(f"Input '{name}': shared memory is not supported; send the data.")
    size = parameters.get("binary_data_size")
    if size is not None:
        if (
            isinstance(size, bool)
            or not isinstance(size, int)
            or (size != nbytes if dtype is not None else size < nbytes)
        ):
            needs = f"{nbytes} bytes of binary data" if dtype is not None else (
                f"at least {nbytes} bytes of binary data (a 4-byte length before each of its "
                f"{count} strings)"
            )  # fmt: skip
            raise ProtocolError(
                f"Input '{name}' ({kind}, shape {shape}) needs {needs}; its "
                f"binary_data_size is {_short(repr(size))}."
            )
        if offset + size > len(binary):
            raise ProtocolError(
                f"Input '{name}' has binary_data_size {size}, but only {len(binary) - offset} "
                f"bytes of binary data are left in the request."
            )
        if dtype is None:
            held = count * _STRING_HELD + size - count * _LENGTH.size
            _check_strings_held(limits, name, shape, held)
            return name, _binary_strings(name, binary[offset : offset + size], count, shape), size
        array = np.frombuffer(binary[offset : offset + size], dtype=dtype).reshape(shape)
        return name, array.astype(dtype.newbyteorder("="), copy=False), size
    if "data" not in tensor:
        raise ProtocolError(f"Input '{name}' has neither \"data\" nor binary_data_size.")
    if dtype is None:
        return name, _json_strings(name, tensor["data"], count, shape, limits), 0
    # The data are already parsed JSON, inside the decoded limit: the array is no larger.
    try:
        array = np.array(tensor["data"], dtype=dtype)
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise ProtocolError(
            f"Input '{name}': its data are not {kind} values ({_short(exc, 200)})."
        ) from None
    if array.size != count:
        raise ProtocolError(
            f"Input '{name}' has {array.size} values in its data; its shape {shape} needs {count}."
        )
    return name, array.reshape(shape), 0


def _input_dtype(name: str, kind: object, spec: TensorSpec) -> np.dtype | None:
    """The numpy dtype of an input's datatype `kind` (None for BYTES: strings), which must be
    the model's input's."""
    if isinstance(kind, str) and kind in _UNSUPPORTED:
        raise ProtocolError(f"Input '{name}': {_UNSUPPORTED[kind]}.")
    if not isinstance(kind, str) or (kind not in _DATATYPES and kind != "BYTES"):
        raise ProtocolError(
            f"Input '{name}' has datatype {_short(repr(kind))}; expected one of "
            f"{', '.join(_DATATYPES)}, BYTES (the model takes {datatype(spec.dtype)})."
        )
    strings = spec.dtype.kind == "O"
    if strings and kind != "BYTES":
        raise ProtocolError(
            f"Input '{name}' has datatype {kind}; the model takes strings there: send datatype "
            f"BYTES ({spec.describe()})."
        )
    if kind == "BYTES" and not strings:
        raise ProtocolError(
            f"Input '{name}' has datatype BYTES (strings); the model takes numbers there: send "
            f"datatype {datatype(spec.dtype)} ({spec.describe()})."
        )
    dtype = None if strings else _DATATYPES[kind]
    if dtype is not None and dtype != spec.dtype:
        raise ProtocolError(
            f"Input '{name}' has dtype {dtype.name}; the model takes {spec.dtype.name} "
            f"(datatype {datatype(spec.dtype)}; {spec.describe()})."
        )
    return dtype


def _check_strings_held(
    limits: Limits, name: str, shape: list[int], held: int, at_least: bool = False
) -> None:
    """413 where a BYTES tensor's strings would hold more than `limits.max_decoded_mb`
    (`held`: _STRING_HELD per string and its bytes; `at_least`: from the shape alone)."""
    if held <= limits.decoded_bytes:
        return
    # str() of an int stops at 4300 digits: a shape of JSON's largest ints passes that.
    size = f"{held} bytes" if held < 2**64 else "more than 2**64 bytes"
    if at_least and held < 2**64:
        size = f"at least {size}"
    _raise_decoded_limit(
        limits,
        f"Input '{name}' (BYTES, shape {_short(shape)}) is {size} held ({_STRING_HELD} bytes "
        f"per string besides its own),",
    )


def _binary_strings(name: str, data: memoryview, count: int, shape: list[int]) -> np.ndarray:
    """The `count` strings of a BYTES tensor's binary data (each a 4-byte little-endian
    length, then that many bytes), as bytes, exactly as sent. Every length is checked against
    the bytes left before any is copied; `data` must hold exactly the `count` strings."""
    strings = np.empty(count, dtype=object)
    position, end = 0, len(data)
    for index in range(count):
        if end - position < _LENGTH.size:
            raise ProtocolError(
                f"Input '{name}' (BYTES, shape {shape}): its binary data end inside the 4-byte "
                f"length of string {index} of {count} ({end - position} bytes left). Each "
                f"string is its length (4 bytes, little-endian), then its bytes."
            )
        (length,) = _LENGTH.unpack_from(data, position)
        position += _LENGTH.size
        if length > end - position:
            raise ProtocolError(
                f"Input '{name}' (BYTES, shape {shape}): string {index} of {count} declares "
                f"{length} bytes, but only {end - position} bytes of its binary_data_size are "
                f"left. Each string is its length (4 bytes, little-endian), then its bytes."
            )
        strings[index] = bytes(data[position : position + length])
        position += length
    if position != end:
        raise ProtocolError(
            f"Input '{name}' (BYTES, shape {shape}): its {count} strings take {position} bytes "
            f"of binary data; its binary_data_size is {end} ({end - position} bytes after the "
            f"last string)."
        )
    return strings.reshape(shape)


def _json_strings(
    name: str, data: object, count: int, shape: list[int], limits: Limits
) -> np.ndarray:
    """A BYTES tensor's JSON data (strings, in a flat or nested list, row-major) as bytes
    (UTF-8), what they hold (_STRING_HELD and its bytes per string) within
    `limits.max_decoded_mb`."""
    found: list[bytes] = []
    pending = [data]  # a stack (no recursion: the JSON may be nested as deep as it parsed)
    nbytes = 0
    while pending:
        value = pending.pop()
        if isinstance(value, list):
            pending.extend(reversed(value))
            continue
        if not isinstance(value, str):
            raise ProtocolError(
                f"Input '{name}': its data are not BYTES values: value {len(found)} is "
                f"{_short(json.dumps(value), 60)}, not a string. BYTES data are strings "
                f"(JSON), or binary data."
            )
        if len(found) == count:  # one more than the shape holds: counted, not kept
            found.append(b"")
            break
        try:
            encoded = value.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate ("\ud800"), which JSON allows
            raise ProtocolError(
                f"Input '{name}': string {len(found)} of its data is not valid Unicode (a lone "
                f"surrogate escape); send it as binary data to pass raw bytes."
            ) from None
        nbytes += _STRING_HELD + len(encoded)
        found.append(encoded)
    _check_strings_held(limits, name, shape, nbytes)
    if len(found) != count:
        many = f"more than {count}" if len(found) > count else str(len(found))
        raise ProtocolError(
            f"Input '{name}' has {many} values in its data; its shape {shape} needs {count}."
        )
    strings = np.empty(count, dtype=object)
    strings[:] = found
    return strings.reshape(shape)


def _parameters(holder: dict, words: str) -> dict:
    """`holder`'s "parameters" ({} where absent); ProtocolError "<words> ...; expected an
    object" where it is not one."""
    parameters = holder.get("parameters")
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise ProtocolError(f"{words} {_short(parameters)}; expected an object.")
    return parameters


def _requested_outputs(request: dict, model: ServedModel) -> list[tuple[int, bool]]:
    parameters = _parameters(request, 'The request\'s "parameters" is')
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
        if not isinstance(name, str) or name not in index:
            raise ProtocolError(
                f"Unknown output {_short(repr(name))}. The model's outputs: "
                f"{', '.join(spec.describe() for spec in model.outputs)}."
            )
        options = _parameters(output, f"Output '{name}' has parameters")
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
