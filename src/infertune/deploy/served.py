"""A saved result behind named tensors: what Ray Data, Ray Serve and Triton's Python backend call.

Servers speak in named tensors (Ray Data columns, Open Inference Protocol inputs, Triton
tensors); infertune's callable speaks in the model's own form (an array, a list, a dict).
`ServedModel` maps one to the other with the names infertune already uses: the model's input
names (`x` for a single array, dict keys, `input[0]` ... for a list), and its output names
(`output` for a single array, dict keys, `output[0]` ... for a list). The same names appear in
`opt.input_signature` and in the Triton export.

Requests that arrive together are run as one batch where the model allows it (a free batch
dimension, outputs batched along it): concatenated along axis 0, run once, split back. Where
the result has buckets (optimize(traffic=...)), requests of one padded bucket are grouped
whatever their lengths: each padded to the bucket's bound, run as one batch, and each one's
outputs cut back to its own length.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import EnvironmentMismatchError, InputError, closed_call
from ..model.outputs import TensorSpec
from ..result.buckets import padded, sliced_back
from ..result.calling import flat_runner, warm_up
from ..result.saved import open_saved, restore
from ..system.paths import user_path

__all__ = ["ServedModel", "TensorSpec", "check_shape"]


class ServedModel:
    """A result saved with `Optimized.save()`, loaded once, called with named arrays.

    The inputs and outputs it publishes (names, dtypes, shapes with None where any size is
    accepted) are the saved input and output signatures. A request's checked arrays go to
    the runtime through the saved choice directly (the exact-shape path, the candidate for
    the batch size), flat: nothing is rebuilt into the model's own form and flattened again.
    Loading runs each call path once on random inputs drawn like the tuning sample (every
    bucket at its bound, every tuned batch size: calling.warm_up), so that no first request
    pays for a runtime's warm-up.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = user_path(path)
        saved = open_saved(self.path)
        problem = saved.unavailable()
        if problem:
            raise EnvironmentMismatchError(problem)
        changes = saved.changes()
        if changes:
            warnings.warn(
                f"The result in '{self.path}' was tuned in another environment "
                f"({'; '.join(changes)}): it runs and gives the same outputs, but another "
                f"candidate may be faster here.",
                UserWarning,
                stacklevel=2,
            )
        self._choice, self.report = restore(saved)
        # The callers it was tuned for (optimize(concurrency=N)): how many batches a server
        # runs at once.
        self.concurrency = int(saved.manifest["options"].get("concurrency", 1))
        signature = self._choice.inputs
        self.inputs = [TensorSpec(s.name, s.dtype, s.shape) for s in signature.specs]
        self.outputs = list(self._choice.outputs.specs)
        self.batch_is_dynamic = signature.batch_is_dynamic
        self._run = flat_runner(self._choice)
        self.report.notes.append(warm_up(self._choice))
        # Requests can share one run when every output is batched along axis 0 with the inputs.
        self.batches_requests = self.batch_is_dynamic and all(
            spec.shape and spec.shape[0] is None for spec in self.outputs
        )

    @property
    def backend(self) -> str:
        """The candidate that serves the sample's shapes, e.g. "onnxruntime-cpu"."""
        return self._choice.selected.name

    def describe_inputs(self) -> str:
        return "; ".join(spec.describe() for spec in self.inputs)

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
        check_shape(spec, array.shape, kind)
        return array

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """One batch: checked inputs in the model's order; the outputs, flat, as numpy."""
        return self._run(list(arrays))

    def run_batch(
        self,
        requests: Sequence[Sequence[np.ndarray]],
        record: Callable[[int, int], None] | None = None,
        max_samples: int | None = None,
    ) -> list[list[np.ndarray]]:
        """Several requests' checked inputs; each request's outputs, in order.

        Requests whose non-batch shapes agree run as one concatenated batch where the model
        batches them (`batches_requests`), of at most `max_samples` samples (None: any; a
        request larger than that runs alone): the model never runs at a batch larger than
        the server allows. The others run one by one. `record(samples, ns)`, if given, is
        called after each run of the model with its batch size and duration.
        """
        lengths = [None] * len(requests)  # each padded request's own length
        if len(requests) > 1 and self.batches_requests and self._choice.buckets is not None:
            requests, lengths = self._padded_into_buckets(requests)
        if len(requests) == 1 or not self.batches_requests:
            groups = [[index] for index in range(len(requests))]
        else:
            by_shape: dict[tuple, list[int]] = {}
            for index, request in enumerate(requests):
                by_shape.setdefault(tuple(a.shape[1:] for a in request), []).append(index)
            groups = []
            for indices in by_shape.values():
                groups += _runs(indices, [requests[i][0].shape[0] for i in indices], max_samples)
        results = self._run_groups(requests, groups, record)
        if any(n is not None for n in lengths):
            sliced = self._choice.buckets.sliced
            results = [
                out if n is None else sliced_back(out, sliced, n)
                for out, n in zip(results, lengths)
            ]
        return results

    def _padded_into_buckets(
        self, requests: Sequence[Sequence[np.ndarray]]
    ) -> tuple[list[list[np.ndarray]], list[int | None]]:
        """Each request of a padded bucket padded to its bound (so that requests of one
        bucket share a shape and run as one batch), with its own length; the others as
        they are (None)."""
        buckets = self._choice.buckets
        first, axis = buckets.dim.members[0]
        padded_requests, lengths = [], []
        for request in requests:
            n = request[first].shape[axis]
            bucket = buckets.bucket_for(n)
            if bucket is None or not bucket.padded or n == bucket.upper:
                padded_requests.append(list(request))
                lengths.append(None)
                continue
            padded_requests.append(padded(request, buckets.dim, bucket.upper, buckets.pad_values))
            lengths.append(n)
        return padded_requests, lengths

    def _run_groups(
        self,
        requests: Sequence[Sequence[np.ndarray]],
        groups: list[list[int]],
        record: Callable[[int, int], None] | None,
    ) -> list[list[np.ndarray]]:
        """Each group of requests concatenated, run once and split back; outputs in order."""
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
        """Release the runtimes; a call afterwards raises ClosedError. Closing again does
        nothing."""
        self._run = closed_call(
            f"The served model loaded from '{self.path}' was closed: its runtimes are released."
        )
        self._choice.close()


def _runs(indices: list[int], samples: list[int], most: int | None) -> list[list[int]]:
    """`indices` in order, cut into runs of at most `most` samples in all (None: one run)."""
    if most is None:
        return [indices]
    runs: list[list[int]] = []
    total = most + 1
    for index, count in zip(indices, samples):
        if total + count > most:
            runs.append([])
            total = 0
        runs[-1].append(index)
        total += count
    return runs


def check_shape(spec: TensorSpec, shape: Sequence[int], kind: str = "input") -> None:
    """Raises InputError unless `shape` has the rank and the fixed dimensions of `spec`: on an
    array, or on the shape a request declares before any array is built from it."""
    fits = len(shape) == len(spec.shape) and all(
        want is None or want == got for want, got in zip(spec.shape, shape)
    )
    if not fits:
        raise InputError(
            f"{kind.capitalize()} '{spec.name}' has shape {tuple(shape)}; the model takes "
            f"{spec.describe()} (None: any size)."
        )
