"""What a backend tells the Triton export (deploy/triton.py) about its saved artifact: the
Triton backend or platform that serves it, the tensors, how to fill the version directory,
and which tuned settings carry over. Each backend that Triton serves writes its own plan
(`Backend.triton_plan`); the export only writes config.pbtxt from it.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ExportError
from ..model.inputs import InputSignature
from ..model.outputs import OutputSignature

__all__ = ["TritonPlan", "TritonTensor", "copy_file", "copy_onnx", "model_names", "onnx_tensors"]

_TYPES = {
    "bool": "TYPE_BOOL",
    "uint8": "TYPE_UINT8",
    "uint16": "TYPE_UINT16",
    "uint32": "TYPE_UINT32",
    "uint64": "TYPE_UINT64",
    "int8": "TYPE_INT8",
    "int16": "TYPE_INT16",
    "int32": "TYPE_INT32",
    "int64": "TYPE_INT64",
    "float16": "TYPE_FP16",
    "bfloat16": "TYPE_BF16",
    "float32": "TYPE_FP32",
    "float64": "TYPE_FP64",
    "object": "TYPE_STRING",
}


@dataclass(frozen=True)
class TritonTensor:
    """One input or output as config.pbtxt names it."""

    name: str
    dtype: str  # numpy dtype name
    dims: tuple[int, ...]  # -1 for a dynamic dimension

    @property
    def data_type(self) -> str:
        if self.dtype not in _TYPES:
            raise ExportError(f"Tensor {self.name!r} has dtype {self.dtype}, which Triton lacks.")
        return _TYPES[self.dtype]


@dataclass
class TritonPlan:
    """How one candidate's saved artifact becomes a Triton model version."""

    backend: str | None  # config `backend`
    platform: str | None  # or config `platform`
    inputs: list[TritonTensor]
    outputs: list[TritonTensor]
    write: Callable[[Path], None]  # fills the version directory
    default_model_filename: str | None = None
    parameters: dict[str, str] = field(default_factory=dict)
    graph_level: int | None = None
    carried: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)  # Triton tensor name -> the model's name


def model_names(
    inputs: InputSignature,
    outputs: OutputSignature,
    triton_inputs: list[str],
    triton_outputs: list[str],
) -> dict[str, str]:
    """Triton's tensor names (flat order) against the model's input names and output names."""
    return {**dict(zip(triton_inputs, inputs.names)), **dict(zip(triton_outputs, outputs.names))}


def onnx_tensors(path: Path) -> tuple[list[TritonTensor], list[TritonTensor]]:
    """Inputs and outputs of an ONNX graph with their dtypes and dims (-1 where symbolic)."""
    import onnx
    from onnx import helper

    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {init.name for init in graph.initializer}

    def tensors(values) -> list[TritonTensor]:
        found = []
        for value in values:
            if value.name in initializers:
                continue
            kind = value.type.tensor_type
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(kind.elem_type)).name
            dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in kind.shape.dim)
            found.append(TritonTensor(value.name, dtype, dims))
        return found

    return tensors(graph.input), tensors(graph.output)


def copy_file(directory: Path, rel: str) -> Callable[[Path], None]:
    """A plan's `write`: the one file `rel` of the artifact into the version directory."""
    return lambda version_dir: shutil.copy2(directory / rel, version_dir / Path(rel).name)


def copy_onnx(directory: Path, settings: dict) -> Callable[[Path], None]:
    """A plan's `write`: model.onnx, and model.onnx.data beside it where the weights are
    external data (past 2 GB: Triton's ONNX Runtime and OpenVINO backends read it there)."""
    rels = [settings["file"]] + ([settings["data_file"]] if settings.get("data_file") else [])

    def write(version_dir: Path) -> None:
        for rel in rels:
            shutil.copy2(directory / rel, version_dir / Path(rel).name)

    return write
