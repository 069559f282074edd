"""TensorFlow/Keras -> ONNX, done once per optimize() and shared by every ONNX-based backend.

tf2onnx's `from_keras` fails on Keras 3 models (KeyError 'keras_tensor_N', tf2onnx #2448),
so the model is traced as a tf.function of flat inputs, frozen (export/onnx_freeze.py) and
converted with tf2onnx's stages (those of its `from_function`, see `_to_onnx`), which works
for Keras 3, tf_keras, tf.Module and SavedModel functions alike. What tf2onnx fails to
convert becomes the one error the export raises with (export/onnx_errors.py).

Past 2 GB. Protocol buffers stop at 2 GiB, and a frozen GraphDef or an ONNX ModelProto holds
the weights inside it. A model whose weights pass `external_data_bytes()` (1 GiB, below the
limit with room for the graph; INFERTUNE_EXTERNAL_DATA_BYTES lowers it for tests) is exported
as tf2onnx's `large_model` does: frozen without grappler (which serializes the GraphDef), its
constants taken out of the GraphDef before TensorFlow imports it, and the ONNX weights
written as external data (export/onnx_external.py): model.onnx (the graph alone) and
model.onnx.data beside it, in a temporary directory that lives as long as the export. ONNX
Runtime and OpenVINO load the pair from its path (both map the data file rather than copy it
where they can); a saved result carries both files. Models past
sizes.LEAN_CONVERSION_MIN_BYTES (256 MB) take the same path for memory (grappler copies the
GraphDef several times; every session maps one data file), and grappler's where it fails.
"""

from __future__ import annotations

import copy
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..model.source import tensor_specs
from ..model.target import Target
from ..system.paths import (
    link_or_copy,
    remove_with,
)
from ..system.resources import release_freed_memory
from . import patching
from .onnx_errors import Tf2onnxErrors, raise_on_unconverted
from .onnx_external import (
    DATA_FILE,
    ONNX_FILE,
    compressed_graph_def,
    constants_to_file,
    huge_constants_to_file,
    write_external_data,
)
from .onnx_freeze import frozen_graph_def
from .onnx_passes import speed_up
from .rewrites import rewrite_for_onnx

__all__ = [
    "DATA_FILE",
    "ONNX_FILE",
    "OPSET",
    "OnnxExport",
    "convert_to_onnx",
    "external_export",
    "in_memory_export",
    "owned_export",
    "parallel_width",
    "temporary_directory",
    "read_onnx",
    "write_onnx",
]

OPSET = 17


@dataclass(frozen=True)
class OnnxExport:
    """A serialized ONNX model and the names of its inputs and outputs, in signature order."""

    model_bytes: bytes
    input_names: list[str]
    output_names: list[str]
    seconds: float
    opset: int
    # The most matrix operations (Conv, MatMul, ...) no one of which depends on another: 1
    # for a chain of layers, 2 or more for parallel branches (Inception blocks, attention's
    # query/key/value). None where not known (an export read back from a saved file).
    parallel_width: int | None = None
    # Where the weights are external data: the directory holding model.onnx (whose bytes
    # `model_bytes` are: the graph alone) and model.onnx.data. None: all in `model_bytes`.
    directory: Path | None = None
    # Removes a temporary `directory` once the export is collected (None: not ours to remove).
    _cleanup: Any = field(default=None, repr=False, compare=False)
    # What a conversion of this export keeps for its next call, by its name (NNCF's statistics:
    # backends/openvino/quantize.py); gone with the export.
    derived: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def path(self) -> Path | None:
        """model.onnx in `directory`, where the weights are external data."""
        return None if self.directory is None else self.directory / ONNX_FILE

    def session_model(self) -> bytes | str:
        """What ONNX Runtime's InferenceSession and OpenVINO's read_model take: the bytes, or
        the path where the weights are external data (resolved beside it)."""
        return self.model_bytes if self.directory is None else str(self.path)


