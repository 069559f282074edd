"""The conversions built for one model, each once, shared by every candidate that asks.

A conversion (the ONNX export, a TFLite flatbuffer) is built the first time a candidate asks
for its key (`shared(key, build)`); its value, or its failure, is kept for the next one, and
its own seconds (a nested build not counted twice) and span for the report's stages. A
conversion may be built in a worker process instead (`offload`), or preloaded from a saved
artifact (`preload`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ..system.resources import high_water_above, release_freed_memory

__all__ = ["SharedConversions"]


class SharedConversions:
    """Each conversion's value or failure by key, what it cost, and when it was built.

    `watched()`: whether the model is large enough that each build's peak memory is
    measured and the freed heap handed back after it (model/sizes.py); `notes`: the report's
    notes, which builds add to (a conversion made in a worker process)."""

    def __init__(self, watched: Callable[[], bool], notes: list[str]):
        self._watched = watched
        self.notes = notes
        self._shared: dict[str, tuple[bool, Any]] = {}
        self._seconds: dict[str, float] = {}
        self.used: list[str] = []  # keys, in order of use
        self._building: set[str] = set()
        self._spans: dict[str, tuple[float, float]] = {}
        # Per thread, the seconds of the shared builds nested in each build under way
        # (TFLite's full int8 builds the float32 conversion it quantizes): a build's own
        # seconds leave them out, so that no conversion is timed twice.
        self._nested = threading.local()
        self._offloaded: dict[str, Any] = {}
        self.offloaded_seconds: dict[str, float] = {}
        # Where the size is watched: each conversion made here, the most this process held
        # while it ran above what it held before (bytes), for the machine's record.
        self.memory_peaks: dict[str, int] = {}

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
