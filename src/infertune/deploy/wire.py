"""What every part of the Open Inference Protocol v2 server shares (protocol.py): the error a
request gets, the protocol's datatype names, its binary-data header and its one model version.
It imports nothing else of the server, so that the limits, the decoding and the encoding all
build on it."""

from __future__ import annotations

import json

import numpy as np

from ..errors import InputError

__all__ = [
    "BINARY_HEADER",
    "DATATYPES",
    "UNSUPPORTED",
    "VERSION",
    "ProtocolError",
    "datatype",
    "error_body",
    "short",
]

BINARY_HEADER = "Inference-Header-Content-Length"
VERSION = "1"

DATATYPES = {
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
_NAMES = {dtype.name: name for name, dtype in DATATYPES.items()}
_NAMES["object"] = "BYTES"  # a string tensor (tf.string), as infertune holds it
UNSUPPORTED = {"BF16": "BF16 tensors are not supported: send FP32"}


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


def short(value: object, limit: int = 120) -> str:
    """`value` as text for a message, cut to `limit` characters: the request wrote it."""
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
