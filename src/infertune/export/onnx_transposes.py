"""Transposes over axes of size 1, made transposes of the other axes alone.

tf2onnx exports Keras' attention (EinsumDense and the einsums of MultiHeadAttention) and
Conv1D through 5-D and 4-D tensors with an axis of size 1, and transposes them there. ONNX
Runtime's CPU Transpose takes a slow general path for some of those permutations: (1, 288,
1, 4, 64) to (1, 4, 1, 64, 288) took 249 us, the same data without its unit axis 25 us
(benchmarks/onnx_transposes.py). Each such Transpose becomes Squeeze (the unit axes out),
Transpose of the remaining axes in the same order, Unsqueeze (the unit axes back where the
output has them): the same values in the same order, bit for bit, at any size, zero included,
since no reshape target is computed. ONNX Runtime runs Squeeze and Unsqueeze without copying.

The shapes come from ONNX's shape inference with data propagation (a shape computed by Shape,
Gather and Concat, as tf2onnx's einsums compute theirs, is known statically), run on a copy
of the graph that holds the small constants alone: a large weight enters it as a graph input
of its shape, so that the weights are never copied here.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

__all__ = ["squeeze_unit_transposes"]

# A constant of at most this many elements keeps its values in the copy shape inference
# reads (a reshape target, a gather index); a larger one enters as an input of its shape.
_VALUES_KEPT_MAX = 64


def squeeze_unit_transposes(model: Any) -> int:
    """Rewrite, in place, every Transpose of the main graph whose input has an axis of static
    size 1 and whose other axes move; returns how many were rewritten. Where shape inference
    fails, or the graph's opset predates Squeeze's axes input (13), it is left as it is."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 13:
        return 0
    try:
        shapes = _static_shapes(model)
    except Exception as exc:  # an optimization only: the export stands without it
        logging.getLogger(__name__).debug("no shapes for the transposes: %s", exc)
        return 0
    from onnx import helper, numpy_helper

    graph = model.graph
    taken = {name for node in graph.node for name in (*node.input, *node.output)}
    taken.update(tensor.name for tensor in graph.initializer)
    nodes, rewritten = [], 0
    for node in graph.node:
        axes = _unit_axes(node, shapes)
        if axes is None:
            nodes.append(node)
            continue
        unit_in, perm = axes
        kept = [axis for axis in perm if axis not in unit_in]
        reduced_perm = [sorted(kept).index(axis) for axis in kept]
        unit_out = [index for index, axis in enumerate(perm) if axis in unit_in]
        base = _fresh(node.name or node.output[0], taken)
        squeezed, moved = f"{base}/squeezed", f"{base}/transposed"
        for name, values in ((f"{base}/in_axes", unit_in), (f"{base}/out_axes", unit_out)):
            graph.initializer.append(numpy_helper.from_array(np.array(values, np.int64), name))
        nodes += [
            helper.make_node("Squeeze", [node.input[0], f"{base}/in_axes"], [squeezed],
                             name=f"{base}/Squeeze"),
            helper.make_node("Transpose", [squeezed], [moved], name=f"{base}/Transpose",
                             perm=reduced_perm),
            helper.make_node("Unsqueeze", [moved, f"{base}/out_axes"], [node.output[0]],
                             name=f"{base}/Unsqueeze"),
        ]  # fmt: skip
        rewritten += 1
    if rewritten:
        del graph.node[:]
        graph.node.extend(nodes)
    return rewritten


def _unit_axes(node: Any, shapes: dict[str, list[int | None]]) -> tuple[list, list] | None:
    """The input's axes of static size 1 and the permutation, for a Transpose worth
    rewriting: one with a unit axis, which neither keeps the other axes in their order (ONNX
    Runtime copies the data as it is) nor moves one axis alone (its fast path for those)."""
    if node.op_type != "Transpose" or node.domain not in ("", "ai.onnx"):
        return None
    shape = shapes.get(node.input[0])
    if shape is None:
        return None
    perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
    if perm is None:
        perm = list(range(len(shape)))[::-1]
    unit = sorted(axis for axis, size in enumerate(shape) if size == 1)
    kept = [axis for axis in perm if axis not in unit]
    if not unit or len(perm) != len(shape) or kept == sorted(kept) or _moves_one(perm):
        return None
    return unit, perm


def _moves_one(perm: list[int]) -> bool:
    """Whether the permutation moves one axis and keeps the others in their order."""
    return any(
        [other for other in perm if other != axis] == sorted(set(perm) - {axis}) for axis in perm
    )


def _static_shapes(model: Any) -> dict[str, list[int | None]]:
    """Every tensor's shape shape inference finds (None for a dimension it leaves free), from
    a copy of the graph without its large constants' values."""
    import onnx

    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    graph = light.graph
    graph.node.extend(model.graph.node)
    graph.input.extend(model.graph.input)
    graph.output.extend(model.graph.output)
    for tensor in model.graph.initializer:
        if int(np.prod(tensor.dims)) <= _VALUES_KEPT_MAX and not _external(tensor):
            graph.initializer.append(tensor)
        else:
            graph.input.append(onnx.helper.make_tensor_value_info(
                tensor.name, tensor.data_type, list(tensor.dims)
            ))  # fmt: skip
    inferred = onnx.shape_inference.infer_shapes(light, data_prop=True).graph
    shapes = {}
    for info in (*inferred.value_info, *inferred.input, *inferred.output):
        tensor_type = info.type.tensor_type
        if tensor_type.HasField("shape"):
            shapes[info.name] = [
                dim.dim_value if dim.HasField("dim_value") else None
                for dim in tensor_type.shape.dim
            ]
    return shapes


def _external(tensor: Any) -> bool:
    from onnx import TensorProto

    return tensor.data_location == TensorProto.EXTERNAL


def _fresh(name: str, taken: set[str]) -> str:
    """`name`, or `name` numbered, not yet a name of the graph (its prefix of new names)."""
    base, number = name, 0
    while any(existing.startswith(f"{base}/") for existing in taken):
        number += 1
        base = f"{name}_{number}"
    taken.add(f"{base}/")
    return base
