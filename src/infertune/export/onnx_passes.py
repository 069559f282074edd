"""Exact passes over tf2onnx's ONNX graph where ONNX Runtime runs its forms slowly: each
rewrite computes the same values in the same order, bit for bit, at any size.

- **Transposes through an axis of size 1.** tf2onnx exports Keras' attention
  (MultiHeadAttention's einsums, EinsumDense) through 5-D tensors with an axis of size 1 and
  transposes them there. ONNX Runtime's CPU Transpose takes a slow general path for some of
  those permutations: (1, 288, 1, 4, 64) to (1, 4, 1, 64, 288) took 0.25 ms, the same data
  without its unit axis 0.04 ms (benchmarks/onnx_passes.py). Such a Transpose becomes Squeeze
  (the unit axes out), the Transpose of the other axes in the same order, Unsqueeze (the unit
  axes back where the output has them); ONNX Runtime runs Squeeze and Unsqueeze without
  copying, and no reshape target is computed, so a zero-sized tensor passes as before.
- **Masks broadcast before a select.** Keras' masked softmax is `where(mask, scores, -1e9)`
  with the mask broadcast to the scores' shape first (`And(Expand(True, Shape(scores)),
  mask)`, True a scalar); tf2onnx writes the select as `Cast(c) * scores + -1e9 *
  Cast(Not(c))`, so the And, the Not and both Casts run over (batch, heads, length, length).
  The condition becomes the mask itself: the products broadcast it, the sum's shape is the
  same since the scores' shape takes part in it, and each element is the same.

The transposes' shapes come from ONNX's shape inference with data propagation (a shape
computed by Shape, Gather and Concat, as tf2onnx's einsums compute theirs, is known
statically), run on a copy of the main graph whose large initializers enter as graph inputs
of their shape, so that their values are not copied. Only the main graph is rewritten; a name
a subgraph reads or makes is left as it is. New nodes keep the replaced node's name scope
(static int8 keeps a layer in float32 by its scope).
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

import numpy as np

__all__ = ["speed_up"]

# A constant of at most this many elements keeps its values in the copy shape inference
# reads (a reshape target, a gather index); a larger one enters as an input of its shape.
_VALUES_KEPT_MAX = 64

# What the transposes pass names after a Transpose's name, for the tensors and nodes it makes.
_NEW_NAMES = ("_squeezed", "_transposed", "_in_axes", "_out_axes", "_squeeze", "_unsqueeze")

_DEFAULT_DOMAINS = ("", "ai.onnx")


def speed_up(model: Any) -> dict[str, int]:
    """Every pass, in place; returns how many nodes each rewrote. A pass that fails to read
    the graph leaves it as it was: they are optimizations, the export stands without them."""
    done = {}
    for name, rewrite in (("transposes", squeeze_unit_transposes), ("masks", narrow_select_masks)):
        try:
            done[name] = rewrite(model)
        except Exception as exc:
            logging.getLogger(__name__).debug("the %s pass failed: %s", name, exc)
            done[name] = 0
    return done


def squeeze_unit_transposes(model: Any) -> int:
    """Rewrite every Transpose of the main graph whose input has an axis of static size 1,
    unless ONNX Runtime has a fast path for it; returns how many were rewritten. Nothing on an
    opset before 13 (Squeeze's axes an attribute) or where shape inference fails."""
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS), 0)
    if opset < 13 or model.functions or not any(n.op_type == "Transpose" for n in graph.node):
        return 0
    try:
        shapes = _static_shapes(model)
    except Exception as exc:
        logging.getLogger(__name__).debug("no shapes for the transposes: %s", exc)
        return 0
    from onnx import helper, numpy_helper

    planned = [(index, _unit_axes(node, shapes)) for index, node in enumerate(graph.node)]
    planned = [(index, axes) for index, axes in planned if axes is not None]
    if not planned:
        return 0
    taken = _names(graph)
    nodes = list(graph.node)
    for index, (unit_in, perm) in planned:
        node = nodes[index]
        reduced_perm, unit_out = squeezed_permutation(perm, unit_in)
        base = _fresh(node.name or node.output[0], taken)
        for suffix, values in (("_in_axes", unit_in), ("_out_axes", unit_out)):
            axes = numpy_helper.from_array(np.array(values, np.int64), base + suffix)
            graph.initializer.append(axes)
        nodes[index] = [
            helper.make_node("Squeeze", [node.input[0], base + "_in_axes"],
                             [base + "_squeezed"], name=base + "_squeeze"),
            helper.make_node("Transpose", [base + "_squeezed"], [base + "_transposed"],
                             name=node.name or base, perm=reduced_perm),
            helper.make_node("Unsqueeze", [base + "_transposed", base + "_out_axes"],
                             [node.output[0]], name=base + "_unsqueeze"),
        ]  # fmt: skip
    rewritten = [n for item in nodes for n in (item if isinstance(item, list) else [item])]
    del graph.node[:]
    graph.node.extend(rewritten)
    return len(planned)


