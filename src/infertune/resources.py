"""Memory: giving back what rejected candidates held, once optimize() is done with them;
what the machine has free, and the peak of optimize()'s process and its children.

Closing a candidate frees its sessions and buffers, but glibc's allocator keeps freed heap
pages mapped for reuse: measured on MobileNetV2, a process that had tried every candidate still
held 100-400 MB more than one that ran only the chosen one, almost all of it free heap. Asking
the allocator to trim returns those pages to the operating system.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import sys
import threading
from collections.abc import Callable
from functools import cache
from typing import TypeVar

T = TypeVar("T")

__all__ = [
    "MemoryPeak",
    "available_bytes",
    "high_water_above",
    "high_water_mark",
    "release_freed_memory",
    "tree_rss_bytes",
]


def release_freed_memory() -> None:
    """Collect unreachable objects, then return free heap pages to the OS (glibc only)."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@cache
def _malloc_trim():
    """glibc's malloc_trim, or None elsewhere (macOS, Windows, musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None


def available_bytes() -> int | None:
    """Memory the machine can give without swapping (Linux's MemAvailable), or None where it
    cannot be read."""
    return _proc_bytes("/proc/meminfo", "MemAvailable")


def _proc_bytes(path: str, key: str) -> int | None:
    """A `key:  N kB` line of a /proc file (meminfo, a process's status) in bytes, or None."""
    try:
        with open(path) as lines:
            for line in lines:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def tree_rss_bytes(pid: int | None = None) -> int | None:
    """Resident memory of a process and all its descendants (the rehearsal child, a worker),
    or None where /proc cannot be read."""
    pending, total, seen = [pid or os.getpid()], 0, False
    while pending:
        current = pending.pop()
        rss = _rss_bytes(current)
        if rss is None:
            continue
        total, seen = total + rss, True
        pending += _children(current)
    return total if seen else None


def _rss_bytes(pid: int) -> int | None:
    return _proc_bytes(f"/proc/{pid}/status", "VmRSS")


def _children(pid: int) -> list[int]:
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as children:
                found += [int(child) for child in children.read().split()]
        except (OSError, ValueError):
            pass
    return found


class MemoryPeak:
    """The peak of tree_rss_bytes() while it runs (a thread samples it every `every_s`
    seconds); `before` what the process tree held when it started. Nothing where /proc is
    not there (peak None)."""

    def __init__(self, every_s: float = 0.5):
        self.every_s = every_s
        self.before = tree_rss_bytes()
        self.peak = self.before
        # This process's own high-water mark (VmHWM), reset here: a converter that holds
        # the GIL for seconds starves the sampling thread, and the samples missed the TFLite
        # conversion's peak (3.3x the weights sampled, 9.8x its high-water mark).
        self._own_hwm = _reset_high_water_mark(start=True)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> MemoryPeak:
        if self.before is not None:
            self._thread = threading.Thread(
                target=self._sample, name="infertune memory", daemon=True
            )
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def sample(self) -> None:
        rss = tree_rss_bytes()
        if rss is not None and (self.peak is None or rss > self.peak):
            self.peak = rss

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()
        if self._own_hwm and self.peak is not None:
            own = high_water_mark()
            if own is not None:  # children held at least nothing at that moment
                self.peak = max(self.peak, own)


# This process's high-water mark before its last reset: a conversion's own peak is measured by
# resetting it (high_water_above), and what it held before is not to be lost to MemoryPeak.
_folded_hwm = 0


def high_water_mark() -> int | None:
    """This process's peak resident memory (VmHWM) since it was last reset by MemoryPeak, and
    what it was before each conversion's reset since (high_water_above); None where /proc
    cannot tell."""
    own = _own_high_water_mark()
    return None if own is None else max(own, _folded_hwm)


def _own_high_water_mark() -> int | None:
    return _proc_bytes("/proc/self/status", "VmHWM")


def _reset_high_water_mark(start: bool = False) -> bool:
    """Reset VmHWM to the resident memory now (Linux: "5" to /proc/self/clear_refs), keeping
    what it was in _folded_hwm (`start`: forgetting it); False where that cannot be done (the
    high-water mark then covers time before optimize())."""
    global _folded_hwm
    before = _own_high_water_mark()
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        return False
    _folded_hwm = 0 if start else max(_folded_hwm, before or 0)
    return True


def high_water_above(build: Callable[[], T]) -> tuple[T, int | None]:
    """build()'s value, and the most this process held while it ran above what it held when
    it began (bytes; None where /proc cannot tell): a conversion's own peak, which sampling
    misses (a converter holding the GIL starves the sampling thread)."""
    before = _rss_bytes(os.getpid())
    if before is None or not _reset_high_water_mark():
        return build(), None
    value = build()
    after = _own_high_water_mark()
    return value, None if after is None else max(0, after - before)
