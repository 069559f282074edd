"""The exceptions infertune raises.

    InfertuneError            root: catch this to catch everything infertune raises on purpose
    ├── InputError            (also ValueError) a sample or call input does not fit the model
    ├── ModelError            (also ValueError) the model cannot be loaded or called as given
    └── OptionError           (also ValueError) an argument of optimize() is out of range

A failing candidate backend never raises out of optimize(): it is reported as `failed`.
Anything else that escapes is a bug in infertune.
"""

from __future__ import annotations

__all__ = ["InfertuneError", "InputError", "ModelError", "OptionError"]


class InfertuneError(Exception):
    """Root of every exception infertune raises on purpose."""


class InputError(InfertuneError, ValueError):
    """A sample or call input does not match the model's input signature."""


class ModelError(InfertuneError, ValueError):
    """The model object or path is not something infertune can load and call."""


class OptionError(InfertuneError, ValueError):
    """An option passed to optimize() is invalid."""


def one_line(exc: BaseException, limit: int = 240) -> str:
    """`TypeName: first line of the message`, cut to `limit` characters, for a report."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
