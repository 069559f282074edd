"""Containing candidates that crash or hang, so that optimize() survives them.

Two tools, chosen by optimize(isolation=...):

- A deadline per candidate ("thread" and "process"). Each in-process stage (conversion,
  compile, first call, verification) runs in a worker thread that the pipeline waits for until
  the candidate's deadline. A stage still running then is abandoned: the candidate is reported
  `timeout` and the thread is left to finish (or not) in the background, since Python cannot
  stop a thread; nothing waits for it again.
- A rehearsal in a child process ("process"). A native runtime that segfaults, aborts or is
  killed for memory takes its whole process with it, which no thread can contain. So for the
  backends that can be rebuilt from files without TensorFlow (`Backend.rehearse_in_child`),
  the compile and the runs on the verification inputs happen first in a child process (one
  worker, started once and again after a crash). Only a candidate whose rehearsal survives is
  compiled in this process. A child that dies makes the candidate `failed` with the signal; a
  child that does not answer in time is killed and the candidate is `timeout`.

The child is `python -m infertune.rehearsal_child`, with this interpreter and this sys.path.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .backends.base import Backend, Target

__all__ = [
    "DEFAULT_CANDIDATE_TIMEOUT_S",
    "ISOLATIONS",
    "CandidateCrashed",
    "CandidateTimeout",
    "Isolation",
    "NotRehearsable",
    "RehearsalError",
    "RehearsalUnavailable",
]

ISOLATIONS = ("process", "thread", "off")
DEFAULT_CANDIDATE_TIMEOUT_S = 300.0  # a TensorRT engine build can take minutes
_START_TIMEOUT_S = 60.0  # the child's imports (numpy, infertune, nothing else)
_WAIT_MAX = threading.TIMEOUT_MAX / 2  # longer waits overflow: treated as no limit


class CandidateTimeout(Exception):
    """A candidate's stage did not finish before its deadline."""


class CandidateCrashed(Exception):
    """The child process rehearsing a candidate died (a signal, or a non-zero exit)."""


class RehearsalError(Exception):
    """The candidate raised in the child process; the message is the stage and its error."""


class RehearsalUnavailable(Exception):
    """No child process can be started here (an embedded interpreter, no sys.executable)."""


class NotRehearsable(Exception):
    """The child cannot rebuild this candidate (its class does not import there): it is
    prepared in this process, under the deadline only."""


