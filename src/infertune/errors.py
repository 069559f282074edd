"""The exceptions infertune raises.

    InfertuneError              root: catch this to catch everything infertune raises on purpose
    ├── InputError              (also ValueError) a sample or call input does not fit the model
    ├── ModelError              (also ValueError) the model cannot be loaded or called as given
    ├── OptionError             (also ValueError) an argument of optimize() is out of range
    ├── ArtifactError           a saved result is modified, incomplete, or not one infertune reads
    ├── EnvironmentMismatchError a saved result needs what this environment lacks (a runtime,
    │                           a GPU, a version that can load it)
    ├── ExportError             a result cannot be written in the form asked for (save() of a
    │                           custom backend, export_triton() of a candidate Triton cannot run)
    └── ClosedError             (also RuntimeError) a result was called, saved or exported
                                after close() or the end of its `with` block

A failing candidate backend never raises out of optimize(): it is reported as `failed`.
Anything else that escapes is a bug in infertune.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

__all__ = [
    "ArtifactError",
    "ClosedError",
    "EnvironmentMismatchError",
    "ExportError",
    "InfertuneError",
    "InputError",
    "ModelError",
    "OptionError",
    "closed_call",
]


class InfertuneError(Exception):
    """Root of every exception infertune raises on purpose."""


class InputError(InfertuneError, ValueError):
    """A sample or call input does not match the model's input signature."""


class ModelError(InfertuneError, ValueError):
    """The model object or path is not something infertune can load and call."""


class OptionError(InfertuneError, ValueError):
    """An option passed to optimize() is invalid."""


class ArtifactError(InfertuneError):
    """A saved result cannot be trusted or read: a file was modified, added or removed, the
    manifest is missing or unreadable, or it was written by a newer infertune."""


class EnvironmentMismatchError(InfertuneError):
    """A saved result does not fit this environment: its runtime is not installed, the GPU it
    was tuned for is absent, or the runtime here cannot load the saved artifact."""


class ExportError(InfertuneError):
    """A tuned result cannot be written in the requested form; the message says why."""


class ClosedError(InfertuneError, RuntimeError):
    """A result, a served model or one of their backends was used after close(): its runtime
    is released, so the call cannot run (and must not run on a freed session)."""


def closed_call(message: str) -> Callable[..., NoReturn]:
    """A function that raises ClosedError(message) whatever it is given: what close() puts
    where a runtime's call was, so that every path that took the call fails clearly and none
    holds the runtime, at no cost to the calls before."""

    def closed(*args: Any, **kwargs: Any) -> NoReturn:
        raise ClosedError(message)

    return closed


def one_line(exc: BaseException, limit: int = 240) -> str:
    """`TypeName: first line of the message`, cut to `limit` characters, for a report; a
    first line that only announces the next ("Exception from src/inference/...:", as
    OpenVINO's errors begin) takes the next line with it, which says what went wrong."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        lines[0] = f"{lines[0]} {lines[1]}"
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
