"""What the servers share, without starting one: a saved result behind named tensors
(ServedModel), the Open Inference Protocol's requests and responses as bytes, and the Ray
Data Predictor called as Ray calls it (a plain callable class: Ray itself runs in
test_ray.py)."""

from __future__ import annotations

import asyncio
import gzip
import json
import struct
import subprocess
import sys
import tracemalloc
import zlib

import numpy as np
import pytest
from helpers import dense_model, dict_model, dict_sample
from preprocessing_models import text_classifier

import infertune
from infertune.deploy.limits import STRING_HELD as _STRING_HELD
from infertune.deploy.protocol import (
    BINARY_HEADER,
    Limits,
    ProtocolError,
    check_outputs,
    encode_response,
    model_metadata,
    parse_request,
    read_body,
    route,
)
from infertune.deploy.ray_data import Predictor
from infertune.deploy.served import ServedModel, TensorSpec

# Outputs of the same ONNX Runtime result on the same inputs, batched or not: float32
# round-off of a 2-layer network (a few ulps), far below any real difference.
RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture(scope="module")
def dict_saved(tmp_path_factory):
    sample = dict_sample(np.random.default_rng(0))
    opt = infertune.optimize(
        dict_model(), sample, backends=["onnxruntime-cpu"], isolation="off", verbose=False
    )
    return opt.save(tmp_path_factory.mktemp("served") / "scorer")


@pytest.mark.slow
def test_served_model_names_shapes_and_batches_requests(dense_saved, dict_saved):
    model = ServedModel(dense_saved)
    assert [(s.name, s.dtype.name, s.shape) for s in model.inputs] == [("x", "float32", (None, 6))]
    assert [(s.name, s.shape) for s in model.outputs] == [("output", (None, 3))]
    assert model.batches_requests
    rng = np.random.default_rng(1)
    requests = [[rng.standard_normal((n, 6)).astype("float32")] for n in (1, 3, 2)]
    runs = []
    outputs = model.run_batch(requests, record=lambda samples, ns: runs.append(samples))
    assert runs == [6]  # one run of the model for the three requests
    keras_model = dense_model()
    for request, output in zip(requests, outputs):
        np.testing.assert_allclose(output[0], keras_model(request[0]), rtol=RTOL, atol=ATOL)

    scorer = ServedModel(dict_saved)
    assert [s.name for s in scorer.inputs] == ["features", "tokens"]
    assert [(s.name, s.shape) for s in scorer.outputs] == [
        ("probs", (None, 3)),
        ("score", (None, 1)),
    ]
    with pytest.raises(
        infertune.InputError, match=r"Missing input 'tokens'.*features: \(None, 4\)"
    ):
        scorer.check({"features": np.zeros((2, 4), "float32")}, cast=False)
    with pytest.raises(infertune.InputError, match="dtype int64; the model takes int32"):
        scorer.check({"features": np.zeros((2, 4), "float32"),
                      "tokens": np.zeros((2, 5), "int64")}, cast=False)  # fmt: skip
    with pytest.raises(infertune.InputError, match="different batch sizes"):
        scorer.check({"features": np.zeros((2, 4), "float32"),
                      "tokens": np.zeros((3, 5), "int32")}, cast=True)  # fmt: skip


def test_importing_infertune_never_imports_ray():
    code = "import sys, infertune; print([m for m in ('ray', 'tensorflow') if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


# -- the Open Inference Protocol --------------------------------------------------------------
def test_routes():
    assert route("GET", "/v2/health/ready", "m") == "ready"
    assert route("GET", "/v2/models/m", "m") == "metadata"
    assert route("POST", "/v2/models/m/versions/1/infer", "m") == "infer"
    assert route("GET", "/v2/models/m/stats", "m") == "stats"
    with pytest.raises(ProtocolError, match="Unknown model 'other'") as info:
        route("POST", "/v2/models/other/infer", "m")
    assert info.value.status == 404
    with pytest.raises(ProtocolError, match="answers POST") as info:
        route("GET", "/v2/models/m/infer", "m")
    assert info.value.status == 405


