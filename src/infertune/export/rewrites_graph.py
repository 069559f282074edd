"""The frozen GraphDef as the exact rewrites (export/rewrites.py) edit it: its nodes by name,
the static shapes and constant values of its tensors, new nodes added under fresh names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["Graph", "Rewriter", "held_apart", "node_name", "tensor_name"]


class Graph:
    """A GraphDef being rewritten: its nodes by name (copies; the original is left as it
    was), with the static shapes of its tensors."""

    def __init__(self, graph_def: Any) -> None:
        import tensorflow as tf

        self._original = graph_def
        self.nodes: dict[str, Any] = {}
        for node in graph_def.node:
            self.nodes[node.name] = copy = tf.compat.v1.NodeDef()
            copy.CopyFrom(node)
        self._tf = tf.Graph()
        with self._tf.as_default():
            tf.import_graph_def(graph_def, name="")

    def graph_def(self) -> Any:
        """The rewritten GraphDef: the original's library and versions, the nodes as now."""
        import tensorflow as tf

        rewritten = tf.compat.v1.GraphDef()
        rewritten.library.CopyFrom(self._original.library)
        rewritten.versions.CopyFrom(self._original.versions)
        rewritten.node.extend(self.nodes.values())
        return rewritten

    def shape(self, tensor: str) -> list[int | None] | None:
        """The tensor's static shape (None for an unknown dimension), None if its rank is."""
        shape = self._tf.get_tensor_by_name(tensor_name(tensor)).shape
        return None if shape.rank is None else shape.as_list()

    def constant(self, tensor: str) -> np.ndarray | None:
        """The tensor's value where a Const node produces it, else None."""
        import tensorflow as tf

        node = self.nodes.get(node_name(tensor))
        if node is None or node.op != "Const" or held_apart(node):
            return None
        return tf.make_ndarray(node.attr["value"].tensor)

    def value(self, tensor: str) -> np.ndarray | None:
        """The tensor's value where it depends on no input of the graph (a Const, or ops on
        constants that no grappler folded: TFLite's converter freezes without it), else
        None."""
        import tensorflow as tf

        constant = self.constant(tensor)
        if constant is not None:
            return constant
        seen, stack = set(), [node_name(tensor)]
        while stack:
            node = self.nodes.get(stack.pop())
            if node is None or node.op in ("Placeholder", "PlaceholderWithDefault"):
                return None
            if node.name in seen:
                continue
            seen.add(node.name)
            if node.op.startswith(("Random", "Stateful", "Stateless")) or "Variable" in node.op:
                return None
            if held_apart(node):  # its value is not in the graph
                return None
            stack.extend(node_name(t) for t in node.input)
        with tf.compat.v1.Session(graph=self._tf) as session:
            return session.run(tensor_name(tensor))

    def consumers(self, name: str) -> list[Any]:
        """Every node with a data input that reads one of `name`'s outputs."""
        return [
            node
            for node in self.nodes.values()
            if any(not t.startswith("^") and node_name(t) == name for t in node.input)
        ]

    def add(self, name: str, op: str, inputs: list[str], **attrs: Any) -> str:
        """A new node, its name returned: `name`, or with a number added where a node has it
        already; attrs as TensorFlow DTypes, ints, bools or numpy arrays (a tensor)."""
        import tensorflow as tf

        base, number = name, 0
        while name in self.nodes:
            number += 1
            name = f"{base}_{number}"
        node = tf.compat.v1.NodeDef(name=name, op=op, input=inputs)
        for key, value in attrs.items():
            if isinstance(value, tf.DType):
                node.attr[key].type = value.as_datatype_enum
            elif isinstance(value, bool):
                node.attr[key].b = value
            elif isinstance(value, int):
                node.attr[key].i = value
            else:
                node.attr[key].tensor.CopyFrom(tf.make_tensor_proto(value))
        self.nodes[name] = node
        return name

    def const(self, name: str, value: np.ndarray) -> str:
        import tensorflow as tf

        return self.add(name, "Const", [], dtype=tf.as_dtype(value.dtype), value=value)

    def remove(self, node: Any) -> None:
        del self.nodes[node.name]


def node_name(tensor: str) -> str:
    """The node a tensor or input names (`scope/op:1`, `^scope/op`: `scope/op`)."""
    return tensor.lstrip("^").split(":")[0]


def tensor_name(tensor: str) -> str:
    """A tensor's full name, with its output number (`scope/op`: `scope/op:0`)."""
    return tensor if ":" in tensor else f"{tensor}:0"


def held_apart(node: Any) -> bool:
    """Whether a Const node's weight was held apart while the graph was frozen (the ONNX
    export's lean path, export/onnx_freeze.py `_weights_apart`): its TensorProto has the
    weight's dtype and shape, a negative `version_number` as the mark, and no value."""
    return node.op == "Const" and node.attr["value"].tensor.version_number < 0


# A rewriter replaces one node where it can and returns (the ops it replaced, what they
# became), in words for the report; None where it leaves the node as it is.
Rewriter = Callable[[Graph, Any], "tuple[str, str] | None"]
