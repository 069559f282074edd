"""The ONNX export in float16 ("onnx-fp16"): what ONNX Runtime's CUDA provider runs for
`onnxruntime-cuda-fp16` (backends/onnxruntime/cuda.py) and a strongly typed TensorRT (11 and
later) builds its fp16 engine from (backends/tensorrt/engine.py)."""

from __future__ import annotations

from .onnx import OnnxExport, in_memory_export

__all__ = ["FLOAT16_TEXT", "float16_export", "float16_onnx"]

# How the float16 graph is made, in words (a report's and a manifest's precision note).
FLOAT16_TEXT = (
    "weights and arithmetic in float16, inputs and outputs float32 "
    "(onnxruntime.transformers.float16, its block list of operators kept in float32)"
)


def float16_onnx(model_bytes: bytes) -> bytes:
    """The ONNX model with float32 weights and arithmetic in float16, its inputs and outputs
    still float32 (Casts at the edges), by onnxruntime.transformers.float16 (shipped with
    onnxruntime and onnxruntime-gpu). Operators ONNX Runtime's converter keeps in float32
    (its default block list) stay so."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load_from_string(model_bytes)
    converted = convert_float_to_float16(model, keep_io_types=True)
    return converted.SerializeToString()


def float16_export(exported: OnnxExport) -> OnnxExport:
    """The shared export's float16 form, with the export's input and output names; nothing
    derived from the float32 export is its own. Not done where the weights are external data
    (past protobuf's 2 GB: the converter reads the model as one message)."""
    if exported.directory is not None:
        raise RuntimeError(
            "the model's weights are ONNX external data (past protobuf's 2 GB), which the "
            "float16 conversion (onnxruntime.transformers.float16, from bytes) does not read"
        )
    return in_memory_export(float16_onnx(exported.model_bytes), exported)
