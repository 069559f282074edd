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
gate. Layers kept in float32 (`keep`: name scopes, see precision/layers.py `layer_scopes`) are
left out of the quantization, with their inputs dequantized.

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