def write_onnx(directory: Path, model: bytes | OnnxExport, exported: OnnxExport) -> dict:
    """Save an ONNX-based candidate's model (the export, or its int8 form: its bytes, or an
    OnnxExport) as model.onnx, and model.onnx.data where its weights are external data;
    return the settings `read_onnx` needs."""
    settings = {"file": ONNX_FILE}
    if isinstance(model, OnnxExport) and model.directory is not None:
        (directory / ONNX_FILE).write_bytes(model.model_bytes)
        link_or_copy(model.directory / DATA_FILE, directory / DATA_FILE)
        settings["data_file"] = DATA_FILE
    else:
        model_bytes = model.model_bytes if isinstance(model, OnnxExport) else model
        (directory / ONNX_FILE).write_bytes(model_bytes)
    return {
        **settings,
        "input_names": list(exported.input_names),
        "output_names": list(exported.output_names),
        "opset": exported.opset,
    }


def read_onnx(directory: Path, settings: dict) -> OnnxExport:
    """The export back from a saved model.onnx (and its model.onnx.data), to preload as the
    "onnx" shared conversion."""
    external = settings.get("data_file") is not None
    return OnnxExport(
        model_bytes=(directory / settings["file"]).read_bytes(),
        input_names=list(settings["input_names"]),
        output_names=list(settings["output_names"]),
        seconds=0.0,
        opset=settings["opset"],
        directory=Path(directory) if external else None,
    )


def external_export(
    model_proto: Any, like: OnnxExport, directory: Path | None = None
) -> OnnxExport:
    """`model_proto` written as model.onnx and model.onnx.data in `directory` (a new
    temporary directory where None), every tensor of more than 1 KB still in it moved into
    the data file (after what the file holds already). Names and opset as `like`'s."""
    directory = directory or temporary_directory()
    try:
        write_external_data(model_proto, directory / DATA_FILE)
        (directory / ONNX_FILE).write_bytes(model_proto.SerializeToString())
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return owned_export(directory, like)


def temporary_directory() -> Path:
    """A new directory for an export with external data (see `owned_export`)."""
    return Path(tempfile.mkdtemp(prefix="infertune-onnx-"))


def in_memory_export(model_bytes: bytes, like: OnnxExport) -> OnnxExport:
    """A model made from an export (quantized, in float16) as an export of its own, its
    weights inside `model_bytes`; names, opset and width as `like`'s, and nothing derived
    from `like` (calibration ranges, NNCF's statistics: they are not this model's)."""
    return OnnxExport(
        model_bytes=model_bytes,
        input_names=list(like.input_names),
        output_names=list(like.output_names),
        seconds=like.seconds,
        opset=like.opset,
        parallel_width=like.parallel_width,
    )


def owned_export(directory: Path, like: OnnxExport) -> OnnxExport:
    """The model.onnx and model.onnx.data in `directory` (a `temporary_directory()`) as an
    export, names and opset as `like`'s; the directory is removed once the export is
    collected (the backends that run it hold it)."""
    exported = OnnxExport(
        model_bytes=(directory / ONNX_FILE).read_bytes(),
        input_names=list(like.input_names),
        output_names=list(like.output_names),
        seconds=like.seconds,
        opset=like.opset,
        parallel_width=like.parallel_width,
        directory=directory,
    )
    object.__setattr__(exported, "_cleanup", remove_with(exported, directory))
    return exported


