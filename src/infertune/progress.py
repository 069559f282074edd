"""Progress lines on stderr while optimize() works, so long conversions never look like a hang."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """Writes `[infertune  12.3s] candidate: stage` lines; silent when verbose is False."""

    def __init__(self, verbose: bool, stream: TextIO | None = None):
        self.verbose = verbose
        self.stream = stream if stream is not None else sys.stderr
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def say(self, message: str) -> None:
        if self.verbose:
            print(f"[infertune {self.elapsed():6.1f}s] {message}", file=self.stream, flush=True)
