"""The prepared problem every backend receives: model, input signature, outputs, shared work."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..system.resources import (
    high_water_above,
    release_freed_memory,
)
from .inputs import InputSignature
from .sizes import ModelSize
from .source import ModelSource
from .structure import Structure

__all__ = ["Target"]


@dataclass
class Target:
    """Everything a backend may use to prepare the model, the same for every candidate.

    `source` is None when a saved result is loaded (infertune.load): the conversions the
    backend needs are then preloaded from the saved files (`preload`), so `prepare()` finds
    them built and never reaches for the model.
    """

    source: ModelSource | None
    signature: InputSignature
    output_structure: Structure
    output_dtypes: list[np.dtype]
    objective: str = "latency"  # what optimize() tunes for: backends may set hints from it
    concurrency: int = 1  # callers calling at once: backends may size their pools from it
    # optimize(calibration=...) as flat input batches: what quantizing conversions calibrate
    # activation ranges on (None: none given; static int8 is then skipped).
    calibration: list[list[np.ndarray]] | None = field(default=None, repr=False)
    _shared: dict[str, Any] = field(default_factory=dict, repr=False)
    _seconds: dict[str, float] = field(default_factory=dict, repr=False)
    used: list[str] = field(default_factory=list, repr=False)  # keys, in order of use
    _building: set[str] = field(default_factory=set, repr=False)
    _spans: dict[str, tuple[float, float]] = field(default_factory=dict, repr=False)
    # Per thread, the seconds of the shared builds nested in each build under way (TFLite's
    # full int8 builds the float32 conversion it quantizes): a build's own seconds leave them
    # out, so that no conversion is timed twice.
    _nested: threading.local = field(default_factory=threading.local, repr=False, compare=False)
    _offloaded: dict[str, Any] = field(default_factory=dict, repr=False)
    notes: list[str] = field(default_factory=list, repr=False)  # for the report
    offloaded_seconds: dict[str, float] = field(default_factory=dict, repr=False)
    _traced: tuple[Any, Any] | None = field(default=None, repr=False)
    _weights: int | None = field(default=None, repr=False)
    # Where the size is watched (ModelSize.watched): each conversion made here, the most this
    # process held while it ran above what it held before (bytes), for the machine's record.
    memory_peaks: dict[str, int] = field(default_factory=dict, repr=False)
    # Tuning from a package (pipeline/packaging.py): no model, its conversions preloaded,
    # and tuning all the same (a saved result being loaded is the other case of no model).
    from_package: bool = field(default=False, repr=False)
    # Why memory is tight for this model here (pipeline/tournament.py: the verified
    # candidates that copy its weights would pass INFERTUNE_HOLD_ALL_BYTES together), None
    # where it is not: the pipeline then holds few copies of the weights at once.
    memory_tight: str | None = field(default=None, repr=False)

    def traced(self) -> tuple[Any, Any]:
        """The model as one tf.function of its flat inputs, batch free, and its concrete
        function: traced once (ResNet50: 0.9-1.2 s) for the tf-function candidate (which runs
        it), the ONNX export and the TFLite conversion (which start from it); the time counts
        in whichever needed it first. `release_traced()` drops this reference once the
        conversions are made (a tf-function candidate keeps its own)."""
        if self._traced is None:
            import tensorflow as tf

            from .source import (
                tensor_specs,
                trace,
            )

            specs = tensor_specs(self.signature)
            function = tf.function(
                self.source.graph_function(self.signature), input_signature=specs
            )
            self._traced = (function, trace(function))
        return self._traced

    def run_traced(self, flat_inputs: list[np.ndarray]) -> list[np.ndarray]:
        """The traced model's outputs on flat arrays: what the tf-function candidate computes,
        the reference with optimize(reference="traced")."""
        function, _ = self.traced()
        return [tensor.numpy() for tensor in function(*flat_inputs)]

    def release_traced(self) -> None:
        self._traced = None

    @property
    def weights_measured(self) -> int | None:
        """weights_bytes() where something measured it already, else None."""
        return self._weights

    def calibration_feeds(self, names: list[str], limit: int) -> list[dict[str, np.ndarray]]:
        """The calibration inputs one sample at a time, as dicts by the given input names (a
        runtime's), at most `limit` samples (the first ones): what the quantizers take."""
        feeds: list[dict[str, np.ndarray]] = []
        for batch in self.calibration or []:
            for i in range(len(batch[0]) if batch[0].ndim else 1):
                feeds.append({n: a[i : i + 1] for n, a in zip(names, batch)})
                if len(feeds) >= limit:
                    return feeds
        return feeds

    @property
    def loading(self) -> bool:
        """Whether a saved result is being loaded (infertune.load): no model, and nothing to
        decide (a candidate loads as it was chosen)."""
        return self.source is None and not self.from_package

    def assume_weights(self, weights: int) -> None:
        """The weights' bytes as measured where the model was (a package's)."""
        self._weights = int(weights)

    def size(self) -> ModelSize:
        """The model's size (its weights' bytes) and what follows from it (model/sizes.py)."""
        return ModelSize(self.weights_bytes())

    def weights_bytes(self) -> int:
        """Bytes of the variables the traced function captures (what freezing makes
        constants, what every conversion copies); measured once."""
        if self._weights is None:
            _, concrete = self.traced()
            self._weights = sum(
                (v.shape.num_elements() or 0) * v.dtype.size for v in concrete.graph.variables
            )
        return self._weights

    def shared(self, key: str, build: Callable[[], Any]) -> Any:
        """Build a conversion once and share it (or its failure) between backends."""
        self.used.append(key)
        if key in self._building:  # a candidate's deadline passed while it was being built
            raise RuntimeError(
                f"the shared {key!r} conversion is still running, abandoned by an earlier "
                f"candidate that timed out"
            )
        if key not in self._shared:
            self._building.add(key)
            nested = self._nested.__dict__.setdefault("inner_s", [])
            nested.append(0.0)
            start = time.perf_counter()
            try:
                if self._watched():
                    value, above = high_water_above(lambda: self._offloaded_or(key, build))
                    if above is not None and key not in self.offloaded_seconds:
                        self.memory_peaks[key] = above
                else:
                    value = self._offloaded_or(key, build)
                self._shared[key] = (True, value)
            except Exception as exc:
                self._shared[key] = (False, exc)
            finally:
                self._building.discard(key)
                # A conversion's intermediates (the frozen graph, tf2onnx's graph, the
                # converter's buffers) are freed now; glibc keeps freed heap for reuse
                # unless asked: on a BERT-base-sized model, gigabytes that no candidate
                # after it would ever reuse. Not for small models: the full garbage
                # collection would cost more time than the memory is worth.
                if self._watched():
                    release_freed_memory()
                end = time.perf_counter()
                inner = nested.pop()
                if nested:  # built inside another build: not that one's own time
                    nested[-1] += end - start
            self._seconds[key] = end - start - inner
            self._spans[key] = (start, end)
        ok, value = self._shared[key]
        if not ok:
            raise value
        return value

    def _watched(self) -> bool:
        """Whether the conversions' memory is watched: the weights measured already (a
        conversion measures them first, through the trace) and past the threshold."""
        return self._weights is not None and ModelSize(self._weights).watched

    def offload(self, key: str, conversion: Any) -> None:
        """`key` is being built elsewhere (tf_worker.OffloadedConversion): shared(key) takes
        its result instead of building it here, or builds it here if that failed."""
        self._offloaded[key] = conversion

    def _offloaded_or(self, key: str, build: Callable[[], Any]) -> Any:
        conversion = self._offloaded.pop(key, None)
        if conversion is None:
            return build()
        try:
            value = conversion.result()
        except Exception as exc:  # said in the report; the conversion is made here instead
            self.notes.append(
                f"the {key} conversion in a worker process failed ({exc}); made here instead"
            )
            return build()
        finally:
            conversion.close()
        self.offloaded_seconds[key] = conversion.worker_s
        self.notes.append(
            f"the {key} conversion was made in a worker process beside this one "
            f"({conversion.worker_s:.1f} s there)"
        )
        return value

    def close_offloaded(self) -> None:
        """Stop the conversions still being built elsewhere that nothing waited for."""
        for conversion in self._offloaded.values():
            conversion.close()
        self._offloaded.clear()

    def preload(self, key: str, value: Any) -> None:
        """Provide a conversion already built (read from a saved artifact) under `key`."""
        self._shared[key] = (True, value)
        self._seconds[key] = 0.0

    def preload_failure(self, key: str, why: str) -> None:
        """Record that the conversion under `key` is not to be built (a saved result without
        it): `shared(key, ...)` raises instead of building it."""
        self._shared[key] = (False, RuntimeError(f"{key}: {why}"))
        self._seconds[key] = 0.0

    def built(self) -> set[str]:
        """Keys of the shared conversions built (or failed) so far."""
        return set(self._seconds)

    def shared_seconds(self, keys: list[str]) -> float:
        """What building these shared conversions cost, whoever paid for it."""
        return sum(self._seconds.get(key, 0.0) for key in set(keys))

    def built_between(self, start: float, end: float) -> dict[str, float]:
        """The shared conversions built within [start, end] (perf_counter), with their own
        seconds (a nested build's not counted twice): the part of a stage that was shared
        work, not the candidate's own."""
        return {
            key: self._seconds[key]
            for key, (a, b) in self._spans.items()
            if a >= start and b <= end  # a build abandoned earlier ends inside no stage
        }

    def shared_value(self, key: str) -> Any | None:
        """A shared conversion that was already built successfully, else None."""
        ok, value = self._shared.get(key, (False, None))
        return value if ok else None