def convert_to_onnx(target: Target) -> OnnxExport:
    """The model as ONNX (the registry's "onnx" conversion, export/registry.py)."""
    start = time.perf_counter()
    specs = tensor_specs(target.signature)
    _, concrete = target.traced()
    rewritten: list[str] = []  # notes of the exact rewrites made (rewrites.py)
    size = target.size()
    large = size.past_protobuf
    # Past sizes.LEAN_CONVERSION_MIN_BYTES, the lean path of models past 2 GB (no grappler,
    # which copied a BERT-base-sized GraphDef into 5.5 GB more; constants to the data file
    # before the ModelProto is made); below 2 GB, where it fails, grappler's path as before.
    lean = size.lean
    directory = temporary_directory() if lean else None
    try:
        model_proto = _to_onnx(
            concrete, specs, rewritten, lean, directory and directory / DATA_FILE
        )
    except Exception as exc:
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
        if large or not lean:
            raise
        logging.getLogger("tf2onnx").debug("lean export failed, with grappler now: %s", exc)
        directory = None
        rewritten.clear()
        model_proto = _to_onnx(concrete, specs, rewritten)
    except BaseException:
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
        raise
    input_names = [node.name for node in model_proto.graph.input]
    output_names = [node.name for node in model_proto.graph.output]
    expected_inputs = [spec.name for spec in specs]
    extra_inputs = [name for name in input_names if name not in expected_inputs]
    if extra_inputs:  # values TensorFlow did not freeze; their scope names the layer
        more = f" and {len(extra_inputs) - 3} more" if len(extra_inputs) > 3 else ""
        raise RuntimeError(
            f"values held by the model stay ONNX graph inputs instead of constants: "
            f"{', '.join(extra_inputs[:3])}{more}"
        )
    if input_names != expected_inputs:
        raise RuntimeError(
            f"ONNX inputs {input_names} do not match the signature {expected_inputs}"
        )
    if len(output_names) != len(target.output_dtypes):
        raise RuntimeError(
            f"ONNX graph has {len(output_names)} outputs, the model {len(target.output_dtypes)}"
        )
    target.notes.extend(rewritten)
    width = parallel_width(model_proto.graph)
    if lean:
        like = OnnxExport(b"", input_names, output_names, 0.0, OPSET, width)
        exported = external_export(model_proto, like, directory)
        object.__setattr__(exported, "seconds", time.perf_counter() - start)
        return exported
    return OnnxExport(
        model_bytes=model_proto.SerializeToString(),
        input_names=input_names,
        output_names=output_names,
        seconds=time.perf_counter() - start,
        opset=OPSET,
        parallel_width=width,
    )


# Operators that carry a model's arithmetic: where two of them are independent, ONNX
# Runtime's parallel execution mode can run them at once.
_MATRIX_OPS = frozenset(
    {"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "MatMul", "MatMulInteger",
     "QLinearMatMul", "Gemm", "Einsum", "LSTM", "GRU", "RNN", "Attention"}
)  # fmt: skip


def parallel_width(graph: Any) -> int:
    """The largest number of matrix operations at one depth of the graph (depth: the longest
    path from the inputs), so that none of them depends on another; 0 for a graph with none."""
    producer = {}
    for index, node in enumerate(graph.node):
        for name in node.output:
            producer[name] = index
    depth = [0] * len(graph.node)
    for index, node in enumerate(graph.node):  # ONNX graphs are topologically sorted
        depth[index] = 1 + max((depth[producer[n]] for n in node.input if n in producer), default=0)
    counts: dict[int, int] = {}
    for index, node in enumerate(graph.node):
        if node.op_type in _MATRIX_OPS:
            counts[depth[index]] = counts.get(depth[index], 0) + 1
    return max(counts.values(), default=0)


