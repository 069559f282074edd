"""Reduced precision's layers, shared by every runtime's int8: the name scopes (Keras layers)
a quantization can keep in float32 (`layer_scopes`), the pattern that finds a scope's ops and
tensors in any conversion made from the same trace (`keep_pattern`: OpenVINO's op names,
TFLite's tensor names), and the error each quantized layer adds (`layer_errors`), which ranks
the layers the search keeps in float32 (pipeline/precision.py).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ..export.onnx import OnnxExport

__all__ = ["keep_pattern", "layer_errors", "layer_scopes"]

# Ops whose weights static quantization makes int8 (the arithmetic of a model).
_QUANTIZED_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")


def keep_pattern(scope: str) -> str:
    """A regular expression matching the names of a scope's ops and tensors in any
    conversion made from the same trace (OpenVINO op names, TFLite tensor names)."""
    return rf"(^|[/;]){re.escape(scope)}/"


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
