"""The callable optimize() returns: the chosen backend behind the model's own call form."""

from __future__ import annotations

from typing import Any

from .backends.base import Backend
from .inputs import InputSignature
from .report import Report
from .structure import Structure

__all__ = ["Optimized"]


class Optimized:
    """A drop-in replacement for `model(x)`: same inputs, same output structure, numpy outputs.

    Inputs are checked against the signature the model was tuned for; a wrong rank, dtype
    or feature shape raises `infertune.InputError` (a ValueError) naming the input.
    """

    def __init__(
        self, backend: Backend, signature: InputSignature, outputs: Structure, report: Report
    ):
        self._backend = backend
        self._run = backend.run
        self._flatten = signature.flatten
        self._pack = outputs.packer()
        self.input_signature = signature
        self.output_structure = outputs
        self.report = report

    def __call__(self, x: Any) -> Any:
        return self._pack(self._run(self._flatten(x)))

    @property
    def backend(self) -> str:
        """Name of the chosen candidate, e.g. "onnxruntime-cpu"."""
        return self._backend.name

    def close(self) -> None:
        """Release the runtime's resources; the object cannot be called afterwards."""
        self._backend.close()

    def __repr__(self) -> str:
        return f"<Optimized backend={self.backend!r} inputs=[{self.input_signature.describe()}]>"
