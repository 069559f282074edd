"""The ONNX export's weights as external data: model.onnx (the graph alone) and
model.onnx.data beside it, for a model past 2 GB (protocol buffers stop at 2 GiB) or on the
lean path of a large one (export/onnx.py says when).

Every tensor of more than 1 KB is written to the data file at an offset aligned to a page
multiple, so that ONNX Runtime and OpenVINO can map it rather than copy it
(`write_external_data`). On the lean path the weights leave the protobufs as early as they
can, so that no step holds a copy it does not need: the frozen GraphDef's constants are taken
out of it before TensorFlow imports it (`compressed_graph_def`), a constant past
HUGE_CONSTANT_BYTES goes to the data file from the array TensorFlow read
(`huge_constants_to_file`), and every other constant of tf2onnx's graph before the
ModelProto is made (`constants_to_file`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ..model.sizes import HUGE_CONSTANT_BYTES
from .rewrites_graph import held_apart

__all__ = [
    "DATA_FILE",
    "ONNX_FILE",
    "compressed_graph_def",
    "constants_to_file",
    "huge_constants_to_file",
    "write_external_data",
]

ONNX_FILE = "model.onnx"  # the saved artifact of every ONNX-based candidate (Triton's name too)
DATA_FILE = "model.onnx.data"  # its weights, where they are external data (past 2 GB)
_ALIGN = 1 << 16  # offsets of external tensors: a page multiple, so that runtimes can map them


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


def compressed_graph_def(
    graph_def: Any, output_names: list[str], held: list[np.ndarray] | None = None
) -> tuple[Any, dict[str, bytes | memoryview]]:
    """tf2onnx's `compress_graph_def` on a copy: a GraphDef whose constants of more than 1000
    bytes are empty, and their bytes by node name (a weight held apart while TensorFlow froze,
    export/onnx_freeze.py, from its array in `held`). Clearing them in place (as tf2onnx does)
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
                # A constant past HUGE_CONSTANT_BYTES goes to the data file from the array itself.
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


def huge_constants_to_file(
    tf_graph: Any, const_values: dict[str, bytes | memoryview], data_path: Path
) -> dict[str, Any]:
    """The data file begun afresh (what an earlier try wrote is not referenced), then each
    constant past HUGE_CONSTANT_BYTES written to it (`_huge_to_file`)."""
    data_path.write_bytes(b"")
    return _huge_to_file(tf_graph, const_values, data_path)


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


def constants_to_file(graph: Any, data_path: Path) -> None:
    """Each constant of tf2onnx's graph of more than 1 KB written to the data file, the
    tensor pointing at it (make_model then copies no weight)."""
    with open(data_path, "ab") as data:
        for node in graph.get_nodes():
            if node.is_const():
                _to_file(node.get_attr("value").t, data)
