"""int8 quantization of the ONNX export by onnxruntime.quantization (shipped with
onnxruntime): dynamic ("onnx-int8") and static ("onnx-int8-static").

Dynamic quantization turns MatMul/Gemm into MatMulInteger and Conv into ConvInteger: fast on
Dense-heavy models (a BERT-sized encoder 2.6x on a VNNI CPU), 4-11x slower than float32 on
convolutional networks, where ConvInteger is unoptimized (shared/FIELD_NOTES.md).

Static quantization calibrates the activations' ranges on the user's calibration inputs and
writes QuantizeLinear/DequantizeLinear pairs (QDQ) around each quantized op: uint8
activations, int8 weights per output channel; ONNX Runtime fuses them into QLinearConv and
QGemm (ResNet50 224: 2.84x float32 on a VNNI EPYC). The calibration method (min-max,
percentile, entropy) is a setting: the pipeline tries the next where one does not pass the
gate. Layers kept in float32 (`keep`: name scopes, see `layer_scopes`) are left out of the
quantization, with their inputs dequantized.

The ranges a calibration finds do not depend on the layers kept: the first static quantization
of an export with a method keeps them (the quantizer's calibration cache, a JSON text, in
`OnnxExport.derived`, by method and calibration data), and the next with that method, a
search step keeping one more layer, reads them instead of running the model on the samples
again: the same model byte for byte (BERT-sized encoder, 32 samples: 3.2 s against 7.3 s).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import logging
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ...export.onnx import (
    DATA_FILE,
    ONNX_FILE,
    OnnxExport,
    in_memory_export,
    owned_export,
    temporary_directory,
)
from ...system.quiet import stdout_silenced

__all__ = [
    "CALIBRATION_METHODS",
    "CALIBRATION_SAMPLES",
    "INT8_QUANTIZATION",
    "INT8_SETTINGS_TEXT",
    "keep_pattern",
    "layer_errors",
    "layer_scopes",
    "quantize_dynamic_int8",
    "quantize_static_int8",
    "static_settings_text",
]

# Samples the calibration runs on: ONNX Runtime's calibrators keep every intermediate tensor
# of every sample until the end (ResNet50 224: about 105 MB a sample, 13 GB for 128), and a
# few dozen samples set the ranges of a trained network's activations as well (its own
# examples calibrate on 16 to 32).
CALIBRATION_SAMPLES = 32
# onnxruntime.quantization.CalibrationMethod by infertune's names, in the order tried.
CALIBRATION_METHODS = {"minmax": "MinMax", "percentile": "Percentile", "entropy": "Entropy"}
# Ops whose weights static quantization makes int8 (the arithmetic of a model).
_QUANTIZED_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
# OnnxExport.derived: {(method, the calibration data's digest): the calibration cache's text}
_RANGES = "onnxruntime calibration ranges"

# The int8 candidate's settings, as onnxruntime.quantization.quantize_dynamic takes them:
# weights int8 per output channel in 7 bits (reduce_range), activations uint8 quantized per
# call. On an x86 CPU without VNNI (AVX2) ONNX Runtime multiplies uint8 activations by int8
# weights with vpmaddubsw, which adds pairs of products in int16 and saturates: with full
# 8-bit weights a 32-8-16 MLP came out 26% off on such a CPU (ONNX Runtime 1.31.1 and 1.32.0
# alike; 1% where the sums are exact). 7-bit weights, in [-64, 64], cannot overflow (2 x 255
# x 64 < 32767), so the quantized model, which opt.save() writes, is as exact on every CPU.
INT8_QUANTIZATION = {"weight_type": "QInt8", "per_channel": True, "reduce_range": True}
INT8_SETTINGS_TEXT = (
    "dynamic int8: weights QInt8 per channel in 7 bits (reduce_range), activations uint8 "
    "quantized per call"
)


def quantize_dynamic_int8(exported: OnnxExport) -> OnnxExport:
    """The export with its MatMul/Gemm/Conv weights quantized (INT8_QUANTIZATION); where
    its weights are external data, so are the quantized model's."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    settings = {**INT8_QUANTIZATION, "weight_type": QuantType[INT8_QUANTIZATION["weight_type"]]}
    if exported.directory is not None:  # writes model.onnx.data beside model.onnx
        directory = temporary_directory()
        try:
            # onnx's checker, which the quantizer runs, refuses a data file with several
            # hard links (as the export's is while a rehearsal or a saved result shares it):
            # the quantizer reads a copy of its own.
            source = directory / "source"
            source.mkdir()
            (source / ONNX_FILE).write_bytes(exported.model_bytes)
            shutil.copyfile(exported.directory / DATA_FILE, source / DATA_FILE)
            out = directory / ONNX_FILE
            with _quiet():
                quantize_dynamic(source / ONNX_FILE, out, use_external_data_format=True, **settings)
            shutil.rmtree(source)
            if not (directory / DATA_FILE).is_file():
                raise RuntimeError(f"the quantizer wrote no {DATA_FILE} beside {ONNX_FILE}")
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        return owned_export(directory, exported)
    with tempfile.TemporaryDirectory(prefix="infertune-int8-") as tmp:
        out = Path(tmp) / "int8.onnx"
        with _quiet():
            quantize_dynamic(onnx.load_from_string(exported.model_bytes), out, **settings)
        return in_memory_export(out.read_bytes(), exported)


