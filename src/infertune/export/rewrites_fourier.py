"""Exact rewrites of Fourier transforms (export/rewrites.py says what an exact rewrite is):
the transforms and the complex arithmetic after them as real arithmetic on (re, im) pairs,
for the converters that have no complex tensors.

- **RFFT and the complex arithmetic after it** (`tf.abs(tf.signal.stft(...))`, a power
  spectrum `s * tf.math.conj(s)`, `tf.signal.dct` and so MFCCs), for ONNX and, where it
  goes beyond RFFT + ComplexAbs/Real/Imag (TFLite's own builtins), for TFLite: tf2onnx
  converts RFFT only when ComplexAbs alone reads it, and its ComplexAbs handler refuses the
  result whenever its shape is not fully known (`ComplexAbs expected the first dimension
  to be 2 but shape is [-1, -1, -1, -1]`, a free batch); TFLite has no complex slice or
  product. The rewrite is the discrete Fourier transform as a matrix product with
  constant cosine and sine matrices (what tf2onnx's RFFT handler computes too) and the
  complex ops after it (slices, sums, products with constants or each other, Conj) as real
  ops on the (re, im) parts, down to ComplexAbs (|z| = sqrt(re^2 + im^2)), Real, Imag and
  IRFFT (products with constant inverse-DFT matrices). Not Angle: the phase jumps from pi
  to -pi across the negative real axis, and where the FFT gives an exact zero imaginary
  part (bins 0 and n/2) the products leave round-off of either sign.
  Only where the transformed axis has a static length and fft_length is a constant, and
  every op that reads a complex tensor is one of those; float32 sums of the DFT's terms in
  another order than the FFT's: round-off of 1e-7 relative.
- **FFT and FFT2D of a real tensor** (Fourier mixing as FNet does it:
  `tf.math.real(tf.signal.fft2d(tf.cast(x, tf.complex64)))`, or Keras'
  `ops.fft2((x, zeros))`), for ONNX and TFLite, neither of which has the complex cast or
  the complex FFT: the input made complex by `Cast` or `Complex(re, im)` is taken as its
  (re, im) parts, each transformed axis of static length n is a product with the constant
  cosine and sine matrices C and S (C[j, k] = cos(2 pi j k / n), S[j, k] = sin(2 pi j k /
  n)): Re = A C + B S, Im = B C - A S over the last axis, the same from the left over the
  one before it (FFT2D), so the real part of a real input's 2-D transform is C_s X C_h -
  S_s X S_h, and the complex ops after it are lowered as after an RFFT (Real, Imag, |z|).
  Only the part a consumer reads is computed (the converters prune the other).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .rewrites_graph import Graph, node_name

__all__ = ["rewrite_fft", "rewrite_rfft"]


# Ops on complex tensors lowered to pairs of real tensors (re, im), with the inputs that
# carry complex values; and the ops that end a complex computation with a real tensor.
_COMPLEX_OPS = {
    "Identity": (0,), "Neg": (0,), "Conj": (0,), "Mul": (0, 1), "AddV2": (0, 1), "Sub": (0, 1),
    # ops that move or zero-pad elements: the same op on each part (zero is (0, 0))
    "StridedSlice": (0,), "Slice": (0,), "Pad": (0,), "Reshape": (0,), "ExpandDims": (0,),
    "Squeeze": (0,), "Transpose": (0,),
}  # fmt: skip


_ON_EACH_PART = ("StridedSlice", "Slice", "Pad", "Reshape", "ExpandDims", "Squeeze", "Transpose")


_ENDS = ("ComplexAbs", "Real", "Imag", "IRFFT")


def rewrite_rfft(graph: Graph, node: Any, natively: frozenset = frozenset()) -> tuple | None:
    """RFFT(x, [n]) and the complex arithmetic after it, down to the ops that make real
    tensors of it (ComplexAbs, Real, Imag, IRFFT), as real arithmetic on (re, im) pairs.

    The RFFT becomes x @ [C | S] split in two, the DFT as a product with constant matrices: for x's
    last axis of static length m, C[k, j] = cos(2 pi k j / n) and S[k, j] = -sin(2 pi k j / n),
    the rows k >= n zero (RFFT crops x to n; its padding to n adds nothing). Slices apply to
    both parts, a product by a complex constant or another such tensor expands (a + bi)(c +
    di), Conj negates the imaginary part, |z| = sqrt(re^2 + im^2), IRFFT is a product with
    constant inverse-DFT matrices (`_inverse_dft`). Where another op reads a
    complex tensor, or the RFFT's length or x's last axis is not static, the graph is left as
    it is. `natively`: ops the converter takes itself, left alone where they are all there
    is (TFLite converts RFFT + ComplexAbs)."""
    import tensorflow as tf

    values, length = node.input[:2]
    n = graph.constant(length)
    shape = graph.shape(values)
    if n is None or n.shape != (1,) or not shape or shape[-1] is None:
        return None
    region = _complex_region(graph, node)
    if region is None:
        return None
    ops = sorted({other.op for other in region} - {"Identity"})
    if set(ops) <= natively:
        return None
    n, m = int(n[0]), shape[-1]
    dtype = tf.as_dtype(node.attr["Treal"].type)
    bins = n // 2 + 1
    k = np.arange(min(m, n), dtype=np.float64)[:, None]
    angle = 2 * np.pi * ((k * np.arange(bins)) % n) / n  # reduced mod n: exact angles
    matrices = np.zeros((m, bins)), np.zeros((m, bins))
    matrices[0][: len(k)], matrices[1][: len(k)] = np.cos(angle), -np.sin(angle)
    # One product with [C | S], split in two: two independent products would make ONNX
    # Runtime's parallel mode a candidate, and it took 23 ms a call here against 0.04 ms.
    both = np.concatenate(matrices, axis=1).astype(dtype.as_numpy_dtype)
    weights = graph.const(f"{node.name}/dft", both)
    product = _matmul(graph, f"{node.name}/product", values, weights, dtype)
    axis = graph.const(f"{node.name}/axis", np.array(-1, np.int32))
    split = graph.add(f"{node.name}/parts", "Split", [axis, product], T=dtype, num_split=2)
    parts = [f"{split}:0", f"{split}:1"]
    lowered = {node.name: (parts[0], parts[1])}
    graph.remove(node)
    for other in region:
        _lower(graph, other, lowered, dtype)
    magnitude = " and |z| = sqrt(re^2 + im^2)" if "ComplexAbs" in ops else ""
    return (
        " + ".join(["RFFT", *ops]),
        f"MatMul by constant DFT cosine and sine matrices, real arithmetic on the (re, im) "
        f"parts{magnitude}",
    )


def rewrite_fft(graph: Graph, node: Any) -> tuple | None:
    """FFT or FFT2D of a tensor made complex from real ones (`Cast` from a real dtype, or
    `Complex(re, im)`), and the complex arithmetic after it, as real arithmetic: see the
    module's doc. None where an axis it transforms has no static length, its input is not
    made so, or an op that cannot be lowered reads its result."""
    import tensorflow as tf

    axes = 2 if node.op == "FFT2D" else 1
    source = graph.nodes.get(node_name(node.input[0]))
    if source is None or len(graph.consumers(source.name)) != 1:
        return None
    if source.op == "Complex":
        dtype = tf.as_dtype(source.attr["T"].type)
        re, im = source.input[0], source.input[1]
        if graph.shape(re) != graph.shape(im):
            return None  # a broadcast inside Complex: not lowered
        zero = graph.value(im)
        if zero is not None and not np.any(zero):
            im = None  # a constant zero imaginary part adds nothing
    elif source.op == "Cast" and tf.as_dtype(source.attr["SrcT"].type).is_floating:
        dtype, re, im = tf.as_dtype(source.attr["SrcT"].type), source.input[0], None
        if dtype not in (tf.float32, tf.float64):
            return None
    else:
        return None
    shape = graph.shape(re)
    if not shape or len(shape) < axes or any(d is None for d in shape[-axes:]):
        return None
    region = _complex_region(graph, node)
    if region is None:
        return None
    name = node.name
    graph.remove(node)
    graph.remove(source)
    re, im = _dft_last(graph, f"{name}/last", re, im, shape[-1], dtype)
    if axes == 2:
        re, im = _dft_second_last(graph, f"{name}/rows", re, im, shape[-2], dtype)
    lowered = {name: (re, im)}
    for other in region:
        _lower(graph, other, lowered, dtype)
    ops = sorted({other.op for other in region} - {"Identity"})
    made = "Complex" if source.op == "Complex" else "Cast to complex"
    return (
        " + ".join([made, node.op, *ops]),
        "MatMul by constant DFT cosine and sine matrices on the (re, im) parts",
    )


def _dft_matrices(n: int, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """C[j, k] = cos(2 pi j k / n) and S[j, k] = sin(2 pi j k / n), symmetric, the angles
    reduced mod n (exact)."""
    j = np.arange(n, dtype=np.float64)[:, None]
    angle = 2 * np.pi * ((j * np.arange(n)) % n) / n
    real = dtype.as_numpy_dtype
    return np.cos(angle).astype(real), np.sin(angle).astype(real)


def _dft_last(
    graph: Graph, name: str, re: str, im: str | None, n: int, dtype: Any
) -> tuple[str, str]:
    """The DFT over the last axis, one product: [A | B] @ [[C, -S], [S, C]] (B absent: A @
    [C | -S]), split into (re, im)."""
    import tensorflow as tf

    c, s = _dft_matrices(n, dtype)
    if im is None:
        matrix, values = np.concatenate([c, -s], axis=1), re
    else:
        matrix = np.block([[c, -s], [s, c]])
        axis = graph.const(f"{name}/concat_axis", np.array(-1, np.int32))
        values = graph.add(f"{name}/parts", "ConcatV2", [re, im, axis], T=dtype, N=2,
                           Tidx=tf.int32)  # fmt: skip
    product = _matmul(graph, f"{name}/product", values, graph.const(f"{name}/dft", matrix), dtype)
    axis = graph.const(f"{name}/axis", np.array(-1, np.int32))
    split = graph.add(f"{name}/split", "Split", [axis, product], T=dtype, num_split=2)
    return f"{split}:0", f"{split}:1"


def _dft_second_last(
    graph: Graph, name: str, re: str, im: str, n: int, dtype: Any
) -> tuple[str, str]:
    """The DFT over the axis before the last, from the left on [A ; B] stacked on that axis:
    re = [C, S] @ [A ; B], im = [-S, C] @ [A ; B], two products (a converter prunes the one
    no consumer reads: FNet reads the real part only)."""
    import tensorflow as tf

    c, s = _dft_matrices(n, dtype)
    axis = graph.const(f"{name}/concat_axis", np.array(-2, np.int32))
    stacked = graph.add(f"{name}/parts", "ConcatV2", [re, im, axis], T=dtype, N=2,
                        Tidx=tf.int32)  # fmt: skip
    left = {"re": np.concatenate([c, s], axis=1), "im": np.concatenate([-s, c], axis=1)}
    parts = []
    for part, matrix in left.items():
        constant = graph.const(f"{name}/dft_{part}", matrix)
        parts.append(_matmul(graph, f"{name}/{part}", constant, stacked, dtype))
    return parts[0], parts[1]


def _complex_region(graph: Graph, source: Any) -> list[Any] | None:
    """The nodes that compute on `source`'s complex output, down to the ops that end in a
    real tensor, in an order where each comes after the complex nodes it reads; None where
    an op that cannot be lowered reads one of them, or one is an output of the graph."""
    region: dict[str, Any] = {}
    frontier = [source]
    while frontier:
        node = frontier.pop()
        consumers = graph.consumers(node.name)
        if not consumers:
            return None  # a complex output of the graph
        for consumer in consumers:
            if consumer.name in region:
                continue
            if consumer.op == "IRFFT" and _inverse_dft(graph, consumer) is None:
                return None
            if consumer.op in _ENDS:
                region[consumer.name] = consumer
            elif consumer.op in _COMPLEX_OPS:
                region[consumer.name] = consumer
                frontier.append(consumer)
            else:
                return None
    ordered, done = [], {source.name}
    while len(ordered) < len(region):
        ready = [
            node
            for name, node in region.items()
            if name not in done
            and all(
                node_name(node.input[i]) in done or node_name(node.input[i]) not in region
                for i in _COMPLEX_OPS.get(node.op, (0,))
            )
        ]
        if not ready:
            return None
        for node in ready:
            for i in _COMPLEX_OPS.get(node.op, (0,)):
                name = node_name(node.input[i])
                if (
                    name not in region
                    and name != source.name
                    and graph.value(node.input[i]) is None
                ):
                    return None  # another complex tensor that is not a constant
            ordered.append(node)
            done.add(node.name)
    return ordered


def _lower(graph: Graph, node: Any, lowered: dict[str, tuple[str, str]], dtype: Any) -> None:
    """Replace `node` by real ops on the (re, im) pairs of its complex inputs: for an op that
    ends the complex computation, one op under its name (its consumers unchanged); else a
    pair, in `lowered`."""
    import tensorflow as tf

    name, op = node.name, node.op
    pairs = [_pair(graph, node.input[i], lowered, f"{name}/in{i}", dtype) for i in
             _COMPLEX_OPS.get(op, (0,))]  # fmt: skip
    graph.remove(node)

    def add(suffix: str, kind: str, inputs: list[str]) -> str:
        return graph.add(f"{name}/{suffix}", kind, inputs, T=dtype)

    (re, im) = pairs[0]
    if op in ("Real", "Imag"):
        graph.add(name, "Identity", [re if op == "Real" else im], T=dtype)
        return
    if op == "ComplexAbs":
        power = add("power", "AddV2", [add("re2", "Square", [re]), add("im2", "Square", [im])])
        graph.add(name, "Sqrt", [power], T=dtype)
        return
    if op == "IRFFT":  # [re | im] @ [A ; B], one product
        matrix = np.concatenate(_inverse_dft(graph, node), axis=0).astype(dtype.as_numpy_dtype)
        axis = graph.const(f"{name}/axis", np.array(-1, np.int32))
        both = graph.add(f"{name}/parts", "ConcatV2", [re, im, axis], T=dtype, N=2, Tidx=tf.int32)
        _matmul(graph, name, both, graph.const(f"{name}/idft", matrix), dtype)
        return
    if op == "Identity":
        lowered[name] = (re, im)
    elif op == "Neg":
        lowered[name] = add("re", "Neg", [re]), add("im", "Neg", [im])
    elif op == "Conj":
        lowered[name] = re, add("im", "Neg", [im])
    elif op in _ON_EACH_PART:
        moved = []
        for part, tensor in (("re", re), ("im", im)):
            copy = graph.add(f"{name}/{part}", op, [tensor, *node.input[1:]])
            for key in node.attr:
                graph.nodes[copy].attr[key].CopyFrom(node.attr[key])
            graph.nodes[copy].attr["T"].type = dtype.as_datatype_enum
            moved.append(copy)
        lowered[name] = tuple(moved)
    elif op in ("AddV2", "Sub"):
        (re2, im2) = pairs[1]
        lowered[name] = add("re", op, [re, re2]), add("im", op, [im, im2])
    else:  # Mul: (a + bi)(c + di) = (ac - bd) + (ad + bc)i
        (c, d) = pairs[1]
        ac, bd = add("ac", "Mul", [re, c]), add("bd", "Mul", [im, d])
        ad, bc = add("ad", "Mul", [re, d]), add("bc", "Mul", [im, c])
        lowered[name] = add("re", "Sub", [ac, bd]), add("im", "AddV2", [ad, bc])


def _matmul(graph: Graph, name: str, values: str, weights: str, dtype: Any) -> str:
    """values @ weights over values' last axis, whatever its rank (a constant 2-D weights)."""
    return graph.add(name, "BatchMatMulV2", [values, weights], T=dtype, adj_x=False, adj_y=False)


