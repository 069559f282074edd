"""The model of Triton's Python backend that export_triton(..., backend="python") writes.

Triton loads `model.py` from the model's version directory, and that file imports
`TritonPythonModel` from here. Triton's dynamic batcher hands `execute` several requests at
once; they run as one batch of the model where it allows (ServedModel.run_batch). A request
that does not fit gets its own error response (`TritonError`) and the others are answered:
nothing is raised through Triton's loop.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError, one_line
from .served import ServedModel
from .triton import PYTHON_RESULT_DIR

__all__ = ["TritonPythonModel"]


class TritonPythonModel:
    """initialize / execute / finalize, as Triton's Python backend calls them."""

    def initialize(self, args: dict) -> None:
        """Load the saved result beside model.py (once per model instance)."""
        path = Path(args["model_repository"]) / args["model_version"] / PYTHON_RESULT_DIR
        self._model = ServedModel(path)

    def execute(self, requests: list) -> list:
        """One response per request, in order: outputs, or an error for that request."""
        import numpy as np
        import triton_python_backend_utils as pb_utils  # only inside Triton's Python backend

        responses: list = [None] * len(requests)
        valid, inputs = [], []
        for index, request in enumerate(requests):
            named = {}
            for spec in self._model.inputs:
                tensor = pb_utils.get_input_tensor_by_name(request, spec.name)
                if tensor is not None:
                    named[spec.name] = tensor.as_numpy()
            try:
                inputs.append(self._model.check(named, cast=False))
            except InputError as exc:
                responses[index] = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))
                continue
            valid.append(index)
        if not valid:
            return responses
        try:
            outputs = self._model.run_batch(inputs)
        except Exception as exc:  # the model failed on valid inputs: every request in it is told
            error = pb_utils.TritonError(f"The model failed on this batch: {one_line(exc)}")
            for index in valid:
                responses[index] = pb_utils.InferenceResponse(error=error)
            return responses
        specs = self._model.outputs
        for index, arrays in zip(valid, outputs):
            tensors = [
                pb_utils.Tensor(spec.name, np.ascontiguousarray(array))
                for spec, array in zip(specs, arrays)
            ]
            responses[index] = pb_utils.InferenceResponse(output_tensors=tensors)
        return responses

    def finalize(self) -> None:
        self._model.close()