def squeezed_permutation(perm: list[int], unit: list[int]) -> tuple[list[int], list[int]]:
    """For `perm` over a tensor whose axes `unit` (sorted) have size 1: the permutation of the
    tensor with those axes squeezed out, and the output's axes to unsqueeze after it."""
    kept = [axis for axis in perm if axis not in unit]
    order = sorted(kept)  # the squeezed tensor's axes, in the original's order
    return [order.index(axis) for axis in kept], [i for i, axis in enumerate(perm) if axis in unit]


def _unit_axes(node: Any, shapes: dict[str, list[int | None]]) -> tuple[list, list] | None:
    """The input's axes of static size 1 and the permutation, for a Transpose worth
    rewriting: one with a unit axis, which neither keeps the other axes in their order (ONNX
    Runtime copies the data as it is) nor moves one axis alone (its fast path for those)."""
    if node.op_type != "Transpose" or node.domain not in _DEFAULT_DOMAINS:
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
    were rewritten. Every select is found before any is rewritten."""
    graph = model.graph
    wiring = _Wiring(graph)
    selects = [s for s in map(wiring.select, graph.node) if s is not None]
    for select in selects:
        for node in (select.cast, select.negation):
            node.input[0] = select.mask
            wiring.readers[select.mask].append(node)
            wiring.readers[select.condition].remove(node)
    if selects:
        narrowed = {name for s in selects for node in s.narrowed for name in node.output}
        dropped = wiring.drop_unread([s.condition for s in selects])
        kept_info = [i for i in graph.value_info if i.name not in narrowed | dropped]
        if len(kept_info) != len(graph.value_info):  # their declared shapes would be wrong
            del graph.value_info[:]
            graph.value_info.extend(kept_info)
    return len(selects)


class _Select(NamedTuple):
    """A select `narrow_select_masks` rewrites: the mask, the Cast and the Not that read the
    condition, the condition, and the nodes whose outputs change shape."""

    mask: str
    cast: Any
    negation: Any
    condition: str
    narrowed: tuple


class _Wiring:
    """The main graph's wiring: each tensor's producer and readers, the names to leave as they
    are (graph inputs and outputs, what subgraphs read or make), the initializers."""

    def __init__(self, graph: Any) -> None:
        self.graph = graph
        self.producer = {name: node for node in graph.node for name in node.output}
        self.readers: dict[str, list[Any]] = {}
        for node in graph.node:
            for name in node.input:
                self.readers.setdefault(name, []).append(node)
        self.kept = {t.name for t in (*graph.output, *graph.input)} | _subgraph_names(graph)
        self.constants = {tensor.name: tensor for tensor in graph.initializer}

    def made_by(self, name: str, op_type: str) -> Any:
        node = self.producer.get(name)
        if node is None or node.op_type != op_type or node.domain not in _DEFAULT_DOMAINS:
            return None
        return node

    def only_reader(self, node: Any, reader: Any) -> bool:
        """Whether `reader` alone reads `node`'s outputs, none of them kept."""
        return all(
            name not in self.kept and all(r is reader for r in self.readers.get(name, ()))
            for name in node.output
        )

    def true_scalar(self, name: str) -> bool:
        """Whether `name` is a constant scalar True that no caller can feed."""
        from onnx import TensorProto, numpy_helper

        if name in self.kept:  # an initializer that is also a graph input: a default
            return False
        tensor = self.constants.get(name)
        node = self.made_by(name, "Constant")
        if tensor is None and node is not None:
            tensor = next((a.t for a in node.attribute if a.name == "value"), None)
        if tensor is None or tensor.data_type != TensorProto.BOOL or list(tensor.dims):
            return False
        return not _external(tensor) and bool(numpy_helper.to_array(tensor))

    def select(self, add: Any) -> _Select | None:
        """The select `add` ends, where it is tf2onnx's `Cast(c) * x + y * Cast(Not(c))` (its
        Select handler keeps this form over Where for speed) with c = And(Expand(True,
        Shape(t)), mask), t one of x and y; None for anything else, or where a tensor whose
        shape changes is read elsewhere."""
        if add.op_type != "Add" or add.domain not in _DEFAULT_DOMAINS or len(add.input) != 2:
            return None
        products = [self.made_by(name, "Mul") for name in add.input]
        if any(p is None or not self.only_reader(p, add) for p in products):
            return None
        for positive, negative in (products, products[::-1]):
            cast, x = self._cast_factor(positive)
            negative_cast, y = self._cast_factor(negative)
            if cast is None or negative_cast is None:
                continue
            negation = self.made_by(negative_cast.input[0], "Not")
            condition = cast.input[0]
            if negation is None or negation.input[0] != condition:
                continue
            if not self.only_reader(negation, negative_cast):
                continue
            mask = self._broadcast_mask(self.made_by(condition, "And"), {x, y})
            if mask is not None:
                narrowed = (cast, negation, negative_cast, *products)
                return _Select(mask, cast, negation, condition, narrowed)
        return None

    def _cast_factor(self, product: Any) -> tuple[Any, str | None]:
        """(the Cast, the other factor) where a factor of `product` is a Cast it alone reads."""
        for index in (0, 1):
            cast = self.made_by(product.input[index], "Cast")
            if cast is not None and self.only_reader(cast, product):
                return cast, product.input[1 - index]
        return None, None

    def _broadcast_mask(self, node: Any, values: set[str | None]) -> str | None:
        """`mask` where `node` is And(Expand(True, Shape(t)), mask) (either order), the shape
        read through Casts, t one of `values`."""
        if node is None:
            return None
        for index in (0, 1):
            expand = self.made_by(node.input[index], "Expand")
            if expand is None or not self.true_scalar(expand.input[0]):
                continue
            shape = self.producer.get(expand.input[1])
            while shape is not None and shape.op_type == "Cast":
                shape = self.producer.get(shape.input[0])
            whole = shape is not None and shape.op_type == "Shape" and not shape.attribute
            if whole and shape.domain in _DEFAULT_DOMAINS and shape.input[0] in values:
                return node.input[1 - index]
        return None

    def drop_unread(self, names: list[str]) -> set[str]:
        """Remove the producers of `names` where nothing reads them any more, and so on up,
        and the initializers only they read; returns the names of the outputs removed."""
        dropped: dict[int, Any] = {}
        freed: set[str] = set()  # what the dropped nodes read
        stack = [self.producer.get(name) for name in names]
        while stack:
            node = stack.pop()
            if node is None or id(node) in dropped:
                continue
            if any(self.readers.get(name) or name in self.kept for name in node.output):
                continue
            dropped[id(node)] = node
            for name in node.input:
                self.readers[name].remove(node)
                freed.add(name)
                stack.append(self.producer.get(name))
        nodes = [node for node in self.graph.node if id(node) not in dropped]
        del self.graph.node[:]
        self.graph.node.extend(nodes)
        unread = {
            name
            for name in freed & self.constants.keys()
            if not self.readers.get(name) and name not in self.kept
        }
        initializers = self.graph.initializer
        for index in reversed(range(len(initializers))):  # no copy of the others
            if initializers[index].name in unread:
                del initializers[index]
        return {name for node in dropped.values() for name in node.output}


