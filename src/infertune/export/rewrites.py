"""Exact rewrites: TensorFlow ops a converter rejects, replaced in the frozen graph by ops it
converts that compute the same function.

Each rewrite works on the frozen GraphDef a conversion starts from (the ONNX export's after
grappler, the TFLite converter's after freezing), top-level nodes only: the replacement
takes the rejected node's name, so its consumers read the new value unchanged, and nodes
left without consumers are pruned by the converter. Each one returns a note for the report
("DenseBincount at ... rewritten as OneHot + Max"); every candidate built from a rewritten
graph is still verified against the model like any other.

- **DenseBincount** (`CategoryEncoding(output_mode="multi_hot" | "count")`,
  `tf.math.bincount` on a dense tensor of rank 1 or 2), for TFLite, whose converter has no
  builtin for it, and for ONNX where it has weights (`CategoryEncoding`'s `count_weights`),
  which tf2onnx's handler refuses: `one_hot(x, size)` (each row times its weight) reduced
  over the values' axis, with Max for binary output (multi-hot) and Sum for counts. Values
  outside [0, size) are ignored by both (one_hot gives a row of zeros); integer counts are
  exact in float32 below 2**24, weighted sums differ by the order of the additions only.
- **RFFT -> ComplexAbs / Real / Imag** (`tf.abs(tf.signal.stft(...))`, `tf.signal.rfft`),
  for ONNX: tf2onnx converts RFFT only into a real tensor with a leading (real, imaginary)
  axis and its ComplexAbs handler refuses that tensor whenever its shape is not fully
  known (`ComplexAbs expected the first dimension to be 2 but shape is [-1, -1, -1, -1]`,
  a free batch). The rewrite is the discrete Fourier transform as two matrix products with
  constant cosine and sine matrices (what tf2onnx's RFFT handler computes too), and
  |z| = sqrt(re^2 + im^2). Only where the transformed axis has a static length and
  fft_length is a constant, and where every consumer of the RFFT is one of those three ops.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

__all__ = ["rewrite_for_onnx", "rewrite_for_tflite", "rewriting_for_tflite"]


def rewrite_for_onnx(graph_def: Any) -> tuple[Any, list[str]]:
    """The graph with the ops tf2onnx cannot convert rewritten, and a note for each rewrite
    (the graph itself where none applies)."""
    rewriters = {"RFFT": _rfft, "DenseBincount": partial(_dense_bincount, weighted_only=True)}
    return _rewrite(graph_def, rewriters, "ONNX")


def rewrite_for_tflite(graph_def: Any) -> tuple[Any, list[str]]:
    """The graph with the ops the TFLite converter has no builtin for rewritten, and a note
    for each rewrite (the graph itself where none applies)."""
    return _rewrite(graph_def, {"DenseBincount": _dense_bincount}, "TFLite")


def rewriting_for_tflite(freeze: Callable[[], tuple], notes: list[str]) -> Callable[[], tuple]:
    """A TFLite converter's `_freeze_concrete_function` whose frozen graph is rewritten, each
    rewrite's note added to `notes`. (Its fourth value, a ConcreteFunction rebuilt from the
    graph before the rewrite where TensorFlow's own freezing ran, feeds only grappler, which
    the converter runs with select TensorFlow ops, never with builtin ops alone.)"""

    def frozen() -> tuple:
        graph_def, *rest = freeze()
        graph_def, done = rewrite_for_tflite(graph_def)
        notes.extend(done)
        return (graph_def, *rest)

    return frozen


# A rewriter replaces one node where it can and returns (the ops it replaced, what they
# became), in words for the report; None where it leaves the node as it is.
Rewriter = Callable[["_Graph", Any], "tuple[str, str] | None"]


def _rewrite(graph_def: Any, rewriters: dict[str, Rewriter], converter: str) -> tuple[Any, list]:
    if not any(node.op in rewriters for node in graph_def.node):
        return graph_def, []  # the common case: no copy, no import
    graph = _Graph(graph_def)
    done: dict[tuple[str, str], list[str]] = {}  # (ops, what they became) -> node names
    for node in list(graph.nodes.values()):
        rewriter = rewriters.get(node.op)
        rewritten = rewriter(graph, node) if rewriter is not None else None
        if rewritten is not None:
            done.setdefault(rewritten, []).append(node.name)
    notes = [
        f"{ops} ({_where(names)}) rewritten for {converter} as {became}: an exact "
        f"equivalent the converter takes"
        for (ops, became), names in done.items()
    ]
    return (graph.graph_def() if done else graph_def), notes


def _where(names: list[str]) -> str:
    """`at scope/op`, or `3 nodes, first at scope/op`: the node's scope names the layer."""
    if len(names) == 1:
        return f"at {names[0]}"
    return f"{len(names)} nodes, first at {names[0]}"


