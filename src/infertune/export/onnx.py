"""TensorFlow/Keras -> ONNX, done once per optimize() and shared by every ONNX-based backend.

tf2onnx's `from_keras` fails on Keras 3 models (KeyError 'keras_tensor_N', tf2onnx #2448),
so the model is traced as a tf.function of flat inputs, frozen and converted with tf2onnx's
stages (those of its `from_function`, see `_to_onnx`), which works for Keras 3, tf_keras,
tf.Module and SavedModel functions alike.

Past 2 GB. Protocol buffers stop at 2 GiB, and a frozen GraphDef or an ONNX ModelProto holds
the weights inside it. A model whose weights pass `external_data_bytes()` (1 GiB, below the
limit with room for the graph; INFERTUNE_EXTERNAL_DATA_BYTES lowers it for tests) is exported
as tf2onnx's `large_model` does: frozen without grappler (which serializes the GraphDef), its
constants taken out of the GraphDef before TensorFlow imports it, and the ONNX weights
written as external data: model.onnx (the graph alone) and model.onnx.data beside it, in a
temporary directory that lives as long as the export. ONNX Runtime and OpenVINO load the
pair from its path (both map the data file rather than copy it where they can); a saved
result carries both files. Models past sizes.LEAN_CONVERSION_MIN_BYTES (256 MB) take the same path
for memory (grappler copies the GraphDef several times; every session maps one data file),
and grappler's where it fails.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import one_line
from ..model.sizes import HUGE_CONSTANT_BYTES
from ..model.source import tensor_specs
from ..model.target import Target
from ..system.paths import (
    link_or_copy,
    remove_with,
)
from ..system.resources import release_freed_memory
from . import patching
from .rewrites import held_apart, rewrite_for_onnx

__all__ = [
    "DATA_FILE",
    "ONNX_FILE",
    "OPSET",
    "OnnxExport",
    "convert_to_onnx",
    "external_export",
    "in_memory_export",
    "owned_export",
    "temporary_directory",
    "read_onnx",
    "write_onnx",
]

OPSET = 17
ONNX_FILE = "model.onnx"  # the saved artifact of every ONNX-based candidate (Triton's name too)
DATA_FILE = "model.onnx.data"  # its weights, where they are external data (past 2 GB)
_ALIGN = 1 << 16  # offsets of external tensors: a page multiple, so that runtimes can map them


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


def write_external_data(model_proto: Any, data_path: Path, min_bytes: int = 1024) -> None:
    """Move the bytes of every tensor of more than `min_bytes` into one file at aligned
    offsets, pointing the tensors at it (location, offset, length), as onnx's
    convert_model_to_external_data does, with offsets a runtime can map."""
    from onnx.external_data_helper import _get_all_tensors

    with open(data_path, "ab") as data:
        for tensor in _get_all_tensors(model_proto):
            _to_file(tensor, data, min_bytes)


def _to_file(tensor: Any, data: Any, min_bytes: int = 1024) -> None:
    """A TensorProto's bytes appended to the open data file at an aligned offset, the
    tensor pointing at them; nothing for a tensor of `min_bytes` or less."""
    if not tensor.HasField("raw_data") or len(tensor.raw_data) <= min_bytes:
        return
    content = tensor.raw_data
    tensor.ClearField("raw_data")
    _point_at(tensor, _append_aligned(data, content), len(content))


def _append_aligned(data: Any, content: bytes | memoryview) -> int:
    """`content` appended to the open data file at the next aligned offset; that offset."""
    end = data.seek(0, os.SEEK_END)
    offset = end + (-end % _ALIGN)
    data.write(b"\0" * (offset - end))
    data.write(content)
    return offset


def _point_at(tensor: Any, offset: int, length: int) -> None:
    """The TensorProto's bytes are `length` bytes at `offset` of the data file."""
    tensor.data_location = tensor.EXTERNAL
    del tensor.external_data[:]
    for key, value in (("location", DATA_FILE), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


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
    of tf2onnx's graph written to `data_path` before the ModelProto is made. On a
    BERT-base-sized model the export's peak went from 12x the weights (grappler copies the
    GraphDef several times) to 4.4x, then to 2.3-2.6x with each intermediate gone once the
    next step holds what it needs of it: the GraphDef with the weights after `_compressed`,
    the constants' bytes once tf2onnx made them ONNX tensors, no second copy of the weights
    in the NodeProtos (`_tf2onnx_graph`), freed memory handed back between the steps; the
    weights kept apart while TensorFlow freezes (`_weights_apart`: the 2.46 GB recommender's
    export 4.0x -> 1.0x). Two copies remain at the peak, while tf2onnx makes its ONNX tensors
    from the constants' bytes; a constant past HUGE_CONSTANT_BYTES is written to the data
    file before (`_huge_to_file`).

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
        graph_def = _frozen_graph_def(concrete, input_names, output_names, not large, held)
        graph_def, notes[:] = rewrite_for_onnx(graph_def)
        const_values = None
        if large:  # the constants' bytes out of the GraphDef before its import
            graph_def, const_values = _compressed(graph_def, output_names, held)
            del held
            release_freed_memory()  # the GraphDef with the weights, gone now
        with tf.Graph().as_default() as tf_graph:
            tf.import_graph_def(graph_def, name="")
            del graph_def  # TensorFlow's graph holds it now
            external = {}
            if data_path is not None and const_values:
                data_path.write_bytes(b"")  # what an earlier try wrote is not referenced
                external = _huge_to_file(tf_graph, const_values, data_path)
            return _tf2onnx_graph(
                tf_graph, input_names, output_names, renames, const_values, external
            )

    with tf.device("/cpu:0"), _Tf2onnxErrors() as errors:
        graph = _optimized(onnx_graph)
    if rewritten is not None:
        rewritten.extend(notes)
    if data_path is not None:
        _constants_to_file(graph, data_path)
    # Not tf2onnx's ExternalTensorStorage: it calls numpy's np.product, gone in numpy 2. The
    # ModelProto holds the weights in memory (only serializing stops at 2 GB); past 2 GB,
    # external_export moves them into model.onnx.data tensor by tensor.
    model_proto = graph.make_model(f"converted from {concrete.name}")
    del graph
    _raise_on_unconverted(model_proto, errors.failed_nodes)
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


