"""Child Python processes, started one way: this interpreter running one of infertune's
modules (`python -m infertune.x ...`), with this process's sys.path and environment, and a
time limit on whatever waits for them.

Three kinds use it: the rehearsal child (pipeline/isolation.py: long-lived, a line protocol
on its pipes, a deadline per job), the TensorFlow worker (pipeline/tf_worker.py: one
conversion beside this process's work, waited for with a limit) and a large model's TFLite
conversion (backends/litert/child.py: run to its end within a limit).

Every child started here is kept in one register while it lives (`started`), so that timing
can stop them all for its duration (`stopped`): a rehearsal or a conversion in a child would
otherwise take cores from the candidate being timed (pipeline/exclusive.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import weakref
from collections.abc import Iterator
from typing import IO, Any

__all__ = [
    "ChildTimeout",
    "ChildUnavailable",
    "child_environment",
    "python_executable",
    "run_module",
    "start_module",
    "started",
    "stopped",
]

# The child processes started here and not yet reaped (a weak set: one nobody holds is gone).
_STARTED: weakref.WeakSet[subprocess.Popen] = weakref.WeakSet()
_STARTED_LOCK = threading.Lock()


def started(process: subprocess.Popen) -> subprocess.Popen:
    """`process` kept in the register of children that timing stops; returns it."""
    with _STARTED_LOCK:
        _STARTED.add(process)
    return process


@contextlib.contextmanager
def stopped() -> Iterator[int]:
    """Every registered child that still runs stopped (SIGSTOP) for the duration, and
    continued (SIGCONT) after; yields how many were stopped. Where signals cannot stop a
    process (not POSIX), nothing is stopped."""
    if not hasattr(signal, "SIGSTOP"):
        yield 0
        return
    with _STARTED_LOCK:
        running = [p for p in _STARTED if p.poll() is None]
    paused = []
    for process in running:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(process.pid, signal.SIGSTOP)
            paused.append(process)
    try:
        yield len(paused)
    finally:
        for process in paused:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(process.pid, signal.SIGCONT)


class ChildUnavailable(Exception):
    """No child process can be started here (an embedded interpreter, no sys.executable)."""


class ChildTimeout(Exception):
    """A child process did not finish within its time limit (it was killed)."""


def python_executable() -> str:
    """This interpreter's executable, if it is one that `-m` runs (not an embedding host)."""
    python = sys.executable
    if not python:
        raise ChildUnavailable("sys.executable is not set (an embedded interpreter)")
    if not os.path.basename(python).lower().startswith(("python", "pypy")):
        raise ChildUnavailable(f"sys.executable is {python}, not a Python interpreter")
    return python


def child_environment(**extra: str) -> dict[str, str]:
    """The environment for a child that imports what this process does: this process's,
    with its sys.path as PYTHONPATH (an editable install, a test's path), `extra` on top."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if isinstance(p, str) and p)
    env.update(extra)
    return env


def start_module(
    module: str,
    *args: str,
    stdin: int | IO[Any] | None = subprocess.DEVNULL,
    stdout: int | IO[Any] | None = subprocess.DEVNULL,
    stderr: int | IO[Any] | None = subprocess.DEVNULL,
    text: bool = False,
    env: dict[str, str] | None = None,
) -> subprocess.Popen:
    """`python -m module args...` started, not waited for; `env` on top of
    child_environment(). Raises ChildUnavailable where no child can start."""
    python = python_executable()
    try:
        process = subprocess.Popen(
            [python, "-m", module, *args],
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            env=child_environment(**(env or {})),
            text=text,
            errors="replace" if text else None,
            bufsize=1 if text else -1,
        )
    except (OSError, ValueError) as exc:
        raise ChildUnavailable(f"cannot start {python} ({exc})") from exc
    return started(process)


def run_module(
    module: str, *args: str, timeout_s: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`python -m module args...` run to its end, its output captured as text; killed and
    ChildTimeout past `timeout_s` seconds."""
    process = start_module(
        module, *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise ChildTimeout(
            f"python -m {module} did not finish within {timeout_s:g} s and was killed"
        ) from None
    except BaseException:
        process.kill()
        process.wait()
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
