"""The Open Inference Protocol's request path under generated requests (hypothesis): a
well-formed request mutated in one to three ways (wrong types, shapes, datatypes, lengths,
binary header lengths, encodings, huge declared sizes, unicode, nesting, bodies past the
limits, a decompression bomb) must end in a 4xx with a one-line JSON message, or, where it
is still well-formed, in outputs of the right shapes; never in a 500 and never in an
exception out of the parser or the replica's handler.

BYTES tensors (strings) are fuzzed the same way on the text classifier's string input.

Two levels: `parse_request` and `encode_response` as functions of bytes, and the handler a
replica runs (`InferenceEndpoints`: the body streamed in chunks under the limits, parsed,
run, answered), called with Starlette requests and a plain coroutine in place of Ray's
batching, so no Ray starts here.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from infertune.deploy.protocol import (
    BINARY_HEADER,
    Limits,
    ProtocolError,
    encode_response,
    error_body,
    parse_request,
)
from infertune.deploy.served import ServedModel

# Small limits, so that generated bodies pass them often: 64 KiB as received and decoded,
# batches of up to 4 samples.
LIMITS = Limits(max_body_mb=1 / 16, max_decoded_mb=1 / 16, max_batch_size=4)
# Enough examples to reach every mutation and most pairs of them in a few seconds; more with
# INFERTUNE_FUZZ_EXAMPLES=20000 for a longer search.
EXAMPLES = int(os.environ.get("INFERTUNE_FUZZ_EXAMPLES", "300"))
# Fixtures made once per test, slow examples and large bodies are what these tests are for.
UNCHECKED = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large]

_DATATYPES = ["BOOL", "UINT8", "INT8", "INT32", "INT64", "FP16", "FP32", "FP64", "BYTES", "BF16"]
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=12,
)
_SIZES = st.integers(-3, 8) | st.sampled_from([2**31, 2**62, 2**64 + 1, 10**1000]) | _JSON


@st.composite
def requests(draw) -> tuple[bytes, dict[str, str]]:
    """A request for the dense model (x: (None, 6) float32) as (body, headers): well-formed,
    then mutated in up to three ways."""
    batch = draw(st.integers(1, 3))
    x = np.random.default_rng(draw(st.integers(0, 2**16))).standard_normal((batch, 6))
    x = x.astype("float32")
    binary = draw(st.booleans())
    tensor: dict = {"name": "x", "shape": [batch, 6], "datatype": "FP32"}
    if binary:
        tensor["parameters"] = {"binary_data_size": x.nbytes}
    else:
        tensor["data"] = draw(st.sampled_from([x.reshape(-1).tolist(), x.tolist()]))
    request: dict = {"inputs": [tensor]}
    if draw(st.booleans()):
        binary_out = draw(st.booleans())
        request["outputs"] = [{"name": "output", "parameters": {"binary_data": binary_out}}]
    if draw(st.booleans()):
        request["id"] = draw(st.text(max_size=10))
    blob = x.tobytes() if binary else b""
    header_text = None  # JSON text written by hand, where json.dumps cannot write it
    encoding = None
    header_length: str | None = "exact" if binary else None
    for mutation in draw(st.lists(st.integers(0, 21), max_size=3)):
        if mutation == 0:
            tensor["name"] = draw(st.text(max_size=6) | _JSON)
        elif mutation == 1:
            tensor["shape"] = draw(st.lists(_SIZES, max_size=4) | _JSON)
        elif mutation == 2:
            tensor["datatype"] = draw(st.sampled_from(_DATATYPES) | st.text(max_size=5) | _JSON)
        elif mutation == 3:
            tensor["data"] = draw(_JSON)
        elif mutation == 4:  # lengths: a value more or fewer
            data = x.reshape(-1).tolist()
            tensor["data"] = data[:-1] if draw(st.booleans()) else [*data, 0.5]
        elif mutation == 5:
            parameters = tensor.get("parameters")
            tensor["parameters"] = dict(parameters) if isinstance(parameters, dict) else {}
            tensor["parameters"]["binary_data_size"] = draw(_SIZES)
        elif mutation == 6:
            header_length = draw(st.sampled_from(["-1", "0", "", "1e3", "9" * 30, "٣"])
                                 | st.integers(-5, 5000).map(str))  # fmt: skip
        elif mutation == 7:  # binary data longer or shorter than declared
            blob = blob[: draw(st.integers(0, len(blob)))] + draw(st.binary(max_size=8))
        elif mutation == 8:
            encoding = draw(st.sampled_from(["gzip", "deflate", "GZIP", "br", "gzip, deflate",
                                             "identity", ""]) | st.text(max_size=6))  # fmt: skip
        elif mutation == 9:  # huge declared sizes, consistent with each other
            count = draw(st.sampled_from([2**20, 2**31, 2**62, 10**30]))
            tensor["shape"] = [count, 6]
            tensor["parameters"] = {"binary_data_size": count * 24}
        elif mutation == 10:  # nesting: the data wrapped, or JSON nested past any parser
            if draw(st.booleans()):
                tensor["data"] = [[[tensor.get("data", [])]]]
            else:
                depth = draw(st.integers(50, 200_000))
                header_text = "[" * depth + "]" * depth
        elif mutation == 11:  # unicode where names go, and invalid UTF-8 in the JSON
            if draw(st.booleans()):
                tensor["name"] = draw(st.text(st.characters(min_codepoint=128), max_size=5))
            else:
                header_text = b'{"inputs": [{"name": "\xff\xfe"}]}'.decode("latin-1")
        elif mutation == 12:
            request = draw(_JSON)
        elif not isinstance(request, dict):  # mutation 12 left no object to mutate
            continue
        elif mutation == 13:
            request["inputs"] = draw(_JSON)
        elif mutation == 14:  # the same input twice, or one the model does not take
            request["inputs"] = [tensor, dict(tensor, name=draw(st.sampled_from(["x", "y"])))]
        elif mutation == 15:
            request["outputs"] = draw(_JSON | st.lists(_JSON, max_size=2))
        elif mutation == 16:
            request["parameters"] = draw(_JSON)
        elif mutation == 17:
            tensor["parameters"] = draw(_JSON)
        elif mutation == 18:  # past the body or decoded limit
            request["padding"] = " " * draw(st.sampled_from([2**15, 2**16, 2**17]))
        elif mutation == 19:  # a decompression bomb: 4 MiB of zeros in about 4 KiB
            encoding = "bomb"
        elif mutation == 20:  # a batch larger than the deployment takes
            tensor["shape"] = [draw(st.integers(5, 64)), 6]
        elif mutation == 21:  # a body that is not JSON at all
            header_text = draw(st.binary(max_size=40)).decode("latin-1")
    if header_text is not None:
        header = header_text.encode("latin-1")
    else:
        header = json.dumps(request).encode()
    body = header + blob
    headers = {}
    if header_length == "exact":
        headers[BINARY_HEADER] = str(len(header))
    elif header_length is not None:
        headers[BINARY_HEADER] = header_length
    if encoding == "bomb":
        compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        body = b"".join([compressor.compress(body), compressor.compress(bytes(4 * 2**20)),
                         compressor.flush()])  # fmt: skip
        headers["Content-Encoding"] = "gzip"
    elif encoding is not None:
        lowered = encoding.strip().lower()
        if lowered in ("gzip", "deflate"):
            wbits = 16 + zlib.MAX_WBITS if lowered == "gzip" else zlib.MAX_WBITS
            compressor = zlib.compressobj(6, zlib.DEFLATED, wbits)
            body = compressor.compress(body) + compressor.flush()
            if draw(st.booleans()):  # cut short, or trailing bytes
                body = body[: draw(st.integers(0, len(body)))] + draw(st.binary(max_size=4))
        headers["Content-Encoding"] = encoding
    return body, headers


@pytest.fixture(scope="module")
def served(dense_saved):
    return ServedModel(dense_saved)


def _check_refusal(exc: ProtocolError) -> None:
    """A refusal the client can act on: a 4xx and a one-line JSON message."""
    assert 400 <= exc.status < 500, (exc.status, exc)
    body = error_body(str(exc))
    assert b"\n" not in body and json.loads(body)["error"].strip()


def _check_response(model: ServedModel, request, content: bytes, headers: dict) -> None:
    """A response a client decodes: the outputs asked for, with the shapes of the batch."""
    length = int(headers.get(BINARY_HEADER, len(content)))
    document = json.loads(content[:length])
    batch = request.inputs[0].shape[0]
    assert [o["name"] for o in document["outputs"]] == [
        model.outputs[index].name for index, _ in request.outputs
    ]
    offset = length
    for output in document["outputs"]:
        assert output["shape"] == [batch, 3] and output["datatype"] == "FP32"
        if "data" in output:
            assert len(output["data"]) == batch * 3
        else:
            offset += output["parameters"]["binary_data_size"]
    assert offset == len(content)


@pytest.mark.slow
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=UNCHECKED)
@given(request=requests())
def test_every_generated_request_ends_in_outputs_or_a_4xx(served, request):
    body, headers = request
    try:
        parsed = parse_request(body, served, headers.get(BINARY_HEADER),
                               headers.get("Content-Encoding"), LIMITS)  # fmt: skip
    except ProtocolError as exc:
        _check_refusal(exc)
        event(f"refused {exc.status}")
        return
    event("answered")
    outputs = served.run_batch([parsed.inputs], max_samples=LIMITS.max_batch_size)[0]
    content, response_headers = encode_response("dense", served, parsed, outputs)
    _check_response(served, parsed, content, response_headers)


# -- BYTES tensors: the text classifier's string input ----------------------------------------
_WORDS = ["the", "cat", "dög", "mat", "", "\u2603", "a dog"]


@st.composite
def string_requests(draw) -> tuple[bytes, str | None]:
    """A request for the text classifier (x: (None, 1) string) as (body, header length):
    BYTES as JSON strings or length-prefixed binary data, then mutated in up to three ways
    (lengths past the data, cut short or padded, numbers for strings, other datatypes and
    shapes, huge counts, raw bytes that are not UTF-8, lone surrogates)."""
    batch = draw(st.integers(1, 3))
    texts = [draw(st.sampled_from(_WORDS)) for _ in range(batch)]
    raw = [t.encode() for t in texts]
    binary = draw(st.booleans())
    tensor: dict = {"name": "x", "shape": [batch, 1], "datatype": "BYTES"}
    blob = b"".join(struct.pack("<I", len(r)) + r for r in raw) if binary else b""
    if not binary:
        tensor["data"] = texts if draw(st.booleans()) else [[t] for t in texts]
    header_text = None
    for mutation in draw(st.lists(st.integers(0, 9), max_size=3)):
        if mutation == 0:  # a length prefix anything from 0 to 2**32 - 1
            if blob:
                at = draw(st.integers(0, max(0, len(blob) - 4)))
                length = draw(st.integers(0, 40) | st.sampled_from([2**31, 2**32 - 1]))
                blob = blob[:at] + struct.pack("<I", length) + blob[at + 4 :]
        elif mutation == 1:  # cut short or padded
            blob = blob[: draw(st.integers(0, len(blob)))] + draw(st.binary(max_size=6))
        elif mutation == 2:  # raw bytes that are not UTF-8: kept as sent
            extra = draw(st.binary(min_size=1, max_size=6))
            blob += struct.pack("<I", len(extra)) + extra
            tensor["shape"] = [batch + 1, 1]
        elif mutation == 3:
            tensor["data"] = draw(_JSON)
        elif mutation == 4:  # numbers for strings
            tensor["data"] = draw(st.lists(st.integers(-3, 3) | st.floats(), max_size=4))
        elif mutation == 5:
            tensor["datatype"] = draw(st.sampled_from(_DATATYPES))
        elif mutation == 6:
            tensor["shape"] = draw(st.lists(_SIZES, max_size=3) | _JSON)
        elif mutation == 7:  # a lone surrogate in a JSON string
            tensor["data"] = ["\ud800", *texts[1:]]
        elif mutation == 8:  # huge declared counts
            tensor["shape"] = [draw(st.sampled_from([2**20, 2**31, 2**62, 10**30])), 1]
        elif mutation == 9:
            header_text = draw(st.binary(max_size=40)).decode("latin-1")
    if blob or binary:
        parameters = tensor.setdefault("parameters", {})
        parameters["binary_data_size"] = draw(st.just(len(blob)) | _SIZES)
    if header_text is not None:
        header = header_text.encode("latin-1")
    else:
        header = json.dumps({"inputs": [tensor]}).encode()
    return header + blob, str(len(header)) if (blob or binary) else None


@pytest.fixture(scope="module")
def text_served(text_saved):
    return ServedModel(text_saved)


@pytest.mark.slow
@settings(max_examples=EXAMPLES // 2, deadline=None, suppress_health_check=UNCHECKED)
@given(request=string_requests())
def test_every_generated_bytes_request_ends_in_outputs_or_a_4xx(text_served, request):
    body, header_length = request
    try:
        parsed = parse_request(body, text_served, header_length, None, LIMITS)
    except ProtocolError as exc:
        _check_refusal(exc)
        event(f"refused {exc.status}")
        return
    event("answered")
    strings = parsed.inputs[0]
    assert strings.dtype == object and all(isinstance(s, bytes) for s in strings.ravel())
    outputs = text_served.run_batch([parsed.inputs], max_samples=LIMITS.max_batch_size)[0]
    content, headers = encode_response("text", text_served, parsed, outputs)
    _check_response(text_served, parsed, content, headers)


# -- the replica's handler, without Ray ---------------------------------------------------------
@pytest.fixture(scope="module")
def endpoints(served):
    pytest.importorskip("ray", reason='pip install "infertune[ray]" (in the test extra)')
    from infertune.deploy.ray_serve import InferenceEndpoints

    async def run(inputs):  # what serve.batch does for one request
        return served.run_batch([inputs], max_samples=LIMITS.max_batch_size)[0]

    loop = asyncio.new_event_loop()
    try:
        yield InferenceEndpoints(served, "dense", LIMITS, run), loop
    finally:
        loop.close()


def _starlette_request(body: bytes, headers: dict[str, str], chunk: int, declare_length: bool):
    from starlette.requests import Request

    pieces = [body[i : i + chunk] for i in range(0, len(body), chunk)] or [b""]
    raw = [(k.lower().encode(), v.encode("utf-8", "surrogatepass")) for k, v in headers.items()]
    if declare_length:
        raw.append((b"content-length", str(len(body)).encode()))
    messages = iter([{"type": "http.request", "body": piece, "more_body": i < len(pieces) - 1}
                     for i, piece in enumerate(pieces)])  # fmt: skip

    async def receive():
        return next(messages, {"type": "http.disconnect"})

    scope = {"type": "http", "method": "POST", "path": "/v2/models/dense/infer",
             "headers": raw, "query_string": b"", "http_version": "1.1"}  # fmt: skip
    return Request(scope, receive)


@settings(max_examples=EXAMPLES // 2, deadline=None, suppress_health_check=UNCHECKED)
@given(request=requests(), chunk=st.sampled_from([1000, 2**14, 2**20]),
       declare_length=st.booleans())  # fmt: skip
def test_the_replicas_handler_answers_every_generated_request(endpoints, request, chunk,
                                                              declare_length):  # fmt: skip
    handler, loop = endpoints
    body, headers = request
    response = loop.run_until_complete(
        handler(_starlette_request(body, headers, chunk, declare_length))
    )
    assert response.status_code == 200 or 400 <= response.status_code < 500, response.body
    event(f"status {response.status_code}")
    if response.status_code != 200:
        assert b"\n" not in response.body and json.loads(response.body)["error"].strip()