def _inverse_dft(graph: Graph, node: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """IRFFT(z, [n]) as re @ A + im @ B: A[k, t] = w_k cos(2 pi k t / n) / n and B[k, t] =
    -w_k sin(2 pi k t / n) / n over the bins k < n // 2 + 1 that IRFFT reads (the rest zero:
    it crops z to them, its padding adds nothing), w_k = 2 for the bins that stand for a
    conjugate pair too, 1 for bin 0 and, for an even n, bin n / 2 (whose sine row is zero, so
    their imaginary parts are ignored, as IRFFT ignores them). None where z's last axis or n
    is not static."""
    n = graph.constant(node.input[1])
    shape = graph.shape(node.input[0])
    if n is None or n.shape != (1,) or not shape or shape[-1] is None:
        return None
    n, bins = int(n[0]), shape[-1]
    used = min(bins, n // 2 + 1)
    k = np.arange(used, dtype=np.float64)[:, None]
    angle = 2 * np.pi * ((k * np.arange(n)) % n) / n
    weight = np.full((used, 1), 2.0)
    weight[0] = 1.0
    if n % 2 == 0 and n // 2 < used:
        weight[n // 2] = 1.0
    a, b = np.zeros((bins, n)), np.zeros((bins, n))
    a[:used], b[:used] = weight * np.cos(angle) / n, -weight * np.sin(angle) / n
    return a, b


def _pair(graph: Graph, tensor: str, lowered: dict, prefix: str, dtype: Any) -> tuple[str, str]:
    """The (re, im) tensors of a complex input: lowered already, or a constant split here."""
    name = node_name(tensor)
    if name in lowered:
        return lowered[name]
    value = graph.value(tensor)  # _complex_region checked that it is a constant
    real = dtype.as_numpy_dtype
    return (
        graph.const(f"{prefix}/re", np.real(value).astype(real)),
        graph.const(f"{prefix}/im", np.imag(value).astype(real)),
    )
