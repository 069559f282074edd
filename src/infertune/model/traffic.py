"""The traffic a result will serve: a sample of real requests (optimize(traffic=...)), read
into the sizes of every free dimension in every request.

A request is given as the model takes it (an array, a list or a dict of them: checked as a
call is, so that a request of another rank or dtype is an InputError naming it) or as its
shapes (a tuple of ints for a model of one input, a list or a dict of such tuples for
several).
A free dimension is one the model's signature leaves open (None) besides the batch; the
inputs' free axes whose sizes are equal in every request are one dimension (token ids and
their padding mask share one length), unless the user names the dimensions (`free_dims`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InputError, OptionError
from .inputs import InputSignature

__all__ = ["FreeDim", "Traffic", "read_traffic"]

# Requests that say nothing new (a few hundred is typical); more are read, and sampled down to
# this many (evenly, in order), so that planning's cost does not grow with the log's size.
MAX_REQUESTS = 5000


@dataclass(frozen=True)
class FreeDim:
    """One free dimension: its name and the (flat input, axis) pairs that share its size."""

    name: str
    members: tuple[tuple[int, int], ...]

    def words(self, signature: InputSignature) -> str:
        names = ", ".join(f"{signature.specs[i].name}[{axis}]" for i, axis in self.members)
        return f"{self.name} ({names})"

    def to_dict(self) -> dict:
        return {"name": self.name, "members": [list(m) for m in self.members]}

    @classmethod
    def from_dict(cls, data: dict) -> FreeDim:
        return cls(data["name"], tuple((int(i), int(a)) for i, a in data["members"]))


@dataclass
class Traffic:
    """The requests' batch sizes and the sizes of each free dimension, one row per request,
    in the order given; the requests themselves where they were given as arrays."""

    dims: tuple[FreeDim, ...]
    batches: np.ndarray  # (requests,) int
    sizes: np.ndarray  # (requests, dims) int
    requests: list[list[np.ndarray]] | None = field(default=None, repr=False)  # flat inputs

    def __len__(self) -> int:
        return len(self.batches)

    def lengths(self, dim: int = 0) -> np.ndarray:
        """Each request's size of free dimension `dim`."""
        return self.sizes[:, dim]

    def shapes(self, row: int, signature: InputSignature) -> list[tuple[int, ...]]:
        """Request `row`'s flat input shapes."""
        return shapes_at(signature, self.dims, int(self.batches[row]), self.sizes[row])

    def digest(self) -> str:
        """What decides the result: the dimensions and the distribution of their sizes."""
        digest = hashlib.sha256()
        digest.update(repr([d.to_dict() for d in self.dims]).encode())
        digest.update(np.ascontiguousarray(self.batches, np.int64).tobytes())
        digest.update(np.ascontiguousarray(self.sizes, np.int64).tobytes())
        return digest.hexdigest()[:32]

    def describe(self) -> str:
        """In a line: how many requests, each dimension's median, p90 and max, the batches."""
        parts = [f"{len(self)} requests"]
        for i, dim in enumerate(self.dims):
            values = self.sizes[:, i]
            median, p90 = (int(v) for v in np.percentile(values, [50, 90]))
            parts.append(f"{dim.name}: median {median}, p90 {p90}, max {int(values.max())}")
        low, high = int(self.batches.min()), int(self.batches.max())
        parts.append(f"batch {low}" if low == high else f"batch {low}-{high}")
        return "; ".join(parts)

    def to_dict(self) -> dict:
        return {
            "dims": [d.to_dict() for d in self.dims],
            "batches": self.batches.tolist(),
            "sizes": self.sizes.tolist(),
        }

    @classmethod
    def from_dict(cls, data: dict) -> Traffic:
        dims = tuple(FreeDim.from_dict(d) for d in data["dims"])
        sizes = np.asarray(data["sizes"], np.int64).reshape(len(data["batches"]), len(dims))
        return cls(dims, np.asarray(data["batches"], np.int64), sizes)


def shapes_at(
    signature: InputSignature, dims: Sequence[FreeDim], batch: int | None, sizes: Sequence[int]
) -> list[tuple[int, ...]]:
    """The flat input shapes of a request of `batch` rows (None: the sample's) and these sizes
    of `dims`: the sample's shapes with the batch and each dimension's members set."""
    shapes = [list(shape) for shape in signature.concrete_shapes(batch)]
    for dim, size in zip(dims, sizes):
        for i, axis in dim.members:
            shapes[i][axis] = int(size)
    return [tuple(shape) for shape in shapes]


