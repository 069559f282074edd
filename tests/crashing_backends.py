"""Candidates that really crash or hang, for tests/pipeline/test_isolation.py.

They live in their own module, importable without TensorFlow, because the child process that
rehearses a candidate imports the candidate's class by module and name.
"""

from __future__ import annotations

import ctypes
import threading
import time
from pathlib import Path

import numpy as np

from infertune.backends.base import Backend, Target

# Set by the tests at teardown so that an abandoned in-process hang ends.
RELEASE = threading.Event()


class _FromNothing(Backend):
    """A backend with nothing to convert or save: the child rebuilds it from its class.
    Each subclass opts in to the rehearsal itself: the setting is not inherited."""

    def prepare(self, target: Target) -> None:
        self._outputs = target.output_dtypes

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError

    def save_artifact(self, directory: Path) -> dict:
        return {}

    @classmethod
    def load_artifact(cls, directory: Path, settings: dict, target: Target) -> Backend:
        backend = cls()
        backend.prepare(target)
        return backend


class SegfaultsAtFirstCall(_FromNothing):
    """Reads address 0 at its first call: a real SIGSEGV, as from a native runtime's bug."""

    name = "segfaults-at-first-call"
    rehearse_in_child = True

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        ctypes.string_at(0)
        raise AssertionError("unreachable: reading address 0 kills the process")


class HangsAtCompile(_FromNothing):
    """Never finishes loading, as a runtime stuck in its compiler would."""

    name = "hangs-at-compile"
    rehearse_in_child = True

    @classmethod
    def load_artifact(cls, directory: Path, settings: dict, target: Target) -> Backend:
        time.sleep(3600)
        raise AssertionError("unreachable")


class RaisesInChild(_FromNothing):
    """Raises a Python exception at its first call."""

    name = "raises-at-first-call"
    rehearse_in_child = True

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        raise RuntimeError("unsupported operator Foo")


class HangsInProcess(Backend):
    """A candidate not rehearsed in a child (as the TensorFlow candidates) whose first call
    hangs until RELEASE is set."""

    name = "hangs-in-process"

    def prepare(self, target: Target) -> None:
        pass

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        RELEASE.wait()
        raise RuntimeError("released")


class NotImportableInChild(_FromNothing):
    """Claims a module the child cannot import: it runs in this process, unrehearsed."""

    name = "not-importable-in-child"
    rehearse_in_child = True

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        return [np.zeros((len(inputs[0]), 3), np.float32)]


NotImportableInChild.__module__ = "a_module_only_the_parent_has"


class RunsInChild(_FromNothing):
    """Runs, slowly enough that the child's lines arrive while several threads wait for
    them (returns zeros: its verdict, not its numbers, is what the tests read)."""

    name = "runs-in-child"
    rehearse_in_child = True

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        time.sleep(0.02)
        return [np.zeros((len(inputs[0]), 3), np.float32)]
