"""Paths a user gives: `~` expanded, as a shell would, wherever infertune takes a path."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["user_path"]


def user_path(path: str | os.PathLike) -> Path:
    """`path` with a leading `~` or `~user` expanded (never a directory literally named `~`)."""
    return Path(os.path.expanduser(os.fspath(path)))
