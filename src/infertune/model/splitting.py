"""Split execution: the part of a Keras model near its inputs that no converter takes (string
and lookup preprocessing) runs in TensorFlow; the rest, the body, is converted.

Keras' own guidance is to ship a model with its preprocessing inside (`TextVectorization` on
a string input, `IntegerLookup`, `Discretization` on tabular features). tf2onnx, TFLite and
XLA reject the lookup tables and the strings, so without a split such a model gets nothing
from any runtime, though all but its first layers are plain arithmetic. Here the model's
graph is cut after those layers:

- the head: a Keras model from the model's inputs to the tensors that leave the
  preprocessing layers (and the inputs that go straight past them), run as one tf.function;
- the body: a Keras functional model from those tensors to the model's outputs, which every
  converting candidate takes as it would take a whole model.

A layer belongs to the head when its class is a preprocessing layer no converter takes
(`HEAD_LAYERS`), when it takes or gives strings, or, for a layer of the user's own, when its
graph holds an op a converter rejects (`REJECTED_OPS`: it is traced alone to see), and
every tensor it reads comes from the model's inputs or from other head layers. Only
Functional and Sequential models have a graph to cut; the reason is said where a model that
needs a split cannot be split.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import one_line
from .inputs import (
    InputSignature,
    build_signature,
)
from .source import (
    ModelSource,
    load_model,
    tensor_specs,
    trace,
)
from .structure import flatten

__all__ = ["HEAD_LAYERS", "REJECTED_OPS", "Split", "find_split"]

# Keras preprocessing layers whose ops no converter takes: lookup tables (tf2onnx rejects
# LookupTableFindV2, TFLite the hash table without its select ops, XLA the resource),
# strings and hashing of strings. Normalization and Rescaling are plain arithmetic, and
# Discretization (Bucketize) and CategoryEncoding (DenseBincount) convert through the exact
# rewrites of export/rewrites.py: they stay in the body.
HEAD_LAYERS = frozenset(
    {
        "TextVectorization",
        "StringLookup",
        "IntegerLookup",
        "Hashing",
        "HashedCrossing",
    }
)


# TensorFlow ops that a converter rejects and no exact rewrite covers (the tables, string
# hashing, the sparse and ragged bincounts): a layer of
# the user's own near the inputs whose graph holds one goes in the head, as the layers above.
REJECTED_OPS = frozenset(
    {
        "LookupTableFindV2",
        "LookupTableImportV2",
        "LookupTableSizeV2",
        "HashTableV2",
        "MutableHashTableV2",
        "StringToHashBucketFast",
        "StringToHashBucketStrong",
        "SparseBincount",
        "RaggedBincount",
    }
)


@dataclass
class Split:
    """A model cut in two: `head` (Keras, the model's inputs to the body's inputs) and
    `body` (a ModelSource of the Keras model from there to the outputs), with the body's
    input signature (from the head's output on the sample)."""

    head: Any
    head_function: Any  # tf.function of the model's flat inputs, returning the body's flat inputs
    body: ModelSource
    body_signature: InputSignature
    head_layers: list[str]  # "name (Class)", in the graph's order
    strings: list[str]  # the model's string inputs, which only the head takes

    def describe(self) -> str:
        """Where the model was split and why, in one line (for the report)."""
        return (
            f"split after its preprocessing: {', '.join(self.head_layers)} run in TensorFlow "
            f"(no converter takes their lookup tables, strings or string hashing); the body "
            f"from {self.body_signature.describe()} goes to every converting candidate, each "
            f"named tf-head+<candidate> and verified end to end against the whole model"
        )


def find_split(
    source: ModelSource, signature: InputSignature, sample: list[np.ndarray]
) -> tuple[Split | None, str | None]:
    """The model split after its preprocessing layers: (split, None); (None, why) where the
    model needs a split (string inputs, or preprocessing layers) but cannot be split; (None,
    None) where there is nothing to split."""
    strings = signature.strings
    model = source.owner if source.is_keras else None
    kind = type(model).__name__ if model is not None else None
    layers = getattr(model, "layers", None) or ()
    found = sorted({type(layer).__name__ for layer in layers} & HEAD_LAYERS)
    known = bool(strings or found)  # needs a split, whatever the user's own layers hold
    if not known and not any(_is_users(layer) for layer in layers):
        return None, None  # nothing a converter is known to reject near the inputs
    graph = kind in ("Functional", "Sequential")
    if not graph or type(model).__module__.split(".")[0] != "keras":
        if not known:  # only the user's own layers, which are traced in a Keras 3 graph
            return None, None
        if graph:
            return None, (
                f"{source.description} is a tf_keras model; infertune cuts the layer graph "
                f"of Keras 3 models"
            )
        what = (
            f"string inputs ({', '.join(strings)})"
            if strings
            else f"preprocessing layers ({', '.join(found)})"
        )
        whose = f"a subclassed Keras model ({kind})" if model is not None else source.description
        return None, (
            f"the model takes {what} that only TensorFlow runs, and it cannot be split there: "
            f"{whose} has no layer graph to cut (a Keras Functional or Sequential model has)"
        )
    try:
        return _split(source, model, signature, sample)
    except Exception as exc:  # the model runs whole, as without a split; the report says why
        return None, (f"splitting it failed: {one_line(exc)}" if known else None)


def _split(
    source: ModelSource, model: Any, signature: InputSignature, sample: list[np.ndarray]
) -> tuple[Split | None, str | None]:
    head_ops, boundary, why = _cut(model)
    if why is not None:
        return None, why
    if not head_ops:
        if signature.strings:  # a string input that no layer reads: nothing to cut after
            return None, "the model takes string inputs, but no layer near its inputs reads them"
        return None, None
    import keras

    # A Sequential model has only the lists; a functional one keeps its inputs' structure.
    inputs = model.input if len(model.inputs) > 1 else model.inputs[0]
    outputs = model.outputs[0] if len(model.outputs) == 1 else getattr(model, "output", None)
    # The body takes a dict named after where each tensor comes from (the layer, or the
    # model's input that goes straight past the head), in the sorted order of its keys,
    # which is the order of its flat inputs and of the head's outputs.
    named = sorted(zip(_boundary_names(boundary, input_ids={id(t) for t in model.inputs}),
                       boundary), key=lambda pair: pair[0])  # fmt: skip
    head = keras.Model(inputs, [tensor for _, tensor in named], name=f"{model.name}_head")
    with warnings.catch_warnings():  # "keys must match the tensors' names": only a warning,
        # for intermediate tensors Keras named itself; a call's dict is matched by its keys
        warnings.simplefilter("ignore", UserWarning)
        body_model = keras.Model(dict(named), outputs, name=f"{model.name}_body")
    head_function = _head_function(head, signature)
    body_sample = [np.asarray(t.numpy()) for t in head_function(*sample)]
    body = load_model(body_model)
    body.description = f"the body of {source.description} (after its preprocessing)"
    structured = {name: array for (name, _), array in zip(named, body_sample)}
    body_signature, _ = build_signature(structured, body.declared_inputs, body.default_float)
    return Split(head, head_function, body, body_signature, head_ops, signature.strings), None


def _cut(model: Any) -> tuple[list[str], list[Any], str | None]:
    """The head's layers ("name (Class)", with the rejected ops that put a user's layer
    there) and the body's input tensors (in the graph's order), or why the model cannot be
    cut."""
    input_ids = {id(t) for t in model.inputs}

    def node_of(tensor: Any) -> Any:
        op, node_index, _ = tensor._keras_history
        return op._inbound_nodes[node_index]

    # Every node reachable from the outputs, each after the nodes it reads from (iterative
    # depth-first order: a deep model would pass Python's recursion limit).
    nodes: list[Any] = []
    seen: set[int] = set()
    stack = [(node_of(t), False) for t in reversed(model.outputs) if id(t) not in input_ids]
    while stack:
        node, done = stack.pop()
        if done:
            nodes.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        for tensor in reversed(list(node.input_tensors)):
            if id(tensor) not in input_ids and id(node_of(tensor)) not in seen:
                stack.append((node_of(tensor), False))
    in_head = dict.fromkeys(input_ids, True)  # tensor id -> from the inputs by head layers only
    head_ops: list[str] = []
    head_nodes: set[int] = set()
    for node in nodes:
        reads = list(node.input_tensors)
        outputs = flatten(node.outputs)[0]
        strings = any(_is_string(t) for t in reads + outputs)
        op = node.operation
        rejected: list[str] = []
        head = (
            bool(reads)
            and all(in_head.get(id(t), False) for t in reads)
            and (type(op).__name__ in HEAD_LAYERS or strings or bool(rejected := _rejected(node)))
        )
        for tensor in outputs:
            in_head[id(tensor)] = head
        if head:
            head_nodes.add(id(node))
            name = f"{op.name} ({type(op).__name__}"
            name += f": {', '.join(rejected)})" if rejected else ")"
            if name not in head_ops:
                head_ops.append(name)
    boundary: list[Any] = []
    for node in nodes:
        if id(node) in head_nodes:
            continue
        for tensor in node.input_tensors:
            if in_head.get(id(tensor)) and all(tensor is not b for b in boundary):
                boundary.append(tensor)
    for output in model.outputs:
        if in_head.get(id(output)) and id(output) not in input_ids:
            return (
                [],
                [],
                (
                    f"the model's output {output.name} comes from its preprocessing layers alone: "
                    f"nothing after them to convert"
                ),
            )
    for tensor in boundary:
        if _is_string(tensor):
            user = next(
                type(n.operation).__name__
                for n in nodes
                if any(t is tensor for t in n.input_tensors)
            )
            return (
                [],
                [],
                (
                    f"a string tensor reaches a {user} layer, which is not string preprocessing: "
                    f"the body would take strings, which no converter runs"
                ),
            )
    return head_ops, boundary, None


def _boundary_names(boundary: list[Any], input_ids: set[int]) -> list[str]:
    """A name for each of the body's inputs: the model input's own name, or the name of the
    head layer that gives it (with its output's index where a layer gives several)."""
    names = []
    for tensor in boundary:
        op, _, index = tensor._keras_history
        name = tensor.name if id(tensor) in input_ids else op.name
        if id(tensor) not in input_ids and len(flatten(op._inbound_nodes[0].outputs)[0]) > 1:
            name = f"{name}_{index}"
        while name in names:
            name += "_"
        names.append(name)
    return names


def _is_users(layer: Any) -> bool:
    """A layer of the user's own (or a Lambda): its graph is not known until traced."""
    cls = type(layer)
    return cls.__name__ == "Lambda" or cls.__module__.split(".")[0] not in ("keras", "tf_keras")


def _rejected(node: Any) -> list[str]:
    """The ops of REJECTED_OPS in a user's layer, traced alone on its inputs' specs (Keras'
    own layers are known by class: they are not traced)."""
    if not _is_users(node.operation):
        return []
    import tensorflow as tf

    reads = list(node.input_tensors)

    def call(*tensors):
        args, kwargs = node.arguments.fill_in({id(t): x for t, x in zip(reads, tensors)})
        return node.operation(*args, **kwargs)

    specs = [tf.TensorSpec(t.shape, t.dtype) for t in reads]
    try:
        graph = tf.function(call, autograph=False).get_concrete_function(*specs).graph
    except Exception:  # noqa: BLE001 - a layer that does not trace alone stays in the body
        return []
    definition = graph.as_graph_def()
    ops = {n.op for n in definition.node}
    ops |= {n.op for f in definition.library.function for n in f.node_def}
    return sorted(ops & REJECTED_OPS)


def _is_string(tensor: Any) -> bool:
    return str(getattr(tensor, "dtype", "")) == "string"


def _head_function(head: Any, signature: InputSignature) -> Any:
    """The head as a tf.function of the model's flat inputs (batch free), returning the body's
    flat inputs: traced once, called by every chain candidate."""
    import tensorflow as tf

    pack = signature.structure.pack
    # What the body declares it takes: a layer's graph output can differ from its declared
    # dtype (IntegerLookup's one-hot is int64 in the graph, float32 in Keras' own record),
    # and Keras casts a functional model's inputs to their declared dtypes, as this does.
    dtypes = [tf.as_dtype(tensor.dtype) for tensor in head.outputs]

    def flat_head(*flat_inputs):
        outputs = head(pack(list(flat_inputs)))
        outputs = list(outputs) if isinstance(outputs, list | tuple) else [outputs]
        return [
            tf.cast(output, dtype) if output.dtype != dtype else output
            for output, dtype in zip(outputs, dtypes)
        ]

    function = tf.function(flat_head, input_signature=tensor_specs(signature))
    trace(function)  # called in the background thread beside the conversions
    return function
