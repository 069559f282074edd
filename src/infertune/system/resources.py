"""Memory: giving back what rejected candidates held, once optimize() is done with them;
what the machine has free, and the peak of optimize()'s process and its children.

Closing a candidate frees its sessions and buffers, but glibc's allocator keeps freed heap
pages mapped for reuse: measured on MobileNetV2, a process that had tried every candidate still
held 100-400 MB more than one that ran only the chosen one, almost all of it free heap. Asking
the allocator to trim returns those pages to the operating system.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import mmap
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from functools import cache
from typing import NamedTuple, TypeVar

T = TypeVar("T")

__all__ = [
    "LEAN_ALLOCATORS",
    "MemoryPeak",
    "allocators_note",
    "available_bytes",
    "high_water_above",
    "high_water_mark",
    "note_child_peak",
    "page_out_own_files",
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
def _linux_libc() -> ctypes.CDLL | None:
    """The C library on Linux, or None (macOS, Windows, or none found)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def _malloc_trim():
    """glibc's malloc_trim, or None elsewhere (macOS, Windows, musl)."""
    return getattr(_linux_libc(), "malloc_trim", None)


# Allocators that give back what a conversion used: one glibc arena (not one per thread,
# each keeping what its threads freed) and the system allocator under oneDNN (not its pool,
# which keeps TensorFlow's large tensors for the rest of the process). Both are read when
# the process starts (TensorFlow's at its first large allocation): the TFLite conversion's
# child process gets them (backends/litert/child.py); optimize() in a process started with them
# peaked at 3.8-4.4x a BERT-base-sized model's weights, 4.9-5.2x without (two runs each;
# benchmarks/large.py --lean-allocators).
LEAN_ALLOCATORS = {"MALLOC_ARENA_MAX": "1", "TF_ONEDNN_USE_SYSTEM_ALLOCATOR": "1"}


def allocators_note() -> str | None:
    """For the report of a large model's tuning on Linux: the allocator settings this process
    was not started with, and what they save; None where it was (or not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    missing = [f"{k}={v}" for k, v in LEAN_ALLOCATORS.items() if os.environ.get(k) != v]
    if not missing:
        return None
    return (
        f"memory: TensorFlow's pool and glibc's per-thread arenas keep much of what the "
        f"conversions used; a process started with {' '.join(missing)} gives it back (on a "
        f"BERT-base-sized model the peak went from 4.9-5.2x to 3.8-4.4x the weights); TensorFlow's "
        f"own speed with them was not measured"
    )


# Linux's value (5.4+; an older kernel answers EINVAL): Python's mmap module names it only
# where the headers it was built with did.
MADV_PAGEOUT = getattr(mmap, "MADV_PAGEOUT", 21)


def page_out_own_files() -> int:
    """Take out of this process's resident memory the pages it has mapped of infertune's own
    temporary files (an ONNX export's external data, a TFLite flatbuffer), and return the
    bytes of the mappings so advised (0 where this cannot be done: not Linux 5.4+).

    XNNPACK and OpenVINO's CPU plugin pack the weights into buffers of their own and leave the
    file's pages resident, unread: on a BERT-base-sized model (0.44 GB of weights) 0.42 GB of
    the flatbuffer and 0.47 GB of the external data, of which the next calls read back 0.11
    and 0.08 GB. MADV_PAGEOUT never changes data (a page a runtime wrote to stays; one read
    again comes back from the file), so the outputs are the same; the kernel would reclaim
    these clean pages under pressure anyway, this does it before the next copy is made.

    The kernel skips a page still in a CPU's batch of pages not yet on its LRU lists, and an
    madvise drains only the batch of the CPU it runs on: pages another CPU had just brought
    into memory (a file written by a thread running there) stayed resident, one 4 KB page in
    each of ten trials on two cores, 16 KB of a flatbuffer in a test-suite run. So a
    one-page advice runs on each CPU this thread may run on first (its affinity restored
    after), draining each one's batch. The kernel also skips a page being written to disk:
    a file just written (the flatbuffer, the external data) is written back within seconds,
    and on ext4 a 1 MB or 64 MB file whose writeback had started stayed resident whole: a
    possible cause of the 16 KB of a flatbuffer left in one test-suite run in three with the
    drains alone, which no run outside the suite has reproduced. So a mapping still
    resident after the advice (mincore) waits for its file's writeback in flight
    (sync_file_range, which starts none) and is drained and advised again, PAGEOUT_TRIES
    times in all."""
    advise = _madvise()
    if advise is None:
        return 0
    prefix = os.path.join(tempfile.gettempdir(), "infertune-")
    try:
        with open("/proc/self/maps") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return 0
    mappings = []
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith(prefix):
            start, end = (int(bound, 16) for bound in fields[0].split("-"))
            mappings.append(_Mapping(start, end - start, int(fields[2], 16), fields[5]))
    if not mappings:
        return 0

    advised: set[int] = set()  # the mappings' starts
    left = mappings
    for attempt in range(PAGEOUT_TRIES):
        if attempt:  # what stayed may be under writeback: wait for it before advising again
            for mapping in left:
                _wait_for_writeback(mapping.path, mapping.offset, mapping.size)
        _drain_each_cpu(advise, left[0].start)
        advised.update(m.start for m in left if advise(m.start, m.size, MADV_PAGEOUT) == 0)
        left = [m for m in left if _resident_pages(m.start, m.size)]
        if not left:
            break
    return sum(m.size for m in mappings if m.start in advised)


class _Mapping(NamedTuple):
    """A mapping of one of infertune's files: its address, its size, where in the file it
    starts, and the file's path."""

    start: int
    size: int
    offset: int
    path: str


# Drains and advice per call of page_out_own_files, at most.
PAGEOUT_TRIES = 3


def _drain_each_cpu(advise: Callable, address: int) -> None:
    """A one-page advice at `address` on each CPU this thread may run on (its affinity
    restored after): each drains that CPU's batch of pages not yet on the LRU lists."""
    cpus = os.sched_getaffinity(0)  # this thread's
    try:
        for cpu in sorted(cpus):
            os.sched_setaffinity(0, {cpu})
            advise(address, mmap.PAGESIZE, MADV_PAGEOUT)
    except OSError:  # a CPU this thread may not be moved to: the batches left as they are
        pass
    finally:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, cpus)


