"""A saved result behind named tensors: what Ray Data, Ray Serve and Triton's Python backend call.

Servers speak in named tensors (Ray Data columns, Open Inference Protocol inputs, Triton
tensors); infertune's callable speaks in the model's own form (an array, a list, a dict).
`ServedModel` maps one to the other with the names infertune already uses: the model's input
names (`x` for a single array, dict keys, `input[0]` ... for a list), and its output names
(`output` for a single array, dict keys, `output[0]` ... for a list). The same names appear in
`opt.input_signature` and in the Triton export.

Requests that arrive together are run as one batch where the model allows it (a free batch
dimension, outputs batched along it): concatenated along axis 0, run once, split back.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from ..structure import Structure, flatten

__all__ = ["ServedModel", "TensorSpec", "output_names"]


@dataclass(frozen=True)
class TensorSpec:
    """One named input or output: dtype and shape, None where any size is accepted."""

    name: str
    dtype: np.dtype
    shape: tuple[int | None, ...]

    def describe(self) -> str:
        dims = ", ".join("None" if d is None else str(d) for d in self.shape)
        return f"{self.name}: ({dims}{',' if len(self.shape) == 1 else ''}) {self.dtype.name}"


def output_names(structure: Structure) -> list[str]:
    """The names of a model's flat outputs: `output`, dict keys, or `output[0]`, ..."""
    return structure.leaf_names("" if structure.kind == "dict" else "output")


