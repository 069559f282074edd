"""The model's outputs as servers publish them: names, dtypes and shapes (None where a
dimension changes from call to call). Plain data: saved in the manifest, read without running
the model (the Triton export, the served endpoint's metadata)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .structure import Structure

__all__ = ["OutputSignature", "TensorSpec"]


@dataclass(frozen=True)
class TensorSpec:
    """One named input or output: dtype and shape, None where any size is accepted."""

    name: str
    dtype: np.dtype
    shape: tuple[int | None, ...]

    def describe(self) -> str:
        dims = ", ".join("None" if d is None else str(d) for d in self.shape)
        kind = "string" if self.dtype.kind == "O" else self.dtype.name
        return f"{self.name}: ({dims}{',' if len(self.shape) == 1 else ''}) {kind}"

    def to_dict(self) -> dict:
        return {"name": self.name, "dtype": self.dtype.name, "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, data: dict) -> TensorSpec:
        return cls(data["name"], np.dtype(data["dtype"]), tuple(data["shape"]))


@dataclass(frozen=True)
class OutputSignature:
    """The output structure (to rebuild the model's form) and one TensorSpec per flat output.

    Names: `output` for a single array, dict keys, `output[0]` ... for a list: the names the
    served model, Ray Data and the Triton export use."""

    structure: Structure
    specs: tuple[TensorSpec, ...]

    @property
    def dtypes(self) -> list[np.dtype]:
        return [spec.dtype for spec in self.specs]

    @property
    def names(self) -> list[str]:
        return [spec.name for spec in self.specs]

    @staticmethod
    def names_of(structure: Structure) -> list[str]:
        return structure.leaf_names("" if structure.kind == "dict" else "output")

    @classmethod
    def observed(
        cls,
        structure: Structure,
        calls: Sequence[Sequence[np.ndarray]],
        free_features: bool,
    ) -> OutputSignature:
        """From the flat outputs of calls at different input shapes (the first at the
        sample's): a dimension that differs between them is None. With free non-batch input
        dimensions, every non-batch output dimension is None, since which ones follow them
        is not known from a few calls."""
        first = calls[0]
        shapes = [list(array.shape) for array in first]
        for outputs in calls[1:]:
            for shape, array in zip(shapes, outputs):
                for axis, size in enumerate(array.shape):
                    if axis < len(shape) and shape[axis] != size:
                        shape[axis] = None
        if free_features:
            shapes = [shape[:1] + [None] * (len(shape) - 1) for shape in shapes]
        names = cls.names_of(structure)
        specs = tuple(
            TensorSpec(name, array.dtype, tuple(shape))
            for name, array, shape in zip(names, first, shapes)
        )
        return cls(structure, specs)

    def to_dict(self) -> dict:
        return {
            "structure": self.structure.to_dict(),
            "specs": [spec.to_dict() for spec in self.specs],
        }

    @classmethod
    def from_dict(cls, data: dict) -> OutputSignature:
        """From `to_dict()`; raises KeyError where the specs are missing (format version 1
        saved the structure and dtypes only: result/saved.py migrates it)."""
        return cls(
            Structure.from_dict(data["structure"]),
            tuple(TensorSpec.from_dict(spec) for spec in data["specs"]),
        )
