"""Exact passes over tf2onnx's ONNX graph where ONNX Runtime runs its forms slowly: each
rewrite computes the same values in the same order, bit for bit, at any size.

- **Transposes through an axis of size 1.** tf2onnx exports Keras' attention
  (MultiHeadAttention's einsums, EinsumDense) through 5-D tensors with an axis of size 1 and
  transposes them there. ONNX Runtime's CPU Transpose takes a slow general path for some of
  those permutations: (1, 288, 1, 4, 64) to (1, 4, 1, 64, 288) took 0.28 ms, the same data
  without its unit axis 0.04 ms (benchmarks/onnx_passes.py). Such a Transpose becomes Squeeze
  (the unit axes out), the Transpose of the other axes in the same order, Unsqueeze (the unit
  axes back where the output has them); ONNX Runtime runs Squeeze and Unsqueeze without
  copying, and no reshape target is computed, so a zero-sized tensor passes as before.
- **Masks broadcast before a select.** Keras' masked softmax is `where(mask, scores, -1e9)`
  with the mask broadcast to the scores' shape first (`And(Expand(True, Shape(scores)),
  mask)`); tf2onnx writes the select as `Cast(c) * scores + -1e9 * Cast(Not(c))`, so the
  And, the Not and both Casts run over (batch, heads, length, length). The condition becomes
  the mask itself: the products broadcast it, the sum's shape is the same since the scores'
  shape takes part in it, and each element is the same.

The transposes' shapes come from ONNX's shape inference with data propagation (a shape
computed by Shape, Gather and Concat, as tf2onnx's einsums compute theirs, is known
statically), run on a copy of the graph that holds the small constants alone: a large weight
enters it as a graph input of its shape, so the weights are never copied here. Only the
main graph is rewritten; a name a subgraph reads is left as it is.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

__all__ = ["speed_up"]

# A constant of at most this many elements keeps its values in the copy shape inference
# reads (a reshape target, a gather index); a larger one enters as an input of its shape.
_VALUES_KEPT_MAX = 64

# The names the transposes pass makes for each Transpose, after its name and a slash.
_NEW_NAMES = ("squeezed", "transposed", "in_axes", "out_axes", "Squeeze", "Transpose", "Unsqueeze")


def speed_up(model: Any) -> dict[str, int]:
    """Every pass, in place, on an export of opset 13 or later (Squeeze's axes an input);
    returns how many nodes each rewrote."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 13:
        return {}
    return {"transposes": squeeze_unit_transposes(model), "masks": narrow_select_masks(model)}


def squeeze_unit_transposes(model: Any) -> int:
    """Rewrite every Transpose of the main graph whose input has an axis of static size 1,
    unless ONNX Runtime has a fast path for it; returns how many were rewritten. Where shape
    inference fails, the graph is left as it is."""
    try:
        shapes = _static_shapes(model)
    except Exception as exc:  # an optimization only: the export stands without it
        logging.getLogger(__name__).debug("no shapes for the transposes: %s", exc)
        return 0
    from onnx import helper, numpy_helper

    graph = model.graph
    taken = {name for node in graph.node for name in (node.name, *node.input, *node.output)}
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


def narrow_select_masks(model: Any) -> int:
    """Rewrite every select of tf2onnx's form whose condition is a mask broadcast to one of
    its values' shape, so that the condition stays at the mask's shape; returns how many
    were rewritten."""
    graph = model.graph
    producer = {name: node for node in graph.node for name in node.output}
    readers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    kept = {t.name for t in (*graph.output, *graph.input)} | _read_by_subgraphs(graph)
    constants = {tensor.name: tensor for tensor in graph.initializer}
    graph_of = _Graph(producer, readers, kept, constants)
    unread = []
    for add in list(graph.node):
        select = _select(add, graph_of)
        if select is None:
            continue
        mask, cast, negation, condition = select
        for node in (cast, negation):
            node.input[0] = mask
            readers[mask].append(node)
            readers[condition].remove(node)
        unread.append(condition)
    if unread:
        _drop_unread(graph, unread, graph_of)
    return len(unread)


class _Graph:
    """What the select pass reads of the graph: each tensor's producer and readers, the
    names to keep as they are (its inputs and outputs, what subgraphs read), the
    initializers."""

    def __init__(self, producer: dict, readers: dict, kept: set[str], constants: dict) -> None:
        self.producer, self.readers, self.kept, self.constants = (
            producer, readers, kept, constants,
        )  # fmt: skip

    def made_by(self, name: str, op_type: str) -> Any:
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op_type else None

    def only_reader(self, node: Any, reader: Any) -> bool:
        """Whether `reader` alone reads `node`'s outputs, none of them kept."""
        return all(
            name not in self.kept and all(r is reader for r in self.readers.get(name, ()))
            for name in node.output
        )

    def all_true(self, name: str) -> bool:
        from onnx import TensorProto, numpy_helper

        tensor = self.constants.get(name)
        node = self.made_by(name, "Constant")
        if tensor is None and node is not None:
            tensor = next((a.t for a in node.attribute if a.name == "value"), None)
        if tensor is None or tensor.data_type != TensorProto.BOOL or _external(tensor):
            return False
        return bool(numpy_helper.to_array(tensor).all())


def _select(add: Any, graph: _Graph) -> tuple | None:
    """(the mask, the Cast and the Not that read the condition, the condition) where `add` is
    tf2onnx's select `Cast(c) * x + y * Cast(Not(c))` (its Select handler keeps this form
    over Where for speed) with c = And(Expand(True, Shape(t)), mask), t one of x and y. None
    for anything else, or where a tensor whose shape changes is read elsewhere."""
    if add.op_type != "Add" or len(add.input) != 2:
        return None
    products = [graph.made_by(name, "Mul") for name in add.input]
    if any(p is None or not graph.only_reader(p, add) for p in products):
        return None
    for positive, negative in (products, products[::-1]):
        cast, x = _cast_factor(positive, graph)
        negative_cast, y = _cast_factor(negative, graph)
        if cast is None or negative_cast is None:
            continue
        negation = graph.made_by(negative_cast.input[0], "Not")
        condition = cast.input[0]
        if negation is None or negation.input[0] != condition:
            continue
        if not graph.only_reader(negation, negative_cast):
            continue
        mask = _broadcast_mask(graph.made_by(condition, "And"), {x, y}, graph)
        if mask is not None:
            return mask, cast, negation, condition
    return None


def _cast_factor(product: Any, graph: _Graph) -> tuple[Any, str | None]:
    """(the Cast, the other factor) where a factor of `product` is a Cast it alone reads."""
    for index in (0, 1):
        cast = graph.made_by(product.input[index], "Cast")
        if cast is not None and graph.only_reader(cast, product):
            return cast, product.input[1 - index]
    return None, None


def _broadcast_mask(node: Any, values: set[str | None], graph: _Graph) -> str | None:
    """`mask` where `node` is And(Expand(True, Shape(t)), mask) (either order), the shape read
    through Casts, t one of `values`."""
    if node is None:
        return None
    for index in (0, 1):
        expand = graph.made_by(node.input[index], "Expand")
        if expand is None or not graph.all_true(expand.input[0]):
            continue
        shape = graph.producer.get(expand.input[1])
        while shape is not None and shape.op_type == "Cast":
            shape = graph.producer.get(shape.input[0])
        whole = shape is not None and shape.op_type == "Shape" and not shape.attribute
        if whole and shape.input[0] in values:
            return node.input[1 - index]
    return None


def _drop_unread(graph_proto: Any, names: list[str], graph: _Graph) -> None:
    """Remove the producers of `names` where nothing reads them any more, and so on up; and
    the initializers they alone read."""
    dropped: set[int] = set()
    freed: set[str] = set()  # what the dropped nodes read
    stack = [graph.producer.get(name) for name in names]
    while stack:
        node = stack.pop()
        if node is None or id(node) in dropped:
            continue
        if any(graph.readers.get(name) or name in graph.kept for name in node.output):
            continue
        dropped.add(id(node))
        for name in node.input:
            graph.readers[name].remove(node)
            freed.add(name)
            stack.append(graph.producer.get(name))
    nodes = [node for node in graph_proto.node if id(node) not in dropped]
    del graph_proto.node[:]
    graph_proto.node.extend(nodes)
    unread = {
        name
        for name in freed & graph.constants.keys()
        if not graph.readers.get(name) and name not in graph.kept
    }
    for index in reversed(range(len(graph_proto.initializer))):  # no copy of the others
        if graph_proto.initializer[index].name in unread:
            del graph_proto.initializer[index]


def _read_by_subgraphs(graph: Any) -> set[str]:
    """Every name a node inside a subgraph (If, Loop, Scan bodies) reads."""
    names: set[str] = set()
    stack = [a.g for node in graph.node for a in node.attribute if a.g.node]
    stack += [g for node in graph.node for a in node.attribute for g in a.graphs]
    while stack:
        body = stack.pop()
        for node in body.node:
            names.update(node.input)
            stack += [a.g for a in node.attribute if a.g.node]
            stack += [g for a in node.attribute for g in a.graphs]
    return names


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
    """`name`, or `name` numbered, such that none of the names the transposes pass makes from
    it (`_NEW_NAMES` after a slash) is taken; those names are taken from then on."""
    base, number = name, 0
    while any(f"{base}/{suffix}" in taken for suffix in _NEW_NAMES):
        number += 1
        base = f"{name}_{number}"
    taken.update(f"{base}/{suffix}" for suffix in _NEW_NAMES)
    return base