class _Graph:
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
        shape = self._tf.get_tensor_by_name(_tensor_name(tensor)).shape
        return None if shape.rank is None else shape.as_list()

    def constant(self, tensor: str) -> np.ndarray | None:
        """The tensor's value where a Const node produces it, else None."""
        import tensorflow as tf

        node = self.nodes.get(_node_name(tensor))
        if node is None or node.op != "Const":
            return None
        return tf.make_ndarray(node.attr["value"].tensor)

    def consumers(self, name: str) -> list[Any]:
        """Every node with a data input that reads one of `name`'s outputs."""
        return [
            node
            for node in self.nodes.values()
            if any(not t.startswith("^") and _node_name(t) == name for t in node.input)
        ]

    def add(self, name: str, op: str, inputs: list[str], **attrs: Any) -> str:
        """A new node; attrs as TensorFlow DTypes, ints, bools or numpy arrays (a tensor)."""
        import tensorflow as tf

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


def _node_name(tensor: str) -> str:
    return tensor.lstrip("^").split(":")[0]


def _tensor_name(tensor: str) -> str:
    return tensor if ":" in tensor else f"{tensor}:0"


def _dense_bincount(graph: _Graph, node: Any, weighted_only: bool = False) -> tuple | None:
    """DenseBincount(x, size, weights) -> Max (binary output) or Sum of OneHot(x, size), each
    one-hot row times its weight where there are weights, over x's last axis (x of rank 1 or
    2). `weighted_only`: where the converter takes the unweighted op (tf2onnx)."""
    import tensorflow as tf

    values, size, weights = node.input[:3]
    empty = graph.constant(weights)
    weighted = empty is None or empty.size != 0
    rank = len(graph.shape(values) or [])
    if rank not in (1, 2) or (weighted_only and not weighted):
        return None
    dtype = tf.as_dtype(node.attr["T"].type)
    index_dtype = tf.as_dtype(node.attr["Tidx"].type)
    binary = node.attr["binary_output"].b
    if weighted and binary:
        return None  # TensorFlow refuses weights with binary output: nothing to match
    name = node.name
    depth = _static_size(graph, size)
    if depth is not None:
        depth_input = graph.const(f"{name}/rewrite/depth", np.array(depth, np.int32))
    elif index_dtype != tf.int32:
        depth_input = graph.add(
            f"{name}/rewrite/depth", "Cast", [size], SrcT=index_dtype, DstT=tf.int32
        )
    else:
        depth_input = size
    on = graph.const(f"{name}/rewrite/on", np.array(1, dtype.as_numpy_dtype))
    off = graph.const(f"{name}/rewrite/off", np.array(0, dtype.as_numpy_dtype))
    rows = graph.add(
        f"{name}/rewrite/one_hot", "OneHot", [values, depth_input, on, off],
        T=dtype, TI=index_dtype, axis=-1,
    )  # fmt: skip
    if weighted:
        last = graph.const(f"{name}/rewrite/last", np.array(-1, np.int32))
        column = graph.add(
            f"{name}/rewrite/weights", "ExpandDims", [weights, last], T=dtype, Tdim=tf.int32
        )
        rows = graph.add(f"{name}/rewrite/weighted", "Mul", [rows, column], T=dtype)
    axis = graph.const(f"{name}/rewrite/axis", np.array(rank - 1, np.int32))
    graph.remove(node)
    reduce = "Max" if binary else "Sum"
    graph.add(name, reduce, [rows, axis], T=dtype, Tidx=tf.int32, keep_dims=False)
    kind = "multi-hot" if binary else "weighted counts" if weighted else "counts"
    return "DenseBincount", f"OneHot{' x weights' if weighted else ''} + {reduce} ({kind})"


