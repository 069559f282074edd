"""Timing has the machine to itself: no work of optimize() runs while a candidate is timed.

optimize() overlaps its stages (a conversion in this thread, a compile and a verification in
the background threads, rehearsals in the child process, a conversion in a worker process), but
a candidate timed beside any of them is timed on a machine with a core taken: a runtime on two
threads then loses more than one on one thread, and the choice follows the overlap, not the
candidates (MobileNetV2 160 chose LiteRT on one thread 1.46x slower than ONNX Runtime's
default, in one run of three on an idle two-core machine).

So each stage that works holds `work()` while it runs (a wait is no work), and each timing
holds `timing()`: it waits until no other thread works, keeps new work waiting until it ends,
and stops every child process infertune started (system/children.py) for its duration. How
long timing waited for the machine is the report's (`waited_s`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Iterator

from ..system.children import stopped

__all__ = ["Exclusive"]


class Exclusive:
    """The turns of work and timing in one optimize() run."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._working: Counter[int] = Counter()  # thread id -> stages it is inside
        self._timing: int | None = None  # the thread timing now
        self._depth = 0  # timings nested in the timing thread
        self.waited_s = 0.0  # timing's wait for the other threads' work, in all
        self.timings = 0
        self.stopped = 0  # child processes stopped during timings, counted per timing
        # Stages abandoned at their deadline (isolation.py `call`): no timing can wait for a
        # stage that may never end, so one still running is said in the report.
        self.abandoned: list[tuple[str, threading.Thread]] = []

    @contextlib.contextmanager
    def work(self) -> Iterator[None]:
        """Hold for the duration of a stage that works; waits while another thread times."""
        me = threading.get_ident()
        with self._changed:
            while self._timing is not None and self._timing != me:
                self._changed.wait()
            self._working[me] += 1
        try:
            yield
        finally:
            with self._changed:
                self._working[me] -= 1
                if not self._working[me]:
                    del self._working[me]
                self._changed.notify_all()

    @contextlib.contextmanager
    def timing(self) -> Iterator[None]:
        """Hold while timing: waits for the work of every other thread to end (new work waits
        from the start of this wait), and stops infertune's child processes until it ends. A
        timing inside a stage of its own thread does not wait for that stage."""
        me = threading.get_ident()
        start = time.perf_counter()
        with self._changed:
            while self._timing is not None and self._timing != me:
                self._changed.wait()
            self._timing = me
            self._depth += 1
            outer = self._depth == 1
            while any(thread != me for thread in self._working):
                self._changed.wait()
        if outer:
            self.waited_s += time.perf_counter() - start
            self.timings += 1
        try:
            with stopped() if outer else contextlib.nullcontext(0) as count:
                self.stopped += count
                yield
        finally:
            with self._changed:
                self._depth -= 1
                if not self._depth:
                    self._timing = None
                self._changed.notify_all()

    def note(self) -> str | None:
        """The report's line on it, None where nothing was timed."""
        if not self.timings:
            return None
        note = (
            f"timing had the machine to itself: {self.timings} timing"
            f"{'s' if self.timings != 1 else ''} waited {self.waited_s:.1f} s in all for "
            f"optimize()'s other work to end"
        )
        if self.stopped:
            note += f"; child processes stopped while timing: {self.stopped}"
        running = [stage for stage, thread in self.abandoned if thread.is_alive()]
        if running:
            note += (
                f"; stages abandoned at their deadline may have run beside it (still running: "
                f"{', '.join(running)})"
            )
        return note
