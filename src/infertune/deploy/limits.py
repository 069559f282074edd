"""What one infer request may cost the server, and the checks that hold it to that.

A request is read as an attacker may write it (`Limits`): its body is refused past
`max_body_mb` before it is read further, its decompression streams and stops past
`max_decoded_mb` (a decompression bomb costs that much, not what it would expand to), and
every size it declares (shapes, binary_data_size, the JSON header's length) is checked
against the model's inputs and the limits before an array is built from it (decoding.py).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np

from .served import TensorSpec
from .wire import ProtocolError, short

__all__ = [
    "MIB",
    "STRING_HELD",
    "Limits",
    "check_batch",
    "check_decoded",
    "check_strings_held",
    "raise_body_limit",
    "raise_decoded_limit",
    "read_body",
]

MIB = 2**20
# What the server holds for each string beside its bytes: a Python bytes object's header and
# its pointer in the object array (41 bytes on CPython 3.11). The decoded-size limit counts
# it, so that a request of many short strings cannot grow a replica past max_decoded_mb.
STRING_HELD = sys.getsizeof(b"") + np.dtype(object).itemsize


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


def raise_body_limit(limits: Limits, received: str) -> None:
    raise ProtocolError(
        f"The request body is {received}, more than {limits.max_body_mb:g} MiB: this server's "
        f"limit per request (max_body_mb). Send fewer samples per request, or raise it: "
        f"max_body_mb= in infertune.ray.deployment(...), --max-body-mb in infertune serve.",
        413,
    )


def raise_decoded_limit(limits: Limits, what: str) -> None:
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
            raise_body_limit(limits, f"{declared} bytes ({declared / MIB:.1f} MiB)")
    body = bytearray()
    async for chunk in chunks:
        body += chunk
        if len(body) > limit:
            raise_body_limit(limits, f"{len(body)} bytes so far")
    return body


def check_batch(limits: Limits, name: str, spec: TensorSpec, shape: list[int]) -> None:
    """400 where input `name` carries more samples along its free batch dimension than
    `limits.max_batch_size`."""
    batch_free = bool(spec.shape) and spec.shape[0] is None
    if batch_free and limits.max_batch_size is not None and shape[0] > limits.max_batch_size:
        raise ProtocolError(
            f"Input '{name}' has a batch of {short(shape[0])} samples; this deployment takes "
            f"at most {limits.max_batch_size} per request (its max_batch_size). Split the "
            f"request, or raise max_batch_size= in infertune.ray.deployment(...), "
            f"--max-batch-size in infertune serve."
        )


def check_decoded(limits: Limits, name: str, kind: str, shape: list[int], held: int) -> None:
    """413 where input `name`'s numbers (`held` bytes, from its shape) would pass
    `limits.max_decoded_mb`."""
    if held > limits.decoded_bytes:
        # str() of an int stops at 4300 digits: a shape of JSON's largest ints passes that.
        size = f"{held} bytes" if held < 2**64 else "more than 2**64 bytes"
        raise_decoded_limit(limits, f"Input '{name}' ({kind}, shape {short(shape)}) is {size},")


def check_strings_held(
    limits: Limits, name: str, shape: list[int], held: int, at_least: bool = False
) -> None:
    """413 where a BYTES tensor's strings would hold more than `limits.max_decoded_mb`
    (`held`: STRING_HELD per string and its bytes; `at_least`: from the shape alone)."""
    if held <= limits.decoded_bytes:
        return
    # str() of an int stops at 4300 digits: a shape of JSON's largest ints passes that.
    size = f"{held} bytes" if held < 2**64 else "more than 2**64 bytes"
    if at_least and held < 2**64:
        size = f"at least {size}"
    raise_decoded_limit(
        limits,
        f"Input '{name}' (BYTES, shape {short(shape)}) is {size} held ({STRING_HELD} bytes "
        f"per string besides its own),",
    )