class Isolation:
    """What optimize() uses to run one candidate's risky stages; `close()` when done."""

    def __init__(self, mode: str, timeout_s: float | None):
        self.mode = mode
        self.timeout_s = timeout_s
        self._worker: _Worker | None = None
        self._tmp: Path | None = None
        self._jobs = 0
        self.notes: list[str] = []  # for the report: where isolation fell back

    def deadline(self) -> float:
        """The deadline of a candidate (or of its rehearsal) that starts now."""
        if self.mode == "off" or self.timeout_s is None or self.timeout_s >= _WAIT_MAX:
            return float("inf")
        return time.perf_counter() + self.timeout_s

    def _timed_out(self, stage: str, how: str) -> CandidateTimeout:
        return CandidateTimeout(
            f"{stage} did not finish within candidate_timeout_s={self.timeout_s:g}; {how}"
        )

    def call(self, fn: Callable[[], Any], deadline: float, stage: str) -> Any:
        """fn(), in a thread that is abandoned at the deadline (CandidateTimeout)."""
        if deadline == float("inf"):
            return fn()
        if time.perf_counter() >= deadline:  # never start what cannot be waited for
            raise self._timed_out(stage, "not started")
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:  # handed to the caller below
                box["error"] = exc

        thread = threading.Thread(target=work, name=f"infertune {stage}", daemon=True)
        thread.start()
        thread.join(max(0.0, deadline - time.perf_counter()))
        if thread.is_alive():
            raise self._timed_out(stage, "abandoned, still running in a background thread")
        if "error" in box:
            raise box["error"]
        return box["value"]

    def rehearses(self, backend: Backend) -> bool:
        """Whether `backend` is rehearsed in a child process before it is compiled here.

        Only a class that sets `rehearse_in_child` itself: a subclass of a built-in backend
        may change how it is built (its constructor, model_bytes) in ways its files do not
        carry, so it does not inherit the rehearsal.
        """
        cls = type(backend)
        return (
            self.mode == "process"
            and cls.__dict__.get("rehearse_in_child", False)
            and cls.__module__ != "__main__"  # the child cannot import a script's classes
            and "<locals>" not in cls.__qualname__
        )

    def start(self) -> None:
        """Start the child worker now, so that its imports overlap the work done here."""
        if self.mode == "process" and self._worker is None:
            try:
                self._worker = _Worker(self._directory())
            except RehearsalUnavailable as exc:
                self.fall_back(str(exc))

    def fall_back(self, why: str) -> None:
        """No child process here: threads (the deadline) for the rest of this run."""
        self.mode = "thread"
        self.notes.append(f"isolation fell back to threads: {why}")

    def rehearse(
        self, backend: Backend, target: Target, inputs: list[list[np.ndarray]], deadline: float
    ) -> None:
        """Build `backend` from its files in the child and run it on every input there.

        Raises CandidateCrashed or CandidateTimeout (the child is gone), RehearsalError (the
        candidate raised there), NotRehearsable (its class does not import there),
        RehearsalUnavailable (no child can run here).
        """
        self._jobs += 1
        job = self._directory() / f"job-{self._jobs}"
        (job / "artifact").mkdir(parents=True)
        try:
            cls = type(backend)
            spec = {
                "module": cls.__module__,
                "qualname": cls.__qualname__,
                "settings": backend.save_artifact(job / "artifact"),
                "signature": target.signature.to_dict(),
                "outputs": target.output_structure.to_dict(),
                "dtypes": [np.dtype(d).str for d in target.output_dtypes],
                "objective": target.objective,
                "calls": len(inputs),
            }
            (job / "job.json").write_text(json.dumps(spec))
            arrays = {f"{i}_{j}": a for i, call in enumerate(inputs) for j, a in enumerate(call)}
            np.savez(job / "inputs.npz", **arrays)
            self._answer(job, deadline)
        finally:
            shutil.rmtree(job, ignore_errors=True)

    def _answer(self, job: Path, deadline: float) -> None:
        if self._worker is not None and not self._worker.alive():
            self._worker.kill()  # died between jobs: reap it, close its log
            self._worker = None
        if self._worker is None:
            self._worker = _Worker(self._directory())
        worker = self._worker
        started = time.perf_counter()
        try:
            worker.wait_ready(min(deadline, started + _START_TIMEOUT_S))
        except (CandidateCrashed, CandidateTimeout) as exc:
            worker.kill()
            self._worker = None
            if time.perf_counter() >= deadline:  # the candidate's time ran out, not the child's
                raise self._timed_out("rehearsal", "the child process was not ready") from exc
            raise RehearsalUnavailable(f"the child process did not start ({exc})") from exc
        stage = "load"
        try:
            worker.send(str(job))
            while True:
                line = worker.next_line(deadline)
                if line is _TIMED_OUT:
                    worker.kill()
                    self._worker = None
                    raise self._timed_out(stage, "rehearsed in a child process, which was killed")
                if line is None:
                    self._worker = None
                    raise CandidateCrashed(
                        f"{stage} killed the child process rehearsing it ({worker.death()})"
                    )
                if line.startswith("stage "):
                    stage = line[len("stage ") :]
                elif line == "done":
                    return
                elif line == "error":
                    message = (job / "error.txt").read_text().strip()
                    if stage == "load":
                        raise NotRehearsable(message)
                    raise RehearsalError(f"{stage}: {message} (in the child process rehearsing it)")
        except BaseException:
            # Anything unexpected (KeyboardInterrupt included) leaves a job in flight: this
            # child's next lines would answer for the wrong candidate.
            if self._worker is worker and worker.alive():
                worker.kill()
                self._worker = None
            raise

    def _directory(self) -> Path:
        if self._tmp is None:
            self._tmp = Path(tempfile.mkdtemp(prefix="infertune-isolation-"))
        return self._tmp

    def close(self) -> None:
        """Stop the child worker and remove every file written for it."""
        if self._worker is not None:
            self._worker.stop()
            self._worker = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


