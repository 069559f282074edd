"""The ONNX export in float16 ("onnx-fp16"): what a strongly typed TensorRT (11 and later)
builds its fp16 engine from (backends/tensorrt.py)."""

from __future__ import annotations

from .onnx import OnnxExport

__all__ = ["float16_onnx", "float16_export"]


def float16_onnx(model_bytes: bytes) -> bytes:
    """The ONNX model with float32 weights and arithmetic in float16, its inputs and outputs
    still float32 (Casts at the edges), by onnxruntime.transformers.float16 (shipped with
    onnxruntime and onnxruntime-gpu): what a strongly typed TensorRT builds fp16 from.
    Operators ONNX Runtime's converter keeps in float32 (its default block list) stay so."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load_from_string(model_bytes)
    converted = convert_float_to_float16(model, keep_io_types=True)
    return converted.SerializeToString()


def float16_export(exported: OnnxExport) -> bytes:
    """The shared export's float16 form (its weights inside the model: a TensorRT candidate
    parses bytes)."""
    return float16_onnx(exported.model_bytes)
