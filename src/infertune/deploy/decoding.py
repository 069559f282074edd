"""An infer request's bytes as the model's inputs: decompressed, split into its JSON header and
binary data, each input checked against the model and the limits (limits.py) before an array
is built from it. The wire format is protocol.py's docstring."""

from __future__ import annotations

import json
import math
import struct
import zlib
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from .limits import (
    MIB,
    STRING_HELD,
    Limits,
    check_batch,
    check_decoded,
    check_strings_held,
    raise_body_limit,
    raise_decoded_limit,
)
from .served import ServedModel, TensorSpec, check_shape
from .wire import BINARY_HEADER, DATATYPES, UNSUPPORTED, ProtocolError, datatype, short

__all__ = ["InferRequest", "parse_request"]

_DECOMPRESS_CHUNK = MIB  # output bytes per step of the streaming decompression
# A BYTES element's length, as the binary form writes it: 4 bytes, little-endian.
_LENGTH = struct.Struct("<I")


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
        raise_body_limit(limits, f"{len(body)} bytes ({len(body) / MIB:.1f} MiB)")
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
            raise_decoded_limit(limits, f"The request body is {len(body)} bytes,")
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
                    raise_decoded_limit(limits, f"The request body decodes ({encoding}) to")
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
    `limits` first (`_input_header`); the array is built (or viewed in the binary data) only
    then."""
    name, shape, kind, dtype, count = _input_header(tensor, model, specs, limits)
    parameters = _parameters(tensor, f"Input '{name}' has parameters")
    if "shared_memory_region" in parameters:
        raise ProtocolError(f"Input '{name}': shared memory is not supported; send the data.")
    size = parameters.get("binary_data_size")
    if size is not None:
        array = _binary_input(name, shape, kind, dtype, count, size, binary, offset, limits)
        return name, array, size
    if "data" not in tensor:
        raise ProtocolError(f"Input '{name}' has neither \"data\" nor binary_data_size.")
    if dtype is None:
        return name, _json_strings(name, tensor["data"], count, shape, limits), 0
    # The data are already parsed JSON, inside the decoded limit: the array is no larger.
    try:
        array = np.array(tensor["data"], dtype=dtype)
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise ProtocolError(
            f"Input '{name}': its data are not {kind} values ({short(exc, 200)})."
        ) from None
    if array.size != count:
        raise ProtocolError(
            f"Input '{name}' has {array.size} values in its data; its shape {shape} needs {count}."
        )
    return name, array.reshape(shape), 0


def _input_header(
    tensor: object, model: ServedModel, specs: dict[str, TensorSpec], limits: Limits
) -> tuple[str, list[int], str, np.dtype | None, int]:
    """An input tensor's name, shape, datatype, dtype (None: strings) and count of values,
    each checked against the model's input and `limits` before anything is built from it."""
    if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
        raise ProtocolError(
            f'Each input must be an object with "name", "shape", "datatype" and "data" (or '
            f"binary_data_size). Received: {short(tensor)}."
        )
    name = tensor["name"]
    spec = specs.get(name)
    if spec is None:
        raise ProtocolError(
            f"Unknown input {short(repr(name))}. The model takes: {model.describe_inputs()}."
        )
    shape = tensor.get("shape")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise ProtocolError(
            f"Input '{name}' has shape {short(shape)}; expected a list of sizes >= 0."
        )
    try:  # rank and fixed dimensions first: the sizes below multiply at most `rank` numbers
        check_shape(spec, shape)
    except InputError as exc:
        raise ProtocolError(short(str(exc), 400)) from None
    kind = tensor.get("datatype")
    dtype = _input_dtype(name, kind, spec)
    check_batch(limits, name, spec, shape)
    count = math.prod(shape)
    if count == 0:
        raise ProtocolError(
            f"Input '{name}' has shape {shape}: no values. Every dimension must be at least 1."
        )
    if dtype is None:  # each string held as a bytes object and its bytes: at least the former
        check_strings_held(limits, name, shape, count * STRING_HELD, at_least=True)
    else:
        check_decoded(limits, name, kind, shape, count * dtype.itemsize)
    return name, shape, kind, dtype, count


def _binary_input(
    name: str,
    shape: list[int],
    kind: str,
    dtype: np.dtype | None,
    count: int,
    size: object,
    binary: memoryview,
    offset: int,
    limits: Limits,
) -> np.ndarray:
    """An input sent as binary data: `size` (its binary_data_size) bytes from `offset`,
    checked against what its shape needs before they are read."""
    # The wire form of a string: its length (4 bytes) and its bytes.
    nbytes = count * (_LENGTH.size if dtype is None else dtype.itemsize)
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
            f"binary_data_size is {short(repr(size))}."
        )
    if offset + size > len(binary):
        raise ProtocolError(
            f"Input '{name}' has binary_data_size {size}, but only {len(binary) - offset} "
            f"bytes of binary data are left in the request."
        )
    if dtype is None:
        held = count * STRING_HELD + size - count * _LENGTH.size
        check_strings_held(limits, name, shape, held)
        return _binary_strings(name, binary[offset : offset + size], count, shape)
    array = np.frombuffer(binary[offset : offset + size], dtype=dtype).reshape(shape)
    return array.astype(dtype.newbyteorder("="), copy=False)


def _input_dtype(name: str, kind: object, spec: TensorSpec) -> np.dtype | None:
    """The numpy dtype of an input's datatype `kind` (None for BYTES: strings), which must be
    the model's input's."""
    if isinstance(kind, str) and kind in UNSUPPORTED:
        raise ProtocolError(f"Input '{name}': {UNSUPPORTED[kind]}.")
    if not isinstance(kind, str) or (kind not in DATATYPES and kind != "BYTES"):
        raise ProtocolError(
            f"Input '{name}' has datatype {short(repr(kind))}; expected one of "
            f"{', '.join(DATATYPES)}, BYTES (the model takes {datatype(spec.dtype)})."
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
    dtype = None if strings else DATATYPES[kind]
    if dtype is not None and dtype != spec.dtype:
        raise ProtocolError(
            f"Input '{name}' has dtype {dtype.name}; the model takes {spec.dtype.name} "
            f"(datatype {datatype(spec.dtype)}; {spec.describe()})."
        )
    return dtype


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
    (UTF-8), what they hold (STRING_HELD and its bytes per string) within
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
                f"{short(json.dumps(value), 60)}, not a string. BYTES data are strings "
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
        nbytes += STRING_HELD + len(encoded)
        found.append(encoded)
    check_strings_held(limits, name, shape, nbytes)
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
        raise ProtocolError(f"{words} {short(parameters)}; expected an object.")
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
                f"Unknown output {short(repr(name))}. The model's outputs: "
                f"{', '.join(spec.describe() for spec in model.outputs)}."
            )
        options = _parameters(output, f"Output '{name}' has parameters")
        if "shared_memory_region" in options:
            raise ProtocolError(f"Output '{name}': shared memory is not supported.")
        requested.append((index[name], bool(options.get("binary_data", binary_default))))
    return requested