def _static_size(graph: _Graph, size: str) -> int | None:
    """The bincount's size where it is a constant, or clipped to one: Keras' CategoryEncoding
    passes min(num_tokens, max(num_tokens, max(x) + 1)) (tf.math.bincount's minlength and
    maxlength), which is num_tokens whatever x holds."""
    value = graph.constant(size)
    if value is not None:
        return int(value)
    node = graph.nodes.get(_node_name(size))
    if node is None or node.op != "Minimum":
        return None
    upper = [graph.constant(i) for i in node.input[:2]]
    inner = [graph.nodes.get(_node_name(i)) for i in node.input[:2]]
    for bound, other in ((upper[0], inner[1]), (upper[1], inner[0])):
        if bound is None or other is None or other.op != "Maximum":
            continue
        lower = [graph.constant(i) for i in other.input[:2]]
        if any(v is not None and int(v) == int(bound) for v in lower):
            return int(bound)
    return None


_RFFT_CONSUMERS = ("ComplexAbs", "Real", "Imag")


def _rfft(graph: _Graph, node: Any) -> tuple[str, str] | None:
    """RFFT(x, [n]) read by ComplexAbs, Real or Imag -> x @ C and x @ S, the DFT as products
    with constant matrices (for x's last axis of static length m: C[k, j] = cos(2 pi k j / n),
    S[k, j] = -sin(2 pi k j / n), the rows k >= n zero as RFFT crops x to n, and the
    padding to n adds nothing), |z| = sqrt(re^2 + im^2)."""
    import tensorflow as tf

    values, length = node.input[:2]
    consumers = graph.consumers(node.name)
    if not consumers or any(c.op not in _RFFT_CONSUMERS for c in consumers):
        return None
    n = graph.constant(length)
    shape = graph.shape(values)
    if n is None or n.shape != (1,) or not shape or shape[-1] is None:
        return None
    n, m = int(n[0]), shape[-1]
    dtype = tf.as_dtype(node.attr["Treal"].type)
    bins = n // 2 + 1
    k = np.arange(min(m, n), dtype=np.float64)[:, None]
    angle = 2 * np.pi * ((k * np.arange(bins)) % n) / n  # reduced mod n: exact angles
    matrices = np.zeros((m, bins)), np.zeros((m, bins))
    matrices[0][: len(k)], matrices[1][: len(k)] = np.cos(angle), -np.sin(angle)
    name = node.name
    parts = {}
    for part, matrix in zip(("Real", "Imag"), matrices, strict=True):
        weights = graph.const(f"{name}/rewrite/{part}/dft", matrix.astype(dtype.as_numpy_dtype))
        parts[part] = graph.add(
            f"{name}/rewrite/{part}", "BatchMatMulV2", [values, weights], T=dtype,
            adj_x=False, adj_y=False,
        )  # fmt: skip
    ops = sorted({c.op for c in consumers})
    became = dict(parts)
    if "ComplexAbs" in ops:
        squares = [
            graph.add(f"{name}/rewrite/{p}/square", "Square", [parts[p]], T=dtype) for p in parts
        ]
        power = graph.add(f"{name}/rewrite/power", "AddV2", squares, T=dtype)
        became["ComplexAbs"] = graph.add(f"{name}/rewrite/magnitude", "Sqrt", [power], T=dtype)
    for consumer in consumers:
        graph.remove(consumer)  # its consumers now read the replacement under its name
        graph.add(consumer.name, "Identity", [became[consumer.op]], T=dtype)
    graph.remove(node)
    magnitude = " and |z| = sqrt(re^2 + im^2)" if "ComplexAbs" in ops else ""
    return " + ".join(["RFFT", *ops]), f"MatMul by constant DFT cosine and sine matrices{magnitude}"