def _to_onnx(
    concrete: Any,
    specs: list,
    rewritten: list[str] | None = None,
    large: bool = False,
    data_path: Path | None = None,
) -> Any:
    """The traced function as an ONNX ModelProto whose only inputs are the function's
    arguments; the ops tf2onnx rejects that have an exact equivalent are rewritten first
    (rewrites.py), each rewrite's note added to `rewritten`. `large` (past 2 GB, see the
    module's docstring): frozen without grappler, the constants' bytes taken out of the
    GraphDef before TensorFlow imports it (tf2onnx reads them from there), and each constant
    of tf2onnx's graph written to `data_path` before the ModelProto is made
    (onnx_external.py). On a BERT-base-sized model the export's peak went from 12x the
    weights (grappler copies the GraphDef several times) to 4.4x, then to 2.3-2.6x with each
    intermediate gone once the next step holds what it needs of it: the GraphDef with the
    weights after `compressed_graph_def`, the constants' bytes once tf2onnx made them ONNX
    tensors, no second copy of the weights in the NodeProtos (`_tf2onnx_graph`), freed memory
    handed back between the steps; the weights kept apart while TensorFlow freezes
    (onnx_freeze.py: the 2.46 GB recommender's export 4.0x -> 1.0x). Two copies remain at the
    peak, while tf2onnx makes its ONNX tensors from the constants' bytes; a constant past
    HUGE_CONSTANT_BYTES is written to the data file before (`huge_constants_to_file`).

    tf2onnx's `convert.from_function` is not used: it takes every placeholder of the traced
    function as a graph input, and a Keras 3 layer that keeps constants as plain tensors
    (Normalization's mean and variance, given or adapted) is traced with those tensors captured
    as placeholders. Freezing turns them into constants, yet `from_function` still declares
    them graph inputs (EfficientNet and ConvNeXt lost every ONNX candidate that way). Here the
    graph inputs are the arguments alone, and the same stages run as in `from_function`.
    """
    import tensorflow as tf

    from . import tf2onnx_ops  # noqa: F401  (registers the conversions tf2onnx lacks)

    logging.getLogger("tf2onnx").setLevel(logging.ERROR)  # its INFO lines drown progress
    # A function's arguments come first in `inputs`, its captures after them.
    input_names = [tensor.name for tensor in concrete.inputs[: len(specs)]]
    output_names = [tensor.name for tensor in concrete.outputs]
    renames = {name: spec.name for name, spec in zip(input_names, specs, strict=True)}
    notes: list[str] = []  # the rewrites of the last conversion

    def onnx_graph() -> Any:
        # Frozen afresh on each call (a second one only where an optimizer pass failed), so
        # that each intermediate goes once the next step holds what it needs of it.
        held: list[np.ndarray] | None = [] if large else None
        graph_def = frozen_graph_def(concrete, input_names, output_names, not large, held)
        graph_def, notes[:] = rewrite_for_onnx(graph_def)
        const_values = None
        if large:  # the constants' bytes out of the GraphDef before its import
            graph_def, const_values = compressed_graph_def(graph_def, output_names, held)
            del held
            release_freed_memory()  # the GraphDef with the weights, gone now
        with tf.Graph().as_default() as tf_graph:
            tf.import_graph_def(graph_def, name="")
            del graph_def  # TensorFlow's graph holds it now
            external = {}
            if data_path is not None and const_values:
                external = huge_constants_to_file(tf_graph, const_values, data_path)
            return _tf2onnx_graph(
                tf_graph, input_names, output_names, renames, const_values, external
            )

    with tf.device("/cpu:0"), Tf2onnxErrors() as errors:
        graph = _optimized(onnx_graph)
    if rewritten is not None:
        rewritten.extend(notes)
    if data_path is not None:
        constants_to_file(graph, data_path)
    # Not tf2onnx's ExternalTensorStorage: it calls numpy's np.product, gone in numpy 2. The
    # ModelProto holds the weights in memory (only serializing stops at 2 GB); past 2 GB,
    # external_export moves them into model.onnx.data tensor by tensor.
    model_proto = graph.make_model(f"converted from {concrete.name}")
    del graph
    raise_on_unconverted(model_proto, errors.failed_nodes)
    speed_up(model_proto)  # exact rewrites where ONNX Runtime runs tf2onnx's forms slowly
    return model_proto


