"""Paths a user gives: `~` expanded, as a shell would, wherever infertune takes a path; and
infertune's own large files: hard-linked where they can be, in temporary directories removed
with what holds them."""

from __future__ import annotations

import os
import shutil
import weakref
from pathlib import Path

__all__ = ["link_or_copy", "remove_with", "user_path"]


def user_path(path: str | os.PathLike) -> Path:
    """`path` with a leading `~` or `~user` expanded (never a directory literally named `~`)."""
    return Path(os.path.expanduser(os.fspath(path)))


def link_or_copy(source: Path, destination: Path) -> None:
    """A hard link where both are on one file system (a 2 GB file costs nothing), else a copy."""
    try:
        os.link(source, destination)
    except OSError:
        shutil.copyfile(source, destination)


def remove_with(owner: object, directory: Path) -> weakref.finalize:
    """`directory` (a temporary one of `owner`'s files) is removed once `owner` is collected;
    the finalizer, for `owner` to keep."""
    return weakref.finalize(owner, shutil.rmtree, str(directory), True)