def _huge_to_file(
    tf_graph: Any, const_values: dict[str, bytes | memoryview], data_path: Path
) -> dict[str, Any]:
    """Each constant past HUGE_CONSTANT_BYTES written to the data file and taken out of
    `const_values`; its ONNX TensorProto (shape, type, where its bytes are) by tensor name."""
    import onnx
    from tf2onnx.tf_utils import map_tf_dtype

    external = {}
    with open(data_path, "ab") as data:
        for name in [n for n, v in const_values.items() if len(v) > HUGE_CONSTANT_BYTES]:
            output = tf_graph.get_operation_by_name(name).outputs[0]
            content = const_values.pop(name)
            tensor = onnx.TensorProto(
                name=f"{name}:0", dims=output.shape.as_list(), data_type=map_tf_dtype(output.dtype)
            )
            _point_at(tensor, _append_aligned(data, content), len(content))
            external[tensor.name] = tensor
            del content
    return external


def _constants_to_file(graph: Any, data_path: Path) -> None:
    """Each constant of tf2onnx's graph of more than 1 KB written to the data file, the
    tensor pointing at it (make_model then copies no weight)."""
    with open(data_path, "ab") as data:
        for node in graph.get_nodes():
            if node.is_const():
                _to_file(node.get_attr("value").t, data)