def _tf2onnx_graph(
    tf_graph: Any,
    input_names: list[str],
    output_names: list[str],
    renames: dict[str, str],
    const_values: dict[str, bytes | memoryview] | None,
    external: dict[str, Any] | None = None,
) -> Any:
    """tf2onnx's `process_tf_graph` (as `from_function` calls it), its two stages run here so
    that the constants' bytes (`const_values`, emptied) go once the first has made them ONNX
    tensors, and with the constants' NodeProtos left stale at the end of the second (every
    other node's updated as tf2onnx does): tf2onnx's `Graph.update_proto` copies each weight
    into its node's protobuf, a second copy of every weight (protobuf's arena keeps the first,
    which the node's attributes point into). `Graph.make_graph` updates them once at the end
    (as after the optimizer passes, see `_without_proto_updates`); a constant has no subgraph
    whose update could differ. Where tf2onnx lacks the stages, its `process_tf_graph`.
    """
    from tf2onnx import tfonnx

    stages = ("clear_functions", "graphs_from_tf", "process_graphs")
    if not all(hasattr(tfonnx, name) for name in stages):
        return tfonnx.process_tf_graph(
            tf_graph,
            continue_on_error=True,  # as from_function: unconverted ops are found below
            opset=OPSET,
            input_names=input_names,
            output_names=output_names,
            tensors_to_rename=renames,
            const_node_values=const_values,
        )
    from tf2onnx import tf_utils

    tfonnx.clear_functions()
    with patching.held():  # no other thread's patches of these functions in between
        to_tensor = tf_utils.tf_to_onnx_tensor
        tensors = {}
        if external:  # the huge constants: their TensorProtos, the bytes already in the file

            def to_onnx_tensor(tensor: Any, name: str = "") -> Any:
                found = external.get(name)
                return to_tensor(tensor, name) if found is None else copy.deepcopy(found)

            tensors["tf_to_onnx_tensor"] = to_onnx_tensor
        functions = {}
        if not tf_graph._functions:  # noqa: SLF001  (what resolve_functions itself reads)
            # tf2onnx's resolve_functions makes every node an ONNX node, without the
            # constants' bytes, only to list the graph's functions: each constant taken out
            # of the GraphDef then becomes zeros of its shape (one more copy of the weights),
            # and a constant past 2 GB (a 2.46 GB embedding table) fails to be one
            # ("EncodeError: Failed to serialize proto"). A graph without functions has none
            # to list.
            functions["resolve_functions"] = lambda graph: []
        with patching.patched(tf_utils, tensors), patching.patched(tfonnx, functions):
            main, subgraphs = tfonnx.graphs_from_tf(
                tf_graph, input_names, output_names, const_node_values=const_values
            )
    if const_values:
        const_values.clear()  # the ONNX tensors of tf2onnx's graph hold them now
        release_freed_memory()
    for graph in [main, *subgraphs]:
        graph.set_config(None, OPSET, None)

    def update_proto(external_tensor_storage: Any = None) -> None:
        for node in main.get_nodes():
            if not node.is_const():
                node.update_proto(external_tensor_storage)

    main.update_proto = update_proto
    try:
        return tfonnx.process_graphs(
            main,
            subgraphs,
            custom_op_handlers=None,
            inputs_as_nchw=[],
            outputs_as_nchw=[],
            continue_on_error=True,  # as from_function: unconverted ops are found below
            custom_rewriter=None,
            initialized_tables=None,
            tensors_to_rename=renames,
        )
    finally:
        del main.update_proto  # tf2onnx's again, for make_graph


def _optimized(onnx_graph: Callable[[], Any]) -> Any:
    """tf2onnx's ONNX optimizers run over the converted graph, in place.

    tf2onnx's converter deep-copies the graph before each optimizer pass to skip a pass that
    raises (`catch_errors`); the copies were about a fifth of MobileNetV2's conversion. They
    are made here only if a pass raised, on a graph converted afresh, which gives the same
    result as tf2onnx's. The passes also skip tf2onnx's rewrite of every node's protobuf after
    each pass (`_without_proto_updates`).
    """
    from tf2onnx import optimizer

    graph = onnx_graph()
    try:
        # Where tf2onnx's private `_get_optimizers` or a pass's `_optimize` moved, this
        # raises, and its own passes (with their protobuf updates) run below instead.
        tf2onnx_passes = optimizer._get_optimizers().items()
        passes = {name: _without_proto_updates(make) for name, make in tf2onnx_passes}
        return optimizer.optimize_graph(graph, catch_errors=False, optimizers=passes)
    except Exception as exc:  # a pass of tf2onnx failed: redo with the failing passes skipped
        logging.getLogger("tf2onnx").debug("optimizer pass failed, converting again: %s", exc)
        return optimizer.optimize_graph(onnx_graph(), catch_errors=True)


def _without_proto_updates(make_pass: Callable[[], Any]) -> Callable[[], Any]:
    """A tf2onnx optimizer pass that leaves the nodes' protobufs stale.

    After every pass tf2onnx copies each node's inputs, outputs and attributes back into its
    NodeProto (`Graph.update_proto`), constants' weights included: 24 copies of ResNet50's
    100 MB, 2.6 s of its 6.3 s export. The passes read the nodes' own fields, never the
    protobufs, and `Graph.make_graph` updates every NodeProto once at the end: the same ops
    in the same order, the same initializers, the same outputs (tests/export/test_export.py checks
    it; only the names tf2onnx numbers from a process-wide counter differ, as between any
    two of its own conversions).
    """

    def make() -> Any:
        optimizer_pass = make_pass()

        def optimize(graph: Any, iteration: int) -> Any:
            # GraphOptimizerBase.optimize without update_proto() and its statistics log
            optimizer_pass.opt_iteration = iteration
            graph = optimizer_pass._optimize(graph)
            graph.delete_unused_nodes(graph.outputs)
            return graph

        optimizer_pass.optimize = optimize
        return optimizer_pass

    return make
