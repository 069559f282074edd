"""Freezing for the ONNX export: the traced function's graph with every variable and captured
tensor as a constant, as tf2onnx freezes it (export/onnx.py converts the result).

On the lean path (export/onnx.py says when) the weights are held apart while TensorFlow
freezes (`held`): each Const node gets a mark instead of its value, and the arrays go to the
data file from there (export/onnx_external.py), never through a TensorProto of their own.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from . import patching

__all__ = ["frozen_graph_def"]


def frozen_graph_def(
    concrete: Any,
    input_names: list[str],
    output_names: list[str],
    optimize: bool = True,
    held: list[np.ndarray] | None = None,
) -> Any:
    """The traced graph with every variable and captured tensor as a constant, optimized by
    grappler as tf2onnx does (`optimize`; not past 2 GB: grappler serializes the GraphDef,
    and tf2onnx's large_model skips it too).

    tf2onnx's `convert_variables_to_constants_large_model` freezes without building a new
    ConcreteFunction from the frozen graph: TensorFlow's `convert_variables_to_constants_v2`,
    which `from_function` calls, does, and only its GraphDef is read (the rebuilding was about
    a fifth of MobileNetV2's conversion).
    """
    import tensorflow as tf
    from tf2onnx import tf_loader

    # tf2onnx's freezing replaces TensorFlow's make_tensor_proto while it runs (its "hack to
    # avoid 2GB check"), as `_weights_apart` does: one at a time (patching.py).
    with patching.held(), _weights_apart(held) if held is not None else contextlib.nullcontext():
        graph_def = tf_loader.convert_variables_to_constants_large_model(concrete)
    # What tf2onnx applies when TensorFlow's freezing fails (variable assignments left on
    # constants) and after it (ResourceGather in function bodies); both no-ops otherwise.
    graph_def = tf_loader.fix_freezing_errors(graph_def)
    graph_def = tf_loader.fix_freezing_errors_part2(graph_def)
    _allow_inlining(graph_def)
    if not optimize:
        return graph_def
    with tf.Graph().as_default():  # grappler exports a meta graph: not in eager mode
        return tf_loader.tf_optimize(input_names, output_names, graph_def)


@contextlib.contextmanager
def _weights_apart(held: list[np.ndarray]) -> Iterator[None]:
    """While TensorFlow freezes the traced function in this thread: each weight of more than
    1000 bytes is kept in `held` as the array TensorFlow read it into, and its Const node's
    TensorProto gets its dtype and shape, no value, and `version_number` -(its index + 1) as
    the mark (rewrites_graph.held_apart). TensorFlow's own freezing copies every weight into a
    TensorProto, and that into the node (a 2.46 GB embedding table took the export to 4x
    the weights while it froze); `onnx_external.compressed_graph_def` takes them out again
    anyway. Other threads' TensorProtos are made as always."""
    from tensorflow.core.framework import tensor_pb2
    from tensorflow.python.framework import dtypes, tensor_shape, tensor_util

    with patching.held():  # the function replaced is the one put back
        original, owner = tensor_util.make_tensor_proto, threading.get_ident()

        def make_tensor_proto(values, dtype=None, shape=None, *args, **kwargs):
            if (
                threading.get_ident() != owner
                or not isinstance(values, np.ndarray)
                or values.dtype == object
                or values.nbytes <= 1000
                or (shape is not None and tuple(shape) != values.shape)
            ):
                return original(values, dtype, shape, *args, **kwargs)
            held.append(values)
            return tensor_pb2.TensorProto(
                dtype=dtypes.as_dtype(values.dtype if dtype is None else dtype).as_datatype_enum,
                tensor_shape=tensor_shape.as_shape(values.shape).as_proto(),
                version_number=-len(held),
            )

        with patching.patched(tensor_util, {"make_tensor_proto": make_tensor_proto}):
            yield


# Marks that keep grappler from inlining a function call: a tf.function compiled by XLA
# (jit_compile=True) carries both.
_NO_INLINING_ATTRS = ("_XlaMustCompile", "_noinline")


def _allow_inlining(graph_def: Any) -> None:
    """Clear the marks that keep grappler from inlining nested functions into the graph.

    tf2onnx converts no function call op, and Keras 3 runs grouped convolutions (ConvNeXt's
    depthwise ones) through a nested tf.function compiled by XLA, which grappler leaves as a
    call. XLA's mark means nothing to an ONNX runtime; inlined, the call converts.
    """
    nodes = list(graph_def.node)
    for function in graph_def.library.function:
        nodes.extend(function.node_def)
        for key in _NO_INLINING_ATTRS:
            if key in function.attr:
                del function.attr[key]
    for node in nodes:
        for key in _NO_INLINING_ATTRS:
            if key in node.attr:
                del node.attr[key]