def _frozen_graph_def(
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
    the mark (rewrites.held_apart). TensorFlow's own freezing copies every weight into a
    TensorProto, and that into the node (a 2.46 GB embedding table took the export to 4x
    the weights while it froze); `_compressed` takes them out again anyway. Other threads'
    TensorProtos are made as always."""
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


def _compressed(
    graph_def: Any, output_names: list[str], held: list[np.ndarray] | None = None
) -> tuple[Any, dict[str, bytes | memoryview]]:
    """tf2onnx's `compress_graph_def` on a copy: a GraphDef whose constants of more than 1000
    bytes are empty, and their bytes by node name. Clearing them in place (as tf2onnx does)
    frees nothing while the message lives (protobuf's arena keeps them), so the copy is made
    node by node and the original goes. The Identity each frozen variable read leaves on its
    constant is dropped (its consumers read the constant): tf2onnx folds such an Identity
    through TensorFlow, which made a second copy of every weight."""
    from tf2onnx.tf_utils import compress_graph_def

    values: dict[str, bytes | memoryview] = {}
    big = {
        node.name
        for node in graph_def.node
        if node.op == "Const"
        and (held_apart(node) or len(node.attr["value"].tensor.tensor_content) > 1000)
    }
    outputs = {name.split(":")[0] for name in output_names}
    reads = {  # Identity node -> the constant it reads
        node.name: node.input[0]
        for node in graph_def.node
        if node.op == "Identity"
        and len(node.input) == 1
        and node.input[0] in big
        and node.name not in outputs
    }
    small = type(graph_def)()
    small.versions.CopyFrom(graph_def.versions)
    small.library.CopyFrom(graph_def.library)
    for node in graph_def.node:
        if node.name in reads:
            continue
        copy = small.node.add()
        if node.name in big:
            tensor = node.attr["value"].tensor
            if held_apart(node):  # the array TensorFlow read: bytes now, the array goes
                array = np.ascontiguousarray(held[-tensor.version_number - 1])
                held[-tensor.version_number - 1] = None
                # A constant HUGE_CONSTANT_BYTES goes to the data file from the array itself.
                huge = array.nbytes > HUGE_CONSTANT_BYTES
                values[node.name] = memoryview(array).cast("B") if huge else array.tobytes()
                del array
                tensor.version_number = 0
            else:
                values[node.name] = tensor.tensor_content
                tensor.ClearField("tensor_content")
        copy.CopyFrom(node)
        for i, name in enumerate(copy.input):
            control = name.startswith("^")
            source, _, port = name.lstrip("^").partition(":")
            if source in reads and port in ("", "0"):
                copy.input[i] = ("^" if control else "") + reads[source]
    del graph_def
    values.update(compress_graph_def(small))  # whatever this missed (none expected)
    return small, values


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
    in the same order, the same initializers, the same outputs (tests/test_export.py checks
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


class _Tf2onnxErrors(logging.Handler):
    """The nodes tf2onnx failed to convert, from its log: it logs a failing op handler and goes
    on (as `from_function` does), leaving the node half-converted in the graph.

    While it is attached, tf2onnx's logger has a handler, so Python no longer prints its
    errors to stderr: what matters of them becomes the reason the export raises with.
    """

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.failed_nodes: dict[str, str] = {}  # node name -> the handler's error
        self._thread = threading.get_ident()  # another optimize() may convert at the same time

    def emit(self, record: logging.LogRecord) -> None:
        # tf2onnx logs ("Failed to convert node %r (fct=%r)\n%r", name, handler, summary).
        failed = str(record.msg).startswith("Failed to convert node") and record.args
        if record.thread != self._thread or not failed:
            return
        exc = record.exc_info[1] if record.exc_info else None
        why = one_line(exc).split(": ", 1)[-1] if exc else "its handler failed"
        self.failed_nodes[str(record.args[0])] = why

    def __enter__(self) -> _Tf2onnxErrors:
        logging.getLogger("tf2onnx").addHandler(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        logging.getLogger("tf2onnx").removeHandler(self)


# Domains whose ops onnx.defs knows; tf2onnx also emits com.microsoft and ai.onnx.contrib ops
# on purpose (runtimes that lack them say so when loading the model).
_STANDARD_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")


def _raise_on_unconverted(model_proto: Any, failed_nodes: dict[str, str]) -> None:
    """Raise, naming the ops and where they are, if tf2onnx left TensorFlow ops in the graph."""
    import onnx

    unknown: dict[str, list[str]] = {}  # op type -> node names
    for node in _all_nodes(model_proto.graph):
        if node.domain in _STANDARD_DOMAINS and not onnx.defs.has(node.op_type, node.domain):
            unknown.setdefault(node.op_type, []).append(node.name)
    if unknown:
        ops = ", ".join(
            f"{op} ({_nodes_text(names)}{_why(failed_nodes, names[0])})"
            for op, names in unknown.items()
        )
        kind = "op" if len(unknown) == 1 else "ops"
        raise RuntimeError(f"tf2onnx cannot convert the TensorFlow {kind} {ops}")
    if failed_nodes:
        node, error = next(iter(failed_nodes.items()))
        more = f" and {len(failed_nodes) - 1} more node(s)" if len(failed_nodes) > 1 else ""
        raise RuntimeError(f"tf2onnx failed to convert node {node}{more}: {error}")


def _why(failed_nodes: dict[str, str], node: str) -> str:
    """`: the error` of tf2onnx's handler where one failed on the node, else nothing."""
    return f": {failed_nodes[node]}" if node in failed_nodes else ""


def _nodes_text(names: list[str]) -> str:
    """`at scope/op`, or `3 nodes, first at scope/op`: the node's scope names the layer."""
    if len(names) == 1:
        return f"at {names[0]}"
    return f"{len(names)} nodes, first at {names[0]}"


def _all_nodes(graph: Any) -> Iterator[Any]:
    """Every node of an ONNX graph, with those of the subgraphs of If/Loop/Scan nodes."""
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            if attribute.HasField("g"):
                yield from _all_nodes(attribute.g)
            for subgraph in attribute.graphs:
                yield from _all_nodes(subgraph)
