"""The choice: which prepared candidate serves which calls. One value, built in one place
(pipeline/selection.py after tuning; saved.py on load; result/cache.py on a cache hit that
prepares again), used by the callable, save/load, the cache and the served model, and written
in one format (`to_dict`).

- `general`: the candidate chosen among those that run any input shape, at the sample's
  batch size;
- `by_batch`: where optimize(batch_sizes=...) chose per tuned batch size, the candidate for
  each; a call goes to the one for the smallest tuned batch size at or above its own (the
  largest beyond them). None: `general` serves every batch size;
- `exact_shape`: the exact-shape path, a candidate that runs only the sample's exact input
  shapes (LiteRT converted at those shapes where the conversion with free dimensions fails)
  and was clearly faster there: it serves the calls of exactly those shapes. None: none;
- `buckets`: where optimize(traffic=...) chose by the traffic's lengths, which candidate
  serves which lengths and whether it pads them (buckets.py): every call goes through them.
  None: none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..backends.base import Backend
from ..model.inputs import InputSignature
from ..model.outputs import OutputSignature
from .buckets import Buckets

__all__ = ["Choice"]


@dataclass
class Choice:
    """Which candidate serves which calls, with the signatures they serve them in."""

    general: Backend
    inputs: InputSignature
    outputs: OutputSignature
    by_batch: dict[int, Backend] | None = None
    exact_shape: Backend | None = None
    buckets: Buckets | None = None

    def __post_init__(self) -> None:
        if self.by_batch is not None:
            self.by_batch = dict(sorted(self.by_batch.items()))

    @property
    def selected(self) -> Backend:
        """The selected candidate (the report's `selected`, `Optimized.backend`): the one that
        serves calls at the sample's input shapes."""
        return self.exact_shape or self.general

    @property
    def backends(self) -> list[Backend]:
        """The distinct prepared backends: the general choice first, then those chosen at
        other batch sizes, then the exact-shape path, then the buckets'."""
        found = self.general_backends
        extra = [self.exact_shape] if self.exact_shape is not None else []
        extra += self.buckets.backends if self.buckets is not None else []
        for backend in extra:
            if all(backend is not b for b in found):
                found.append(backend)
        return found

    @property
    def general_backends(self) -> list[Backend]:
        """The distinct backends chosen among those that run any shape, `general` first."""
        found = [self.general]
        for backend in (self.by_batch or {}).values():
            if all(backend is not b for b in found):
                found.append(backend)
        return found

    @property
    def backends_by_batch(self) -> dict[int, str]:
        """{tuned batch size: name of the candidate chosen there}."""
        if self.by_batch is None:
            return {self.inputs.sample_batch: self.general.name}
        return {size: backend.name for size, backend in self.by_batch.items()}

    @property
    def exact_shapes(self) -> list[tuple[int, ...]]:
        """The input shapes the exact-shape path serves: the sample's."""
        return [tuple(shape) for shape in self.inputs.sample_shapes]

    def close(self) -> None:
        """Close every backend (every batch size's, the exact-shape path), each even where
        another's close() raised (a custom backend's): the first such error is raised after."""
        failed: list[Exception] = []
        for backend in self.backends:
            try:
                backend.close()
            except Exception as exc:
                failed.append(exc)
        if failed:
            raise failed[0]

    # -- the one format ------------------------------------------------------------------
    def to_dict(self) -> dict:
        """{"general": name, "by_batch": {"N": name} or None, "exact_shape": {"backend":
        name, "shapes": [...]} or None}: what the manifest and the cache write."""
        by_batch = None
        if self.by_batch is not None:
            by_batch = {str(size): name for size, name in self.backends_by_batch.items()}
        exact = None
        if self.exact_shape is not None:
            shapes = [list(shape) for shape in self.exact_shapes]
            exact = {"backend": self.exact_shape.name, "shapes": shapes}
        data = {"general": self.general.name, "by_batch": by_batch, "exact_shape": exact}
        if self.buckets is not None:
            data["buckets"] = self.buckets.to_dict()
        return data

    @staticmethod
    def names(data: dict) -> list[str]:
        """The distinct candidate names a `to_dict()` value names, `general` first."""
        names = [data["general"], *(data.get("by_batch") or {}).values()]
        if data.get("exact_shape"):
            names.append(data["exact_shape"]["backend"])
        if data.get("buckets"):
            names += Buckets.names(data["buckets"])
        return list(dict.fromkeys(names))

    @classmethod
    def from_dict(
        cls,
        data: dict,
        backend: Callable[[str], Backend],
        inputs: InputSignature,
        outputs: OutputSignature,
    ) -> Choice:
        """The choice `to_dict()` wrote, with `backend(name)` giving each prepared backend."""
        by_batch = data.get("by_batch")
        exact = data.get("exact_shape")
        buckets = data.get("buckets")
        return cls(
            backend(data["general"]),
            inputs,
            outputs,
            by_batch={int(n): backend(name) for n, name in by_batch.items()} if by_batch else None,
            exact_shape=backend(exact["backend"]) if exact else None,
            buckets=Buckets.from_dict(buckets, backend) if buckets else None,
        )