def test_json_and_binary_requests_and_responses(dense_saved):
    model = ServedModel(dense_saved)
    x = np.random.default_rng(2).standard_normal((2, 6)).astype("float32")
    expected = model.run([x])[0]
    metadata = model_metadata(model, "dense")
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 6]}]
    assert metadata["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [-1, 3]}]
    assert metadata["parameters"] == {"backend": "onnxruntime-cpu"}

    # JSON in (nested lists), JSON out, the id echoed
    tensor = {"name": "x", "shape": [2, 6], "datatype": "FP32", "data": x.tolist()}
    body = json.dumps({"id": "a1", "inputs": [tensor]}).encode()
    request = parse_request(body, model)
    content, headers = encode_response("dense", model, request, model.run(request.inputs))
    response = json.loads(content)
    assert BINARY_HEADER not in headers and response["id"] == "a1"
    assert response["outputs"][0]["shape"] == [2, 3]
    np.testing.assert_allclose(np.reshape(response["outputs"][0]["data"], (2, 3)), expected,
                               rtol=RTOL, atol=ATOL)  # fmt: skip

    # binary in (gzip-compressed), binary out: as tritonclient sends by default
    header = json.dumps({
        "inputs": [{"name": "x", "shape": [2, 6], "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes}}],
        "parameters": {"binary_data_output": True},
    }).encode()  # fmt: skip
    request = parse_request(gzip.compress(header + x.tobytes()), model, str(len(header)), "gzip")
    np.testing.assert_array_equal(request.inputs[0], x)
    content, headers = encode_response("dense", model, request, model.run(request.inputs))
    length = int(headers[BINARY_HEADER])
    output = json.loads(content[:length])["outputs"][0]
    assert output["parameters"]["binary_data_size"] == 2 * 3 * 4
    got = np.frombuffer(content[length:], dtype="<f4").reshape(output["shape"])
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    ("request_json", "reason"),
    [
        ("not json", "not valid JSON"),
        ({"inputs": "x"}, '"inputs": a list of tensors'),
        ({"inputs": [{"name": "y", "shape": [1, 6], "datatype": "FP32", "data": [0] * 6}]},
         r"Unknown input 'y'. The model takes: x: \(None, 6\) float32"),
        ({"inputs": [{"name": "x", "shape": [1, 5], "datatype": "FP32", "data": [0] * 5}]},
         r"'x' has shape \(1, 5\); the model takes x: \(None, 6\)"),
        ({"inputs": [{"name": "x", "shape": [1, 6], "datatype": "FP64", "data": [0] * 6}]},
         "dtype float64; the model takes float32"),
        ({"inputs": [{"name": "x", "shape": [1, 6], "datatype": "FP32", "data": [0] * 5}]},
         "has 5 values in its data; its shape"),
        ({"inputs": [{"name": "x", "shape": [1, 6], "datatype": "BYTES", "data": ["a"] * 6}]},
         r"'x' has datatype BYTES \(strings\); the model takes numbers there: send datatype "
         "FP32"),
        ({"inputs": [{"name": "x", "shape": [1, 6], "datatype": "FP32",
                      "data": ["a"] * 6}]}, "its data are not FP32 values"),
        ({"inputs": [{"name": "x", "shape": [1, 6], "datatype": "FP32",
                      "parameters": {"binary_data_size": 24}}]}, "only 0 bytes of binary data"),
        ({"inputs": [{"name": "x", "shape": [1, 6], "datatype": "FP32", "data": [0] * 6}],
          "outputs": [{"name": "logits"}]}, "Unknown output 'logits'"),
        ({"inputs": []}, "Missing input 'x'"),
    ],
)  # fmt: skip
def test_a_malformed_request_is_refused_with_the_reason(dense_saved, request_json, reason):
    model = ServedModel(dense_saved)
    body = request_json if isinstance(request_json, str) else json.dumps(request_json)
    with pytest.raises(ProtocolError, match=reason) as info:
        parse_request(body.encode(), model)
    assert info.value.status == 400


# -- BYTES tensors: string inputs -------------------------------------------------------------
# The text classifier's outputs through the saved chain (TensorFlow head, ONNX Runtime body)
# against Keras on the same strings: float32 round-off of an embedding average and a Dense.
TEXT_RTOL, TEXT_ATOL = 1e-5, 1e-6
TEXTS = ["the cat sat on the mat", "a dog ate my homework", "my cat and the dög"]


def bytes_blob(strings: list[bytes]) -> bytes:
    """A BYTES tensor's binary data, as tritonclient writes it: each string's length (4
    bytes, little-endian), then its bytes."""
    return b"".join(struct.pack("<I", len(s)) + s for s in strings)


def binary_request(blob: bytes, shape: list[int], size: int | None = None) -> tuple[bytes, str]:
    header = json.dumps({
        "inputs": [{"name": "x", "shape": shape, "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(blob) if size is None else size}}],
        "parameters": {"binary_data_output": True},
    }).encode()  # fmt: skip
    return header + blob, str(len(header))


def test_string_inputs_as_json_and_binary_bytes_tensors(text_saved):
    model = ServedModel(text_saved)
    warmed = [n for n in model.report.notes if n.startswith("warmed up before the first call")]
    assert warmed and "failed" not in warmed[0], model.report.notes  # on random strings
    metadata = model_metadata(model, "text")
    assert metadata["inputs"] == [{"name": "x", "datatype": "BYTES", "shape": [-1, 1]}]
    assert metadata["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [-1, 3]}]
    expected = np.asarray(text_classifier()(np.array([[t] for t in TEXTS])))

    # JSON: a flat list of strings, row-major; they reach the model as UTF-8 bytes
    tensor = {"name": "x", "shape": [3, 1], "datatype": "BYTES", "data": TEXTS}
    request = parse_request(json.dumps({"inputs": [tensor]}).encode(), model)
    assert request.inputs[0].dtype == object and request.inputs[0][2, 0] == TEXTS[2].encode()
    content, _ = encode_response("text", model, request, model.run(request.inputs))
    output = json.loads(content)["outputs"][0]
    assert output["datatype"] == "FP32" and output["shape"] == [3, 3]
    np.testing.assert_allclose(np.reshape(output["data"], (3, 3)), expected,
                               rtol=TEXT_RTOL, atol=TEXT_ATOL)  # fmt: skip

    # binary: length-prefixed bytes, binary outputs; a string that is not UTF-8 kept raw
    body, length = binary_request(bytes_blob([t.encode() for t in TEXTS]), [3, 1])
    request = parse_request(body, model, length)
    content, headers = encode_response("text", model, request, model.run(request.inputs))
    split = int(headers[BINARY_HEADER])
    got = np.frombuffer(content[split:], dtype="<f4").reshape(3, 3)
    np.testing.assert_allclose(got, expected, rtol=TEXT_RTOL, atol=TEXT_ATOL)
    body, length = binary_request(bytes_blob([b"\xff\xfe cat", b""]), [2, 1])
    request = parse_request(body, model, length)
    assert request.inputs[0].tolist() == [[b"\xff\xfe cat"], [b""]]
    assert np.isfinite(model.run(request.inputs)[0]).all()


def _text(data=None, datatype="BYTES", shape=(2, 1)) -> dict:
    data = ["the cat", "a dog"] if data is None else data
    return {"inputs": [{"name": "x", "shape": list(shape), "datatype": datatype, "data": data}]}


_TWO = [b"the cat", b"a dog"]


@pytest.mark.parametrize(
    ("request_json", "binary", "reason", "status"),
    [
        (_text([1.5, 2.5], "FP32"), None,
         r"'x' has datatype FP32; the model takes strings there: send datatype BYTES "
         r"\(x: \(None, 1\) string\)", 400),
        (_text([1, 2]), None, "its data are not BYTES values: value 0 is 1, not a string", 400),
        (_text(["a"]), None, r"'x' has 1 values in its data; its shape \[2, 1\] needs 2", 400),
        (_text(["a", "b", "c"]), None, "has more than 2 values in its data", 400),
        (_text(["a", "\ud800"]), None, "string 1 of its data is not valid Unicode", 400),
        (_text(shape=(2, 2)), None, r"'x' has shape \(2, 2\); the model takes", 400),
        (_text(["x" * 40_000] * 2), None, r"The request body is \d+ bytes, more than 0.0625 MiB"
         ".*max_decoded_mb", 413),
        # within the body's limit as JSON, past it as the bytes objects the server holds:
        # by their count before any is read, then with their bytes
        (_text(["a"] * 2_000, shape=(2_000, 1)), None, r"'x' \(BYTES, shape \[2000, 1\]\) "
         rf"is at least {2_000 * _STRING_HELD} bytes held \({_STRING_HELD} bytes per string "
         r"besides its own\), more than 0.0625 MiB.*max_decoded_mb", 413),
        (_text(["x" * 30] * 1_000, shape=(1_000, 1)), None,
         rf"is {1_000 * (_STRING_HELD + 30)} bytes held", 413),
        (_text(shape=(2**40, 1)), None, rf"is at least {2**40 * _STRING_HELD} bytes held "
         rf"\({_STRING_HELD} bytes per string besides its own\), more than", 413),
        (_text(shape=(2**62, 1)), None, r"is more than 2\*\*64 bytes held", 413),
        (None, (bytes_blob(_TWO)[:-1], None),
         "string 1 of 2 declares 5 bytes, but only 4 bytes of its binary_data_size are left",
         400),
        (None, (struct.pack("<I", 2**32 - 1) + bytes_blob(_TWO)[4:], None),
         "string 0 of 2 declares 4294967295 bytes, but only 16", 400),
        (None, (bytes_blob(_TWO)[:13], None), r"end inside the 4-byte length of string 1 of 2 "
         r"\(2 bytes left\)", 400),
        (None, (bytes_blob(_TWO) + b"!", None), "its 2 strings take 20 bytes of binary data; its "
         r"binary_data_size is 21 \(1 bytes after the last string\)", 400),
        (None, (b"abc", None), r"needs at least 8 bytes of binary data \(a 4-byte length before "
         r"each of its 2 strings\); its binary_data_size is 3", 400),
        (None, (bytes_blob(_TWO), 30), "binary_data_size 30, but only 20 bytes", 400),
    ],
)  # fmt: skip
def test_a_malformed_bytes_request_is_refused_with_the_reason(
    text_saved, request_json, binary, reason, status
):
    model = ServedModel(text_saved)
    limits = Limits(max_body_mb=1, max_decoded_mb=1 / 16, max_batch_size=None)
    if binary is None:
        body, length = json.dumps(request_json, separators=(",", ":")).encode(), None
    else:
        body, length = binary_request(binary[0], [2, 1], binary[1])
    with pytest.raises(ProtocolError, match=reason) as info:
        parse_request(body, model, length, limits=limits)
    assert info.value.status == status


def test_many_short_binary_strings_count_what_the_server_holds(text_saved):
    # 1,000 strings of 30 bytes: 34,000 bytes on the wire, within the 64 KiB limit, but each
    # is a bytes object the server holds: 1,000 * (_STRING_HELD + 30) bytes, past it.
    model = ServedModel(text_saved)
    limits = Limits(max_body_mb=1, max_decoded_mb=1 / 16, max_batch_size=None)
    body, length = binary_request(bytes_blob([b"x" * 30] * 1_000), [1_000, 1])
    assert len(body) < limits.decoded_bytes
    held = 1_000 * (_STRING_HELD + 30)
    with pytest.raises(ProtocolError, match=rf"is {held} bytes held") as info:
        parse_request(body, model, length, limits=limits)
    assert info.value.status == 413


def test_string_outputs_are_refused_by_name():
    check_outputs([TensorSpec("probs", np.dtype("float32"), (None, 3))])
    with pytest.raises(infertune.ModelError, match=r"output 'label' is strings.*BYTES outputs "
                       "are not supported"):  # fmt: skip
        check_outputs([TensorSpec("probs", np.dtype("float32"), (None, 3)),
                       TensorSpec("label", np.dtype(object), (None,))])  # fmt: skip


# -- the Ray Data Predictor, called as map_batches calls it -----------------------------------
def test_predictor_columns(dense_saved, dict_saved):
    x = np.random.default_rng(3).standard_normal((5, 6))  # float64, as pandas would give
    predictor = Predictor(dense_saved)
    assert predictor.backend == "onnxruntime-cpu"
    for column in ("x", "data"):  # the model's input name, and ray.data.from_numpy's column
        batch = predictor({column: x, "id": np.arange(5)})
        assert set(batch) == {"output", "id"}  # other columns are kept, inputs dropped
        np.testing.assert_allclose(batch["output"], dense_model()(x.astype("float32")),
                                   rtol=RTOL, atol=ATOL)  # fmt: skip
    with pytest.raises(infertune.InputError, match=r"Missing column 'x' \(received \['y'\]\)"):
        predictor({"y": x})
    with pytest.raises(infertune.InputError, match=r"Column 'x' has shape \(5, 5\); the model"):
        predictor({"x": x[:, :5]})
    with pytest.raises(infertune.InputError, match="both a 'x' and a 'data' column"):
        predictor({"x": x, "data": x})
    with pytest.raises(infertune.InputError, match="already has column"):
        predictor({"x": x, "output": x})
    with pytest.raises(TypeError, match="dict of numpy columns"):
        predictor(x)

    sample = dict_sample(np.random.default_rng(4), batch=3)
    batch = Predictor(dict_saved)(sample)
    assert set(batch) == {"probs", "score"}
    expected = dict_model()(sample)
    for key in batch:
        np.testing.assert_allclose(batch[key], expected[key], rtol=RTOL, atol=ATOL)


# -- limits: a request read as an attacker may write it ---------------------------------------
def _bomb(decoded_mib: int, encoding: str = "gzip") -> bytes:
    """`decoded_mib` MiB of zeros, compressed (about 1000:1), built a MiB at a time."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS if encoding == "gzip"
                                  else zlib.MAX_WBITS)  # fmt: skip
    zeros = bytes(2**20)
    return b"".join([*(compressor.compress(zeros) for _ in range(decoded_mib)),
                     compressor.flush()])  # fmt: skip


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_decompression_bomb_stops_at_the_decoded_limit(dense_saved, encoding):
    model = ServedModel(dense_saved)
    bomb = _bomb(256, encoding)
    assert len(bomb) < 2**20  # 256 MiB of zeros in less than 1 MiB
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError, match=r"decodes \(.*\) to more than 1 MiB") as info:
            parse_request(bomb, model, content_encoding=encoding, limits=Limits(max_decoded_mb=1))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info.value.status == 413
    assert "max_decoded_mb=" in str(info.value) and "--max-decoded-mb" in str(info.value)
    # The limit (1 MiB), one step of output (1 MiB) and the bytearray's growth: far from the
    # 256 MiB the bomb expands to.
    assert peak < 4 * 2**20, peak


def test_body_and_declared_sizes_are_checked_before_anything_is_built(dense_saved):
    model = ServedModel(dense_saved)
    limits = Limits(max_body_mb=1, max_decoded_mb=1, max_batch_size=8)

    with pytest.raises(ProtocolError, match=r"more than 1 MiB: this server's limit per request "
                       r"\(max_body_mb\).*--max-body-mb") as info:  # fmt: skip
        parse_request(bytes(2 * 2**20), model, limits=limits)
    assert info.value.status == 413

    def request(shape, **parameters) -> bytes:
        tensor = {"name": "x", "shape": shape, "datatype": "FP32", "parameters": parameters}
        return json.dumps({"inputs": [tensor]}).encode()

    # A batch larger than the deployment takes: 400 naming the largest it takes.
    header = request([9, 6], binary_data_size=9 * 24)
    with pytest.raises(ProtocolError, match=r"batch of 9 samples; this deployment takes at "
                       r"most 8 per request \(its max_batch_size\)") as info:  # fmt: skip
        parse_request(header + bytes(9 * 24), model, str(len(header)), limits=limits)
    assert info.value.status == 400
    # Sizes no request could carry, declared: refused on the numbers, nothing allocated.
    for shape in ([1, 2**62], [2**62, 6], [10**1000, 6]):
        body = request(shape, binary_data_size=24)
        with pytest.raises(ProtocolError) as info:
            parse_request(body, model, str(len(body)), limits=Limits(max_batch_size=None))
        assert info.value.status in (400, 413), info.value
    with pytest.raises(ProtocolError, match=r"is more than 2\*\*64 bytes, more than 64 MiB"):
        body = request([10**1000, 6], binary_data_size=24)
        parse_request(body, model, str(len(body)))
    empty = request([0, 6], binary_data_size=0)
    with pytest.raises(ProtocolError, match="no values"):
        parse_request(empty, model, str(len(empty)))
    with pytest.raises(ProtocolError, match="Content-Encoding 'br' is not supported") as info:
        parse_request(b"{}", model, content_encoding="br")
    assert info.value.status == 415
    with pytest.raises(ProtocolError, match="nested too deeply"):
        parse_request(b"[" * 100_000 + b"]" * 100_000, model)


def test_the_body_is_read_no_further_than_its_limit():
    limits = Limits(max_body_mb=1)
    read = []

    async def chunks(count: int):
        for _ in range(count):
            read.append(64 * 1024)
            yield bytes(64 * 1024)

    # A Content-Length past the limit: refused before a byte of the body is read.
    with pytest.raises(ProtocolError, match="is 3145728 bytes") as info:
        asyncio.run(read_body(chunks(48), str(3 * 2**20), limits))
    assert info.value.status == 413 and read == []
    # No Content-Length (chunked): refused at the first chunk past the limit.
    with pytest.raises(ProtocolError, match="more than 1 MiB") as info:
        asyncio.run(read_body(chunks(48), None, limits))
    assert info.value.status == 413 and sum(read) == 2**20 + 64 * 1024
    assert len(asyncio.run(read_body(chunks(4), None, limits))) == 4 * 64 * 1024


def test_serve_help_states_the_limits():
    done = subprocess.run([sys.executable, "-m", "infertune", "serve", "--help"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    text = " ".join(done.stdout.split())
    for said in ("--max-body-mb MIB", "--max-decoded-mb MIB", "HTTP 413", "(64)", "SIGTERM"):
        assert said in text, said


def test_batched_requests_never_run_past_the_largest_batch(dense_saved):
    model = ServedModel(dense_saved)
    rng = np.random.default_rng(5)
    requests = [[rng.standard_normal((n, 6)).astype("float32")] for n in (20, 20, 5, 32)]
    runs = []
    outputs = model.run_batch(requests, lambda samples, ns: runs.append(samples), max_samples=32)
    assert runs == [20, 25, 32]  # in order, each run at most 32 samples
    for request, output in zip(requests, outputs):
        np.testing.assert_allclose(output[0], model.run(request)[0], rtol=RTOL, atol=ATOL)
