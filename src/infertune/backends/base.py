"""What every candidate backend is: a way to prepare and run one model on one runtime.

A backend knows how to prepare and run the model, and nothing about selection. The
pipeline (api.py) calls, in order: `available()` (cheap: no conversion, no heavy import
where avoidable), `prepare(target)` (convert, compile, build sessions), then `run(inputs)`
many times, then `close()` for candidates not chosen.

`run` takes and returns flat lists of numpy arrays on the host: returning host arrays is the
synchronization point that keeps asynchronous device work inside the timed call.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np

from ..target import Target

__all__ = ["Backend", "Target"]


class Backend(ABC):
    """One candidate way of running the model. Subclass it and register it in backends/__init__.

    Set `name` (as users pass it in `backends=`), `precision` ("fp32", "fp16", "bf16",
    "int8") and `requires` (the pip extra that installs its runtime, if optional).
    """

    name: ClassVar[str]
    precision: ClassVar[str] = "fp32"
    requires: ClassVar[str | None] = None
    # Seconds its runtime keeps cores busy after a call returns (threads spinning for more
    # work). The measurement waits that long before timing another candidate, which would
    # otherwise run on fewer cores than it has in production.
    cooldown_s: float = 0.0

    def available(self) -> str | None:
        """None if this backend can run here, else a one-line reason why not."""
        return None

    @abstractmethod
    def prepare(self, target: Target) -> None:
        """Convert, compile and load the model; raise on failure (the pipeline reports it)."""

    @abstractmethod
    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Run one batch: flat numpy inputs in signature order, flat numpy outputs on the host."""

    def close(self) -> None:
        """Release what prepare() built (sessions, compiled functions)."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
