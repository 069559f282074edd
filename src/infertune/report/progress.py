"""Progress on stderr while optimize() works, so long conversions never look like a hang.

On a terminal, a live line (rich) shows the candidate, the stage and the elapsed time, with
finished events printed above it; elsewhere (logs, CI, pipes), one plain line per event.
`verbose=False` silences both. Whatever the verbosity, `timed()` stages are recorded in
`times` (report/stages.py): the report's breakdown of where the run's time went.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from .stages import StageTimes

__all__ = ["Progress"]


class Progress:
    """Use as a context manager around the work; `stage()` for what runs now, `say()` for events."""

    def __init__(self, verbose: bool, stream: TextIO | None = None):
        self.verbose = verbose
        self.stream = stream if stream is not None else sys.stderr
        self.start = time.perf_counter()
        self.current = ""
        self._console = None
        self._status = None
        self.times = StageTimes()

    def __enter__(self) -> Progress:
        if self.verbose and _is_terminal(self.stream):
            try:
                from rich.console import Console
            except ImportError:  # rich comes with Keras; without it, plain lines do
                return self
            self._console = Console(file=self.stream, highlight=False)
            self._status = self._console.status(_StatusLine(self))
            self._status.start()
        return self

    def __exit__(self, *exc_info) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def stage(self, text: str, *, log: bool = True) -> None:
        """What is running now: shown live on a terminal; elsewhere a line, if `log`."""
        self.current = text
        if self._status is None and log:
            self.say(text)

    @contextmanager
    def timed(
        self, stage: str, candidate: str | None = None, *, text: str | None = None
    ) -> Iterator[None]:
        """Time the block as `stage` (of `candidate`, or shared), raised or not; `text`, if
        given, is shown as what runs now."""
        if text is not None:
            self.stage(text)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.times.add(stage, time.perf_counter() - start, candidate)

    def say(self, message: str) -> None:
        """An event worth keeping in the log: a verdict, a failure, a choice."""
        if not self.verbose:
            return
        line = f"[infertune {self.elapsed():6.1f}s] {message}"
        if self._console is not None:
            self._console.print(line, markup=False)
        else:
            print(line, file=self.stream, flush=True)


class _StatusLine:
    """Rendered anew at every refresh, so the elapsed time ticks while a stage runs."""

    def __init__(self, progress: Progress):
        self.progress = progress

    def __rich__(self) -> str:
        from rich.markup import escape

        return f"infertune {self.progress.elapsed():6.1f}s  {escape(self.progress.current)}"


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())
