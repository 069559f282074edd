"""The model's outputs as an infer response: JSON, or Triton's binary tensor data where the
request asked for it. Outputs are numbers only (`check_outputs`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ModelError
from .served import ServedModel, TensorSpec
from .wire import BINARY_HEADER, VERSION, datatype

if TYPE_CHECKING:
    from .decoding import InferRequest

__all__ = ["check_outputs", "encode_response"]


def check_outputs(outputs: Sequence[TensorSpec]) -> None:
    """Raises ModelError where the model has string outputs: the server sends numbers only."""
    strings = [spec.name for spec in outputs if spec.dtype.kind == "O"]
    if strings:
        raise ModelError(
            f"The model's output{'s' if len(strings) > 1 else ''} "
            f"{', '.join(map(repr, strings))} {'are' if len(strings) > 1 else 'is'} strings: "
            f"infertune's Open Inference Protocol server sends numeric outputs only (BYTES "
            f"outputs are not supported). Serve a model whose outputs are numbers (keep the "
            f"string postprocessing, e.g. StringLookup(invert=True), in the client), or call "
            f"the result from Python (infertune.load)."
        )


def encode_response(
    name: str, model: ServedModel, request: InferRequest, outputs: Sequence[np.ndarray]
) -> tuple[bytes, dict[str, str]]:
    """The response body and its headers for `request`, from the model's flat outputs."""
    tensors, chunks = [], []
    for index, binary in request.outputs:
        array = np.asarray(outputs[index])
        tensor = {
            "name": model.outputs[index].name,
            "datatype": datatype(array.dtype),
            "shape": list(array.shape),
        }
        if binary:
            data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
            tensor["parameters"] = {"binary_data_size": len(data)}
            chunks.append(data)
        else:
            tensor["data"] = array.reshape(-1).tolist()
        tensors.append(tensor)
    response = {"model_name": name, "model_version": VERSION, "outputs": tensors}
    if request.id is not None:
        response["id"] = request.id
    header = json.dumps(response).encode()
    if not chunks:
        return header, {"Content-Type": "application/json"}
    headers = {"Content-Type": "application/octet-stream", BINARY_HEADER: str(len(header))}
    return b"".join([header, *chunks]), headers
