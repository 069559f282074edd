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
- **Bucketize** (`Discretization`), for ONNX, which tf2onnx has no handler for: the
  boundaries' count minus how many lie above the value (Less against a constant, Sum).
  Comparisons are exact; NaN falls in the last bucket in both.
- **RFFT, FFT and FFT2D and the complex arithmetic after them** (spectrograms, MFCCs,
  FNet's Fourier mixing), for ONNX and TFLite: the discrete Fourier transform as products
  with constant cosine and sine matrices, the complex ops after it as real ops on the
  (re, im) parts (export/rewrites_fourier.py says which and where).

The rewritten graph is edited as a `Graph` (export/rewrites_graph.py).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from .rewrites_fourier import rewrite_fft, rewrite_rfft
from .rewrites_graph import Graph, Rewriter, node_name

__all__ = ["rewrite_for_onnx", "rewrite_for_tflite", "rewriting_for_tflite"]


def rewrite_for_onnx(graph_def: Any) -> tuple[Any, list[str]]:
    """The graph with the ops tf2onnx cannot convert rewritten, and a note for each rewrite
    (the graph itself where none applies)."""
    rewriters = {
        "RFFT": rewrite_rfft,
        "FFT": rewrite_fft,
        "FFT2D": rewrite_fft,
        "DenseBincount": partial(_dense_bincount, weighted_only=True),
        "Bucketize": _bucketize,
    }
    return _rewrite(graph_def, rewriters, "ONNX")


def rewrite_for_tflite(graph_def: Any) -> tuple[Any, list[str]]:
    """The graph with the ops the TFLite converter has no builtin for rewritten, and a note
    for each rewrite (the graph itself where none applies)."""
    rewriters = {
        "RFFT": partial(rewrite_rfft, natively=frozenset({"ComplexAbs", "Real", "Imag"})),
        "FFT": rewrite_fft,
        "FFT2D": rewrite_fft,
        "DenseBincount": _dense_bincount,
    }
    return _rewrite(graph_def, rewriters, "TFLite")


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


def _rewrite(graph_def: Any, rewriters: dict[str, Rewriter], converter: str) -> tuple[Any, list]:
    if not any(node.op in rewriters for node in graph_def.node):
        return graph_def, []  # the common case: no copy, no import
    graph = Graph(graph_def)
    done: dict[tuple[str, str], list[str]] = {}  # (ops, what they became) -> node names
    for node in list(graph.nodes.values()):
        if graph.nodes.get(node.name) is not node:
            continue  # replaced by an earlier rewrite
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


def _dense_bincount(graph: Graph, node: Any, weighted_only: bool = False) -> tuple | None:
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


def _bucketize(graph: Graph, node: Any) -> tuple[str, str] | None:
    """Bucketize(x, boundaries) -> len(boundaries) - sum(x < boundaries) over a new last
    axis: TensorFlow's kernel is `upper_bound(boundaries, x)`, the number of boundaries b
    with not x < b where they are sorted (Keras' Discretization sorts them), NaN included
    (no b is above it: the last bucket). Integers compare as float32, as the kernel's C++
    comparison of an integer with a float converts it."""
    import tensorflow as tf

    boundaries = np.array(list(node.attr["boundaries"].list.f), np.float32)
    if np.any(np.diff(boundaries) < 0):
        return None  # unsorted: the kernel's binary search has no simple equivalent
    dtype = tf.as_dtype(node.attr["T"].type)
    name, values = node.name, node.input[0]
    if dtype.is_integer:
        values = graph.add(f"{name}/float", "Cast", [values], SrcT=dtype, DstT=tf.float32)
        dtype = tf.float32
    last = graph.const(f"{name}/last", np.array(-1, np.int32))
    column = graph.add(f"{name}/column", "ExpandDims", [values, last], T=dtype, Tdim=tf.int32)
    bounds = graph.const(f"{name}/boundaries", boundaries.astype(dtype.as_numpy_dtype))
    below = graph.add(f"{name}/below", "Less", [column, bounds], T=dtype)
    # Counted in float32 (exact below 2**24): in int32 or int64, Less, Cast, ReduceSum and
    # Sub from the constant gave zeros for the last row of a (4, 3) input on OpenVINO
    # 2026.4.1's CPU plugin (right without the Sub, and in float32).
    ones = graph.add(f"{name}/ones", "Cast", [below], SrcT=tf.bool, DstT=tf.float32)
    above = graph.add(f"{name}/above", "Sum", [ones, last], T=tf.float32, Tidx=tf.int32,
                      keep_dims=False)  # fmt: skip
    count = graph.const(f"{name}/count", np.array(len(boundaries), np.float32))
    bucket = graph.add(f"{name}/bucket", "Sub", [count, above], T=tf.float32)
    graph.remove(node)
    graph.add(name, "Cast", [bucket], SrcT=tf.float32, DstT=tf.int32)
    return "Bucketize", "a count of the boundaries above each value (Less + Sum)"


def _static_size(graph: Graph, size: str) -> int | None:
    """The bincount's size where it is a constant, or clipped to one: Keras' CategoryEncoding
    passes min(num_tokens, max(num_tokens, max(x) + 1)) (tf.math.bincount's minlength and
    maxlength), which is num_tokens whatever x holds."""
    value = graph.constant(size)
    if value is not None:
        return int(value)
    node = graph.nodes.get(node_name(size))
    if node is None or node.op != "Minimum":
        return None
    upper = [graph.constant(i) for i in node.input[:2]]
    inner = [graph.nodes.get(node_name(i)) for i in node.input[:2]]
    for bound, other in ((upper[0], inner[1]), (upper[1], inner[0])):
        if bound is None or other is None or other.op != "Maximum":
            continue
        lower = [graph.constant(i) for i in other.input[:2]]
        if any(v is not None and int(v) == int(bound) for v in lower):
            return int(bound)
    return None