def static_settings_text(method: str, keep: tuple[str, ...], reduce_range: bool) -> str:
    """The static quantization's settings in words, for the report and the manifest."""
    bits = "7-bit weights (reduce_range: no VNNI here)" if reduce_range else "int8 weights"
    text = f"static int8 (QDQ): uint8 activations calibrated by {method}, {bits} per channel"
    if keep:
        text += f"; kept in float32: {', '.join(keep)}"
    return text


def layer_scopes(exported: OnnxExport) -> dict[str, list[str]]:
    """The name scopes (Keras layers: `model_1/dense_1`) of the ops static quantization
    quantizes, each with its nodes' names, in the graph's order. tf2onnx names each node
    after the TensorFlow op it came from, so the scope is the layer's in every conversion
    made from the same trace (ONNX, OpenVINO, TFLite)."""
    import onnx

    graph = onnx.load_from_string(exported.model_bytes).graph  # the graph, no external data
    scopes: dict[str, list[str]] = {}
    for node in graph.node:
        if node.op_type in _QUANTIZED_OPS and "/" in node.name:
            scopes.setdefault(node.name.rsplit("/", 1)[0], []).append(node.name)
    return scopes


def quantize_static_int8(
    exported: OnnxExport,
    feeds: list[dict[str, np.ndarray]],
    method: str = "minmax",
    keep: tuple[str, ...] = (),
    reduce_range: bool = False,
) -> OnnxExport:
    """The export statically quantized (QDQ), its activations calibrated on `feeds` (dicts
    by input name) with `method`, the name scopes in `keep` left in float32; external data
    where the export's is."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Feeds(CalibrationDataReader):
        def __init__(self) -> None:
            self._next = iter(feeds)

        def get_next(self) -> dict | None:
            return next(self._next, None)

        def rewind(self) -> None:
            self._next = iter(feeds)

    # Every node of a kept layer (its bias Add and activation too: the quantizer quantizes
    # those as well, and a quantized Relu's output would still be int8).
    graph = onnx.load_from_string(exported.model_bytes).graph
    exclude = [node.name for node in graph.node if node.name.rsplit("/", 1)[0] in keep]
    settings = dict(
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=getattr(CalibrationMethod, CALIBRATION_METHODS[method]),
        nodes_to_exclude=exclude,
        reduce_range=reduce_range,
    )
    ranges: dict = exported.derived.setdefault(_RANGES, {})
    key = (method, _digest(feeds))
    with tempfile.TemporaryDirectory(prefix="infertune-int8-static-") as tmp:
        work = Path(tmp)
        cache = work / "ranges.json"
        # onnxruntime 1.32 takes a calibration cache: it writes the ranges there, or reads
        # them where the file exists (an older one calibrates every time)
        if "calibration_cache_path" in inspect.signature(quantize_static).parameters:
            settings["calibration_cache_path"] = cache
            if key in ranges:
                cache.write_text(ranges[key])
        if exported.directory is not None:
            # The quantizer's checker refuses a data file with several hard links (as the
            # export's is while a rehearsal or a saved result shares it): a copy of its own.
            (work / ONNX_FILE).write_bytes(exported.model_bytes)
            shutil.copyfile(exported.directory / DATA_FILE, work / DATA_FILE)
            source: Any = work / ONNX_FILE
        else:
            source = onnx.load_from_string(exported.model_bytes)
        directory = temporary_directory()
        try:
            with _quiet():
                quantize_static(
                    source, directory / ONNX_FILE, Feeds(),
                    use_external_data_format=exported.directory is not None, **settings,
                )  # fmt: skip
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        if key not in ranges and cache.is_file():
            ranges[key] = cache.read_text()
    if exported.directory is not None:
        return owned_export(directory, exported)
    try:
        model_bytes = (directory / ONNX_FILE).read_bytes()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return in_memory_export(model_bytes, exported)


def _digest(feeds: list[dict[str, np.ndarray]]) -> str:
    """The calibration data's fingerprint: its arrays' names, shapes, types and bytes."""
    digest = hashlib.blake2b(digest_size=16)
    for feed in feeds:
        for name in sorted(feed):
            array = np.ascontiguousarray(feed[name])
            digest.update(f"{name}{array.shape}{array.dtype}".encode())
            if array.dtype == object:  # strings: their bytes are pointers
                digest.update(repr(array.tolist()).encode())
            else:
                digest.update(memoryview(array).cast("B"))
    return digest.hexdigest()


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The quantizer without its words: its calibrators print to stdout, and its
    `logging.warning` on the root logger installs a handler there for the rest of the
    process (basicConfig); both undone here."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    root.setLevel(logging.ERROR)
    try:
        with stdout_silenced():
            yield
    finally:
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)


def keep_pattern(scope: str) -> str:
    """A regular expression matching the names of a scope's ops and tensors in any
    conversion made from the same trace (OpenVINO op names, TFLite tensor names)."""
    return rf"(^|[/;]){re.escape(scope)}/"


def layer_errors(
    exported: OnnxExport, quantized: OnnxExport, feeds: list[dict[str, np.ndarray]]
) -> dict[str, float]:
    """The relative error each quantized layer (name scope) adds: the float32 export and its
    static int8 form run side by side on `feeds`, each layer's last output compared (the
    mean over its channels of ||q - f|| / ||f||), less the largest error of the layers
    feeding it. The
    layer's last tensor by name: the quantizer keeps the names of what it does not rewrite
    (a fused Conv + Relu writes the Relu's output; a quantized output is renamed, its
    dequantized value keeps the name). Models with external data are not ranked (their
    graphs with extra outputs would be serialized whole)."""
    import onnx
    import onnxruntime

    if exported.directory is not None or quantized.directory is not None:
        raise RuntimeError("the layers of a model past 256 MB of weights are not ranked")
    float_model = onnx.load_from_string(exported.model_bytes)
    int8_model = onnx.load_from_string(quantized.model_bytes)
    scopes = layer_scopes(exported)
    produced_int8 = {o for node in int8_model.graph.node for o in node.output}
    last: dict[str, tuple[str, str]] = {}  # scope -> its last tensor, in each model
    producer: dict[str, str] = {}  # tensor -> the scope whose node made it
    for node in float_model.graph.node:
        scope = node.name.rsplit("/", 1)[0] if "/" in node.name else ""
        for output in node.output:
            producer[output] = scope
        if scope not in scopes or not node.output:
            continue
        tensor = node.output[0]
        # Where the quantizer quantized it, its value is the dequantized one: a Conv fused
        # with its Relu writes the Relu's name before the uint8 quantization clamps it.
        dequantized = f"{tensor}_DequantizeLinear_Output"
        if dequantized in produced_int8:
            last[scope] = (tensor, dequantized)
        elif tensor in produced_int8:
            last[scope] = (tensor, tensor)
    if not last:
        return {}
    pairs = sorted(set(last.values()))
    names = ([f for f, _ in pairs], [q for _, q in pairs])
    models = [_outputs_too(m, n) for m, n in zip((float_model, int8_model), names)]
    sessions = [onnxruntime.InferenceSession(model.SerializeToString()) for model in models]
    # Per channel (axis 1 of a 4-D NCHW convolution output, else the last axis), so that one
    # channel of a huge range does not hide the others its quantization flattened.
    squares: dict[tuple[str, str], list[np.ndarray]] = {}  # [sum (q - f)^2, sum f^2]
    for feed in feeds:
        values_float = sessions[0].run(names[0], feed)
        values_int8 = sessions[1].run(names[1], feed)
        for pair, f, q in zip(pairs, values_float, values_int8):
            f64, q64 = np.asarray(f, np.float64), np.asarray(q, np.float64)
            axis = 1 if f64.ndim == 4 else f64.ndim - 1
            others = tuple(a for a in range(f64.ndim) if a != axis)
            sums = [np.sum((q64 - f64) ** 2, axis=others), np.sum(f64**2, axis=others)]
            if pair in squares:
                squares[pair] = [a + b for a, b in zip(squares[pair], sums)]
            else:
                squares[pair] = sums
    error = {}
    for scope, pair in last.items():
        diff, size = squares[pair]
        used = size > 0
        error[scope] = float(np.mean(np.sqrt(diff[used] / size[used]))) if used.any() else 0.0
    upstream = _upstream_scopes(float_model.graph, scopes, producer)
    return {
        scope: max(0.0, e - max((error.get(u, 0.0) for u in upstream.get(scope, ())), default=0.0))
        for scope, e in error.items()
    }


def _outputs_too(model: Any, tensors: list[str]) -> Any:
    """A copy of `model` with `tensors` among its outputs (float, shape left open)."""
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    present = {o.name for o in copy.graph.output}
    for tensor in tensors:
        if tensor not in present:
            copy.graph.output.append(onnx.helper.make_tensor_value_info(tensor, 1, None))
    return copy


def _upstream_scopes(
    graph: Any, scopes: dict[str, list[str]], producer: dict[str, str]
) -> dict[str, set[str]]:
    """For each quantized layer, the nearest quantized layers feeding it (through ops of no
    quantized layer: activations, pooling, reshapes)."""
    made_by = {o: node for node in graph.node for o in node.output}
    found: dict[str, set[str]] = {}
    for scope, names in scopes.items():
        first = next((n for n in graph.node if n.name == names[0]), None)
        stack, seen, near = list(first.input) if first is not None else [], set(), set()
        while stack:
            tensor = stack.pop()
            if tensor in seen:
                continue
            seen.add(tensor)
            owner = producer.get(tensor)
            if owner in scopes and owner != scope:
                near.add(owner)
                continue
            node = made_by.get(tensor)
            if node is not None:
                stack.extend(node.input)
        found[scope] = near
    return found
