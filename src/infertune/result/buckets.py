"""Buckets: which candidate serves a request of which length, and whether it pads it.

optimize(traffic=...) chooses them by measurement (pipeline/buckets.py): each bucket serves
the requests whose length (the padded free dimension, `dim`) is at most its `upper` and
above the previous bucket's, by its candidate, either padded to `upper` (a fixed shape the
runtime was measured fastest at) or at the request's own length. A request longer than every
bucket goes to `beyond`, at its own length: never an error.

The call path (`bucketed`) pads into buffers allocated once per thread and shape (pad
values in the new positions), runs the bucket's candidate, and cuts the outputs that follow
the length (`sliced`) back to the request's: a view of the runtime's output, no copy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..backends.base import Backend
from ..model.traffic import FreeDim

__all__ = ["Bucket", "Buckets", "bucketed", "padded", "sliced_back"]


@dataclass
class Bucket:
    """The requests of length up to `upper` (above the previous bucket's) and who runs them."""

    upper: int
    backend: Backend
    padded: bool  # padded to `upper`; False: run at the request's own length

    def to_dict(self) -> dict:
        return {"upper": self.upper, "backend": self.backend.name, "padded": self.padded}


@dataclass
class Buckets:
    """Every bucket, ascending; what is padded, with what, and what is cut back."""

    dim: FreeDim
    buckets: list[Bucket]
    beyond: Backend  # a request longer than every bucket: at its own length
    pad_values: tuple  # per flat input
    sliced: tuple[tuple[int, int], ...]  # (flat output, axis) that follow the length
    _run: Callable | None = field(default=None, repr=False, compare=False)

    @property
    def run(self) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
        """run(flat inputs) through the buckets (`bucketed`), built once: every call path of
        the result shares its per-bucket state (a bucket's interpreters, its buffers)."""
        if self._run is None:
            self._run = bucketed(self)
        return self._run

    def release(self) -> None:
        """Release what the buckets' runs hold of their own (their shaped runners' state),
        not the backends: buckets planned and not kept."""
        for close in getattr(self._run, "closers", ()):
            close()
        self._run = None

    @property
    def backends(self) -> list[Backend]:
        """The distinct backends the buckets use, `beyond` last."""
        found: list[Backend] = []
        for backend in [*(b.backend for b in self.buckets), self.beyond]:
            if all(backend is not f for f in found):
                found.append(backend)
        return found

    def bucket_for(self, length: int) -> Bucket | None:
        """The bucket a request of `length` goes to, None beyond the last."""
        return next((b for b in self.buckets if length <= b.upper), None)

    def to_dict(self) -> dict:
        return {
            "dim": self.dim.to_dict(),
            "buckets": [b.to_dict() for b in self.buckets],
            "beyond": self.beyond.name,
            "pad_values": [_json_value(v) for v in self.pad_values],
            "sliced": [list(s) for s in self.sliced],
        }

    @staticmethod
    def names(data: dict) -> list[str]:
        """The candidate names a `to_dict()` value names."""
        return list(dict.fromkeys([*(b["backend"] for b in data["buckets"]), data["beyond"]]))

    @classmethod
    def from_dict(cls, data: dict, backend: Callable[[str], Backend]) -> Buckets:
        return cls(
            FreeDim.from_dict(data["dim"]),
            [
                Bucket(int(b["upper"]), backend(b["backend"]), bool(b["padded"]))
                for b in data["buckets"]
            ],
            backend(data["beyond"]),
            tuple(data["pad_values"]),
            tuple((int(o), int(a)) for o, a in data["sliced"]),
        )


def _json_value(value: object) -> object:
    return value.item() if isinstance(value, np.generic) else value


def bucketed(buckets: Buckets) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
    """run(flat inputs) -> flat outputs through the buckets (see the module's doc).

    The bucket of a length is one list index (a table up to the last bucket's upper), a
    padded bucket's inputs go into buffers of this thread kept by shape (np.copyto into the
    leading positions, the pad value written behind them), and each sequence output is cut
    back by one slice."""
    beyond = buckets.beyond.run
    if not buckets.buckets:  # every request at its own length, by one candidate
        return lambda flat: beyond(flat)
    top = buckets.buckets[-1].upper
    # A padded bucket's calls share their shapes: a run of their own where the runtime keeps
    # state per shape (Backend.shaped_runner).
    runs = [
        (b.backend.shaped_runner() if b.padded else b.backend.run, b.upper if b.padded else None)
        for b in buckets.buckets
    ]
    closers = [close for r, _ in runs if (close := getattr(r, "close", None)) is not None]
    at = [runs[0]] * (top + 1)
    for bucket, run in zip(reversed(buckets.buckets), reversed(runs)):
        at[: bucket.upper + 1] = [run] * (bucket.upper + 1)
    first_input, first_axis = buckets.dim.members[0]
    members = buckets.dim.members
    pad_values = buckets.pad_values
    # Each member's and each cut output's leading full slices, made once: a call adds only
    # the slice along the length (0.1 us a tuple, against 1.5 us built from lists).
    fills = [(i, (slice(None),) * axis, pad_values[i]) for i, axis in members]
    cuts = [(o, (slice(None),) * axis) for o, axis in buckets.sliced]
    local = threading.local()

    def buffers(flat: list[np.ndarray], upper: int) -> list[np.ndarray]:
        """This thread's buffers for these inputs padded to `upper`."""
        key = (upper, *(flat[i].shape for i, _ in members))
        cache = local.__dict__.setdefault("buffers", {})
        found = cache.get(key)
        if found is None:
            found = []
            for i, axis in members:
                shape = list(flat[i].shape)
                shape[axis] = upper
                found.append(np.full(shape, pad_values[i], dtype=flat[i].dtype))
            cache[key] = found
        return found

    def run(flat: list[np.ndarray]) -> list[np.ndarray]:
        n = flat[first_input].shape[first_axis]
        if n > top:
            return beyond(flat)
        bucket_run, upper = at[n]
        if upper is None or n == upper:
            return bucket_run(flat)
        padded = list(flat)
        head, tail = slice(0, n), slice(n, upper)
        for (i, lead, pad), buffer in zip(fills, buffers(flat, upper)):
            buffer[(*lead, head)] = flat[i]
            buffer[(*lead, tail)] = pad
            padded[i] = buffer
        outputs = bucket_run(padded)
        for o, lead in cuts:
            outputs[o] = outputs[o][(*lead, head)]
        return outputs

    run.closers = closers  # what Buckets.release() calls
    return run


def padded(
    flat: Sequence[np.ndarray], dim: FreeDim, length: int, pad_values: Sequence[object]
) -> list[np.ndarray]:
    """The flat inputs with every member of `dim` padded to `length` with its pad value."""
    out = list(flat)
    for i, axis in dim.members:
        array = out[i]
        if array.shape[axis] == length:
            continue
        shape = list(array.shape)
        shape[axis] = length
        bigger = np.full(shape, pad_values[i], dtype=array.dtype)
        index = [slice(None)] * array.ndim
        index[axis] = slice(0, array.shape[axis])
        bigger[tuple(index)] = array
        out[i] = bigger
    return out


def sliced_back(
    outputs: Sequence[np.ndarray], sliced: Sequence[tuple[int, int]], length: int
) -> list[np.ndarray]:
    """The outputs with each (output, axis) that follows the length cut back to `length`."""
    out = list(outputs)
    for o, axis in sliced:
        index = [slice(None)] * out[o].ndim
        index[axis] = slice(0, length)
        out[o] = out[o][tuple(index)]
    return out