def _subgraphs(graph: Any) -> list[Any]:
    """Every subgraph of the graph's nodes (If, Loop, Scan bodies), nested ones included."""
    from onnx import AttributeProto

    found, stack = [], [graph]
    while stack:
        for node in stack.pop().node:
            for attribute in node.attribute:
                if attribute.type == AttributeProto.GRAPH:
                    found.append(attribute.g)
                    stack.append(attribute.g)
                elif attribute.type == AttributeProto.GRAPHS:
                    found.extend(attribute.graphs)
                    stack.extend(attribute.graphs)
    return found


def _subgraph_names(graph: Any) -> set[str]:
    """Every name a subgraph reads, makes or returns (an outer name among them)."""
    names: set[str] = set()
    for body in _subgraphs(graph):
        names.update(t.name for t in (*body.input, *body.output, *body.initializer))
        for node in body.node:
            names.update((node.name, *node.input, *node.output))
    return names


def _names(graph: Any) -> set[str]:
    """Every name of the graph: nodes, tensors, initializers, subgraphs' names."""
    names = {name for node in graph.node for name in (node.name, *node.input, *node.output)}
    names.update(t.name for t in (*graph.input, *graph.output, *graph.initializer))
    names.update(t.values.name for t in graph.sparse_initializer)
    return names | _subgraph_names(graph)


def _static_shapes(model: Any) -> dict[str, list[int | None]]:
    """Every tensor's shape shape inference finds (None for a dimension it leaves free), from
    a copy of the main graph without its large initializers' values. The graph's outputs enter
    without their declared shapes, which ONNX Runtime does not hold a graph to."""
    import onnx

    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    graph = light.graph
    graph.node.extend(model.graph.node)
    graph.input.extend(model.graph.input)
    inputs = {t.name for t in model.graph.input}
    for output in model.graph.output:
        element = output.type.tensor_type.elem_type
        graph.output.append(onnx.helper.make_tensor_value_info(output.name, element, None))
    for tensor in model.graph.initializer:
        if tensor.name in inputs:  # a default a caller may override: its value unknown
            continue
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
    """`name`, or `name` numbered, such that none of the names made from it (`_NEW_NAMES`
    appended) is taken; those names are taken from then on."""
    base, number = name, 0
    while any(base + suffix in taken for suffix in _NEW_NAMES):
        number += 1
        base = f"{name}_{number}"
    taken.update(base + suffix for suffix in _NEW_NAMES)
    return base