_TIMED_OUT = object()


class _Worker:
    """One child process, its protocol lines (a reader thread queues them) and its log."""

    def __init__(self, directory: Path):
        python = _python_executable()
        self._log_path = directory / f"child-{time.monotonic_ns()}.log"
        self._log = open(self._log_path, "wb")  # noqa: SIM115 (closed in stop/kill)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if isinstance(p, str) and p)
        try:
            self._process = subprocess.Popen(
                [python, "-m", "infertune.rehearsal_child", str(directory)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._log,
                env=env,
                text=True,
                bufsize=1,
            )
        except (OSError, ValueError) as exc:
            self._log.close()
            raise RehearsalUnavailable(f"cannot start {python} ({exc})") from exc
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._ready = False
        self._log_start = 0  # where the current job's part of the log begins
        threading.Thread(target=self._read, name="infertune rehearsal reader", daemon=True).start()

    def _read(self) -> None:
        for line in self._process.stdout:
            self._lines.put(line.strip())
        self._lines.put(None)  # end of output: the child is gone

    def alive(self) -> bool:
        return self._process.poll() is None

    def wait_ready(self, deadline: float) -> None:
        while not self._ready:
            line = self.next_line(deadline)
            if line is _TIMED_OUT:
                raise CandidateTimeout("no answer")
            if line is None:
                raise CandidateCrashed(self.death())
            self._ready = line == "ready"

    def send(self, text: str) -> None:
        self._log_start = self._log_path.stat().st_size
        self._process.stdin.write(text + "\n")
        self._process.stdin.flush()

    def next_line(self, deadline: float) -> Any:
        """The child's next line, None once it is gone, or _TIMED_OUT at the deadline."""
        wait = deadline - time.perf_counter()
        try:
            if wait == float("inf"):
                return self._lines.get()
            return self._lines.get(timeout=max(0.0, wait))
        except queue.Empty:
            return _TIMED_OUT

    def death(self) -> str:
        """How the child ended, for a report: the signal or exit status, and its last words."""
        try:
            code = self._process.wait(timeout=10)  # its output has ended: it is exiting
        except subprocess.TimeoutExpired:
            self._process.kill()
            code = self._process.wait()
        self._log.close()
        if code < 0:
            name = _signal_name(-code)
            how = f"signal {name}"
            if name == "SIGKILL":
                how += ": killed from outside, most often for running out of memory"
        else:
            how = f"exit status {code}"
        last = _last_line(self._log_path, self._log_start)
        return f"{how}; its last output: {last}" if last else how

    def kill(self) -> None:
        self._process.kill()
        self._process.wait()
        self._log.close()

    def stop(self) -> None:
        """End the child: close its input (it exits at end of input), kill it if it lingers."""
        try:
            self._process.stdin.close()
            self._process.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self._process.kill()
            self._process.wait()
        self._log.close()


def _python_executable() -> str:
    """This interpreter's executable, if it is one that `-m` runs (not an embedding host)."""
    python = sys.executable
    if not python:
        raise RehearsalUnavailable("sys.executable is not set (an embedded interpreter)")
    if not os.path.basename(python).lower().startswith(("python", "pypy")):
        raise RehearsalUnavailable(f"sys.executable is {python}, not a Python interpreter")
    return python


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _last_line(path: Path, start: int, limit: int = 200) -> str:
    """The last non-empty line of a log from byte `start` on, cut to `limit` characters."""
    try:
        with open(path, "rb") as log:
            log.seek(start)
            text = log.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [line for line in (line.strip() for line in text.splitlines()) if line]
    if not lines:
        return ""
    last = lines[-1]
    return last if len(last) <= limit else last[: limit - 3] + "..."
