"""TensorFlow/Keras -> ONNX, done once per optimize() and shared by every ONNX-based backend.

tf2onnx's `from_keras` fails on Keras 3 models (KeyError 'keras_tensor_N', tf2onnx #2448),
so the model is traced as a tf.function of flat inputs and converted with `from_function`,
which works for Keras 3, tf_keras, tf.Module and SavedModel functions alike.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from ..models import tensor_specs
from ..target import Target

__all__ = ["OnnxExport", "export_onnx", "OPSET", "ONNX_FILE", "read_onnx", "write_onnx"]

OPSET = 17
ONNX_FILE = "model.onnx"  # the saved artifact of every ONNX-based candidate (Triton's name too)


@dataclass(frozen=True)
class OnnxExport:
    """A serialized ONNX model and the names of its inputs and outputs, in signature order."""

    model_bytes: bytes
    input_names: list[str]
    output_names: list[str]
    seconds: float
    opset: int


def export_onnx(target: Target) -> OnnxExport:
    """The model as ONNX, converted on first use and shared through `target`."""
    return target.shared("onnx", lambda: _convert(target))


def write_onnx(directory: Path, model_bytes: bytes, exported: OnnxExport) -> dict:
    """Save an ONNX-based candidate's model (the export, or its int8 form) as model.onnx;
    return the settings `read_onnx` needs."""
    (directory / ONNX_FILE).write_bytes(model_bytes)
    return {
        "file": ONNX_FILE,
        "input_names": list(exported.input_names),
        "output_names": list(exported.output_names),
        "opset": exported.opset,
    }


def read_onnx(directory: Path, settings: dict) -> OnnxExport:
    """The export back from a saved model.onnx, to preload as the "onnx" shared conversion."""
    return OnnxExport(
        model_bytes=(directory / settings["file"]).read_bytes(),
        input_names=list(settings["input_names"]),
        output_names=list(settings["output_names"]),
        seconds=0.0,
        opset=settings["opset"],
    )


def _convert(target: Target) -> OnnxExport:
    import tensorflow as tf
    import tf2onnx

    from . import tf2onnx_ops  # noqa: F401  (registers the conversions tf2onnx lacks)

    logging.getLogger("tf2onnx").setLevel(logging.ERROR)  # its INFO lines drown progress
    start = time.perf_counter()
    specs = tensor_specs(target.signature)
    function = tf.function(target.source.graph_function(target.signature), input_signature=specs)
    model_proto, _ = tf2onnx.convert.from_function(function, input_signature=specs, opset=OPSET)
    input_names = [node.name for node in model_proto.graph.input]
    output_names = [node.name for node in model_proto.graph.output]
    expected_inputs = [spec.name for spec in specs]
    if input_names != expected_inputs:
        raise RuntimeError(
            f"ONNX inputs {input_names} do not match the signature {expected_inputs}"
        )
    if len(output_names) != len(target.output_dtypes):
        raise RuntimeError(
            f"ONNX graph has {len(output_names)} outputs, the model {len(target.output_dtypes)}"
        )
    return OnnxExport(
        model_bytes=model_proto.SerializeToString(),
        input_names=input_names,
        output_names=output_names,
        seconds=time.perf_counter() - start,
        opset=OPSET,
    )