def read_traffic(
    traffic: Any, signature: InputSignature, free_dims: Mapping[str, Any] | None = None
) -> Traffic:
    """The traffic read and checked against the model's inputs: InputError or OptionError,
    naming the request, before any long work. A Traffic (a saved result's, read before)
    is taken as it is, its dimensions checked against the signature."""
    if isinstance(traffic, Traffic):
        free = set(_free_axes(signature))
        if any(member not in free for dim in traffic.dims for member in dim.members):
            raise OptionError("the traffic's free dimensions are not the model's.")
        return traffic
    if isinstance(traffic, np.ndarray | str | bytes | Mapping) or not isinstance(traffic, Sequence):
        raise OptionError(
            f"traffic must be a list of requests (each as the model takes it, or its shapes). "
            f"Received: traffic of type {type(traffic).__name__}."
        )
    if not traffic:
        raise OptionError("traffic is empty: give a sample of real requests (a few hundred).")
    rows = list(traffic)
    if len(rows) > MAX_REQUESTS:
        rows = [rows[i] for i in np.linspace(0, len(rows) - 1, MAX_REQUESTS).astype(int)]
    given_as_shapes = _is_shapes(rows[0], signature)
    shapes, arrays = [], []
    for index, request in enumerate(rows):
        if _is_shapes(request, signature) != given_as_shapes:
            raise OptionError(
                f"traffic[{index}]: every request must be given the same way, as inputs or as "
                f"shapes; traffic[0] is given as {'shapes' if given_as_shapes else 'inputs'}."
            )
        try:
            if given_as_shapes:
                shapes.append(_checked_shapes(request, signature))
            else:
                flat = signature.flatten(request)
                shapes.append([array.shape for array in flat])
                arrays.append(flat)
        except (InputError, OptionError) as exc:
            raise type(exc)(f"traffic[{index}]: {exc}") from None
    dims = _named_dims(free_dims, signature) if free_dims else _found_dims(signature, shapes)
    sizes = np.zeros((len(shapes), len(dims)), np.int64)
    for row, request in enumerate(shapes):
        for d, dim in enumerate(dims):
            found = {request[i][axis] for i, axis in dim.members}
            if len(found) > 1:
                raise InputError(
                    f"traffic[{row}]: the members of free dimension {dim.words(signature)} "
                    f"differ in size ({sorted(found)}); padding pads them together."
                )
            sizes[row, d] = found.pop()
    batches = np.asarray([request[0][0] if request[0] else 1 for request in shapes], np.int64)
    return Traffic(dims, batches, sizes, arrays if not given_as_shapes else None)


def _is_shapes(request: Any, signature: InputSignature) -> bool:
    """Whether a request is given as shapes: a tuple of ints (one input), or a list/tuple or
    dict of them (tuples, never lists: a list of ints is an input's data)."""

    def shape_like(value: Any) -> bool:
        return isinstance(value, tuple) and all(
            isinstance(n, int | np.integer) and not isinstance(n, bool) for n in value
        )

    if signature.structure.kind == "leaf":
        return shape_like(request) and len(request) > 0
    values = list(request.values()) if isinstance(request, Mapping) else request
    return isinstance(values, list | tuple) and bool(values) and all(map(shape_like, values))


def _checked_shapes(request: Any, signature: InputSignature) -> list[tuple[int, ...]]:
    """A request given as shapes, in the model's flat order, each checked against its spec."""
    if signature.structure.kind == "leaf":
        listed = [request]
    elif isinstance(request, Mapping):
        missing = [spec.name for spec in signature.specs if spec.name not in request]
        if missing or len(request) != len(signature.specs):
            raise InputError(
                f"the shapes name {sorted(request)}; the model's inputs are "
                f"{[spec.name for spec in signature.specs]}."
            )
        listed = [request[spec.name] for spec in signature.specs]
    else:
        listed = list(request)
        if len(listed) != len(signature.specs):
            raise InputError(
                f"{len(listed)} shapes for the model's {len(signature.specs)} inputs "
                f"({signature.describe()})."
            )
    shapes = []
    for spec, shape in zip(signature.specs, listed):
        shape = tuple(int(n) for n in shape)
        if len(shape) != len(spec.shape) or any(n <= 0 for n in shape):
            raise InputError(
                f"input '{spec.name}' of shape {shape}; expected rank {len(spec.shape)} and "
                f"sizes > 0: {signature.describe()}."
            )
        for axis, (size, want) in enumerate(zip(shape, spec.shape)):
            if want is not None and size != want:
                raise InputError(
                    f"input '{spec.name}' of shape {shape}: dimension {axis} must be {want} "
                    f"({signature.describe()})."
                )
        shapes.append(shape)
    batches = {shape[0] for shape in shapes if shape}
    if len(batches) > 1:
        raise InputError(f"the inputs' batch sizes differ: {sorted(batches)}.")
    return shapes


def _free_axes(signature: InputSignature) -> list[tuple[int, int]]:
    return [
        (i, axis)
        for i, spec in enumerate(signature.specs)
        for axis, size in enumerate(spec.shape)
        if axis and size is None
    ]


def _found_dims(signature: InputSignature, shapes: list[list[tuple[int, ...]]]) -> tuple:
    """The free axes grouped into dimensions: axes whose sizes are equal in every request and
    in the sample are one dimension. Named `length` where there is one, else by their first
    member (`input[axis]`)."""
    axes = _free_axes(signature)
    columns = {
        (i, a): tuple(s[i][a] for s in shapes) + (signature.sample_shapes[i][a],) for i, a in axes
    }
    groups: list[list[tuple[int, int]]] = []
    for axis in axes:
        for group in groups:
            if columns[group[0]] == columns[axis]:
                group.append(axis)
                break
        else:
            groups.append([axis])
    if len(groups) == 1:
        return (FreeDim("length", tuple(groups[0])),)
    return tuple(FreeDim(f"{signature.specs[g[0][0]].name}[{g[0][1]}]", tuple(g)) for g in groups)


def _named_dims(free_dims: Mapping[str, Any], signature: InputSignature) -> tuple:
    """The dimensions the user named: {name: ["input:axis", ...]} (a string for one)."""
    names = [spec.name for spec in signature.specs]
    free = set(_free_axes(signature))
    dims = []
    for name, members in free_dims.items():
        listed = [members] if isinstance(members, str) else list(members)
        pairs = []
        for member in listed:
            input_name, _, axis = str(member).rpartition(":")
            if input_name not in names or not axis.isdigit():
                raise OptionError(
                    f"free_dims[{name!r}]: {member!r} is not 'input:axis' with an input of "
                    f"the model ({names})."
                )
            pair = (names.index(input_name), int(axis))
            if pair not in free:
                raise OptionError(
                    f"free_dims[{name!r}]: axis {axis} of '{input_name}' is not free in the "
                    f"model's signature ({signature.describe()})."
                )
            pairs.append(pair)
        dims.append(FreeDim(str(name), tuple(pairs)))
    return tuple(dims)