class ServedModel:
    """A result saved with `Optimized.save()`, loaded once, called with named arrays.

    Loading runs the model twice on random inputs drawn like the tuning sample (at its batch
    size and one more): a warm-up, so that the first request does not pay for it, and the
    output shapes, which servers publish (dimensions that change with the batch are None;
    with free non-batch input dimensions, every non-batch output dimension is None too,
    since which ones follow them is not known).
    """

    def __init__(self, path: str | os.PathLike):
        from ..saving import load

        self.path = Path(path)
        self.result = load(self.path, verbose=False)
        signature = self.result.input_signature
        self.inputs = [TensorSpec(spec.name, spec.dtype, spec.shape) for spec in signature.specs]
        self.batch_is_dynamic = signature.batch_is_dynamic
        self._pack = signature.structure.pack
        self.outputs = self._probe_outputs(signature)
        # Requests can share one run when every output is batched along axis 0 with the inputs.
        self.batches_requests = self.batch_is_dynamic and all(
            spec.shape and spec.shape[0] is None for spec in self.outputs
        )

    @property
    def backend(self) -> str:
        """The chosen candidate, e.g. "onnxruntime-cpu"."""
        return self.result.backend

    def describe_inputs(self) -> str:
        return "; ".join(spec.describe() for spec in self.inputs)

    def _probe_outputs(self, signature) -> list[TensorSpec]:
        rng = np.random.default_rng(0)
        first = self.run(signature.random_inputs(rng))
        shapes = [list(array.shape) for array in first]
        if self.batch_is_dynamic and signature.sample_batch is not None:
            again = self.run(signature.random_inputs(rng, batch=signature.sample_batch + 1))
            for shape, array in zip(shapes, again):
                for axis, size in enumerate(array.shape):
                    if axis < len(shape) and shape[axis] != size:
                        shape[axis] = None
        free_features = any(None in spec.shape[1:] for spec in self.inputs)
        if free_features:
            shapes = [shape[:1] + [None] * (len(shape) - 1) for shape in shapes]
        names = output_names(self.result.output_structure)
        return [
            TensorSpec(name, array.dtype, tuple(shape))
            for name, array, shape in zip(names, first, shapes)
        ]

    # -- calls ---------------------------------------------------------------------------
    def check(self, named: Mapping[str, Any], *, cast: bool, kind: str = "input") -> list:
        """The model's inputs from `named` (a name -> array mapping), in the model's order.

        Every input must be there with the model's rank and fixed dimensions, and all with
        one batch size. With `cast`, dtypes are cast as the model's own call would (float64
        to float32, int64 to int32; never across kinds); without it they must match exactly,
        as the Open Inference Protocol asks. Names the model does not take are the caller's
        business. Raises InputError naming what was received and what is expected; `kind`
        says what the names are ("input", "column").
        """
        missing = [spec.name for spec in self.inputs if spec.name not in named]
        if missing:
            raise InputError(
                f"Missing {kind}{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}"
                f" (received {sorted(map(str, named)) or 'none'}). The model takes: "
                f"{self.describe_inputs()}."
            )
        arrays = [self._checked(spec, named[spec.name], cast, kind) for spec in self.inputs]
        batches = {array.shape[0] for array in arrays if array.ndim}
        if len(batches) > 1:
            sizes = ", ".join(f"{s.name} {a.shape[0]}" for s, a in zip(self.inputs, arrays))
            raise InputError(f"The {kind}s have different batch sizes ({sizes}); they must agree.")
        return arrays

    def _checked(self, spec: TensorSpec, value: Any, cast: bool, kind: str) -> np.ndarray:
        array = np.asarray(value)
        if array.dtype != spec.dtype:
            same_kind = np.can_cast(array.dtype, spec.dtype, casting="same_kind") and (
                (array.dtype.kind == "b") == (spec.dtype.kind == "b")
            )
            if not (cast and same_kind):
                raise InputError(
                    f"{kind.capitalize()} '{spec.name}' has dtype {array.dtype.name}; the model "
                    f"takes {spec.dtype.name} ({spec.describe()})."
                )
            array = array.astype(spec.dtype)
        fits = array.ndim == len(spec.shape) and all(
            want is None or want == got for want, got in zip(spec.shape, array.shape)
        )
        if not fits:
            raise InputError(
                f"{kind.capitalize()} '{spec.name}' has shape {tuple(array.shape)}; the model "
                f"takes {spec.describe()} (None: any size)."
            )
        return array

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """One batch: checked inputs in the model's order; the outputs, flat, as numpy."""
        leaves, _ = flatten(self.result(self._pack(list(arrays))))
        return [np.asarray(leaf) for leaf in leaves]

    def run_batch(
        self,
        requests: Sequence[Sequence[np.ndarray]],
        record: Callable[[int, int], None] | None = None,
    ) -> list[list[np.ndarray]]:
        """Several requests' checked inputs; each request's outputs, in order.

        Requests whose non-batch shapes agree run as one concatenated batch where the model
        batches them (`batches_requests`); the others run one by one. `record(samples, ns)`,
        if given, is called after each run of the model with its batch size and duration.
        """
        if len(requests) == 1 or not self.batches_requests:
            groups = [[index] for index in range(len(requests))]
        else:
            by_shape: dict[tuple, list[int]] = {}
            for index, request in enumerate(requests):
                by_shape.setdefault(tuple(a.shape[1:] for a in request), []).append(index)
            groups = list(by_shape.values())
        results: list[list[np.ndarray]] = [[] for _ in requests]
        for indices in groups:
            if len(indices) == 1:
                joined = list(requests[indices[0]])
            else:
                joined = [
                    np.concatenate([requests[i][k] for i in indices])
                    for k in range(len(self.inputs))
                ]
            start = time.perf_counter_ns()
            outputs = self.run(joined)
            if record is not None:
                record(joined[0].shape[0] if joined and joined[0].ndim else 1,
                       time.perf_counter_ns() - start)  # fmt: skip
            if len(indices) == 1:
                results[indices[0]] = outputs
                continue
            bounds = np.cumsum([requests[i][0].shape[0] for i in indices])[:-1]
            parts = [np.split(output, bounds) for output in outputs]
            for position, index in enumerate(indices):
                results[index] = [part[position] for part in parts]
        return results

    def close(self) -> None:
        self.result.close()