# sync_file_range's flag that waits for the writeback already in flight, starting none.
SYNC_FILE_RANGE_WAIT_BEFORE = 1


def _wait_for_writeback(path: str, offset: int, size: int) -> None:
    """Wait until no page of `path` from `offset` over `size` bytes is being written to disk
    (a page under writeback cannot be paged out); nothing where that cannot be done."""
    wait = _sync_file_range()
    if wait is None:
        return
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:  # removed since it was mapped ("path (deleted)")
        return
    try:
        wait(descriptor, offset, size, SYNC_FILE_RANGE_WAIT_BEFORE)
    finally:
        os.close(descriptor)


@cache
def _sync_file_range():
    """libc's sync_file_range on Linux, or None."""
    wait = getattr(_linux_libc(), "sync_file_range", None)
    if wait is None:
        return None
    wait.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    wait.restype = ctypes.c_int
    return wait


def _resident_pages(start: int, size: int) -> int:
    """Pages of the mapping at `start` in memory (mincore); 0 where that cannot be read."""
    mincore = getattr(_linux_libc(), "mincore", None)
    if mincore is None:
        return 0
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vector = (ctypes.c_ubyte * pages)()
    if mincore(ctypes.c_void_p(start), ctypes.c_size_t(size), vector) != 0:
        return 0
    return pages - bytes(vector).count(0)


@cache
def _madvise():
    """libc's madvise on Linux, or None."""
    advise = getattr(_linux_libc(), "madvise", None)
    if advise is None:
        return None
    advise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    advise.restype = ctypes.c_int
    return advise


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

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()

    def sample(self) -> None:
        """The peak so far: the tree sampled now, and this process's own high-water mark
        (children held at least nothing at that moment)."""
        rss = tree_rss_bytes()
        if rss is not None and (self.peak is None or rss > self.peak):
            self.peak = rss
        if self._own_hwm and self.peak is not None:
            own = high_water_mark()
            if own is not None:
                self.peak = max(self.peak, own, _with_children_peak)


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
    global _folded_hwm, _with_children_peak
    before = _own_high_water_mark()
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        return False
    _folded_hwm = 0 if start else max(_folded_hwm, before or 0)
    if start:
        _with_children_peak = 0
    return True


# A child process's own peak, noted by what ran it (note_child_peak): the most the last
# high_water_above's build ran in a child, and this process's memory with that child's peak.
_child_above = 0
_with_children_peak = 0


def note_child_peak(child_bytes: int) -> None:
    """A child process's peak resident memory (its VmHWM: sampling every 0.5 s misses a
    converter's peak) into the conversion's peak (high_water_above) and MemoryPeak's, added
    to what this process holds now."""
    global _child_above, _with_children_peak
    _child_above = max(_child_above, child_bytes)
    _with_children_peak = max(_with_children_peak, (_rss_bytes(os.getpid()) or 0) + child_bytes)


def high_water_above(build: Callable[[], T]) -> tuple[T, int | None]:
    """build()'s value, and the most this process held while it ran above what it held when
    it began (bytes; None where /proc cannot tell): a conversion's own peak, which sampling
    misses (a converter holding the GIL starves the sampling thread)."""
    global _child_above
    before = _rss_bytes(os.getpid())
    if before is None or not _reset_high_water_mark():
        return build(), None
    _child_above = 0
    value = build()
    after = _own_high_water_mark()
    return value, None if after is None else max(0, after - before, _child_above)
