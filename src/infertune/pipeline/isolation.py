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

Rehearsals are submitted (`submit`) and answered later (`Rehearsal.wait`), so that this
process converts the next candidate while the child compiles the last one: the child runs
its jobs one after another, in the order submitted; a job's time limit starts when the child
starts it. After a crash or a kill, the jobs queued behind the one that caused it go to a
fresh child. One thread may submit while one other waits for verdicts (a lock keeps the
queue and the worker consistent; the waiting thread alone reads the child's answers).

The child is `python -m infertune.pipeline.rehearsal_child`, started as every child is
(system/children.py).
"""

from __future__ import annotations

import json
import math
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..backends.base import Backend, Target
from ..system.children import (
    ChildUnavailable,
    start_module,
)
from .exclusive import Exclusive

__all__ = [
    "CandidateCrashed",
    "CandidateTimeout",
    "Isolation",
    "NotRehearsable",
    "Rehearsal",
    "RehearsalError",
    "RehearsalUnavailable",
]

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
        self._queue: deque[Rehearsal] = deque()  # sent to the child, not yet answered
        self._lock = threading.RLock()  # the queue and the worker, between two threads
        # One thread reads the child's lines at a time: two readers would each take some of
        # one job's lines, and one would wait for a line the other has already read.
        self._reading = threading.Lock()
        self.notes: list[str] = []  # for the report: where isolation fell back
        self.child_seconds: dict[str, float] = {}  # each rehearsal's time in the child
        # The run's turns of work and timing (exclusive.py), where the pipeline set them.
        self.exclusive: Exclusive | None = None

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
            if self.exclusive is not None:  # no timing can wait for it: said in the report
                self.exclusive.abandoned.append((stage, thread))
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
        cls = type(backend.rehearsed_part())
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

    def submit(
        self,
        backend: Backend,
        target: Target,
        inputs: list[list[np.ndarray]],
        allowed_s: float | None,
        name: str | None = None,
    ) -> Rehearsal:
        """Queue `backend`'s rehearsal in the child: rebuilt from its files, run on every
        input there, within `allowed_s` seconds from when the child starts it (None: no
        limit). Returns at once; `wait()` on the result for the verdict. `name`: the
        candidate's, where the backend rehearsed is a part of it (a split model's body).

        Raises RehearsalUnavailable (no child can start here), or what save_artifact raised.
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
            rehearsal = Rehearsal(self, name or backend.name, job, allowed_s)
            with self._lock:
                self._send(rehearsal)
        except BaseException:
            shutil.rmtree(job, ignore_errors=True)
            raise
        return rehearsal

    def _send(self, rehearsal: Rehearsal) -> None:
        if self._worker is not None and not self._worker.alive() and not self._queue:
            self._worker.kill()  # died between jobs: reap it, close its log
            self._worker = None
        if self._worker is None:
            self._worker = _Worker(self._directory())
        rehearsal.sent = time.perf_counter()
        if not self._queue and self._worker.ready:  # an idle child starts it now
            rehearsal.started = rehearsal.sent
        self._worker.send(str(rehearsal.job))
        self._queue.append(rehearsal)

    def _head_deadline(self) -> float:
        """When the job the child runs now (the first in the queue) must be answered."""
        worker, head = self._worker, self._queue[0]
        if not worker.ready:
            return worker.created + _START_TIMEOUT_S
        if head.allowed_s is None or head.allowed_s >= _WAIT_MAX:
            return float("inf")
        started = head.started if head.started is not None else head.sent
        return started + max(0.0, head.allowed_s)

    def _pump(self, until: Rehearsal | None, give_up_at: float = math.inf) -> None:
        """Read the child's answers: until `until` has its verdict (or `give_up_at` has
        come), or (None) only what has arrived, without waiting. Sets each answered job's
        outcome."""
        if not self._await_reading(until, give_up_at):
            return
        try:
            self._read_lines(until, give_up_at)
        finally:
            self._reading.release()

    def _await_reading(self, until: Rehearsal | None, give_up_at: float) -> bool:
        """Take the turn to read the child's lines; False where there is no need any more:
        another thread reads (without waiting, `until` None), it answered `until`, or
        `give_up_at` came."""
        if until is None:
            return self._reading.acquire(blocking=False)
        while not self._reading.acquire(timeout=0.05):
            if until.outcome is not _PENDING or time.perf_counter() >= give_up_at:
                return False
        return True

    def _read_lines(self, until: Rehearsal | None, give_up_at: float) -> None:
        try:
            while True:
                with self._lock:
                    if not self._queue or (until is not None and until.outcome is not _PENDING):
                        return
                    worker = self._worker
                    deadline = self._head_deadline()
                wait_until = min(deadline, give_up_at)
                item = worker.next_line(wait_until if until is not None else None)
                with self._lock:
                    if worker is not self._worker:  # closed, or replaced meanwhile
                        continue
                    if item is _EMPTY:  # nothing more now (not waiting)
                        if time.perf_counter() >= deadline:
                            self._kill_head(timed_out=True)
                        return
                    if item is _TIMED_OUT:
                        if time.perf_counter() < deadline:  # given up on, not timed out
                            return
                        self._kill_head(timed_out=True)
                    elif item is None:
                        self._kill_head(timed_out=False)
                    else:
                        self._answer(*item)
        except BaseException:
            # Anything unexpected (KeyboardInterrupt included) leaves jobs in flight: this
            # child's next lines would answer for the wrong candidate.
            with self._lock:
                if self._worker is not None:
                    self._worker.kill()
                    self._worker = None
                for job in self._queue:
                    job._finish(CandidateCrashed("interrupted while it was being rehearsed"), None)
                self._queue.clear()
            raise

    def _answer(self, at: float, line: str) -> None:
        """One line of the child's for the job at the head of the queue."""
        worker, head = self._worker, self._queue[0]
        if line == "ready":
            worker.ready = True
            head.started = max(head.sent, at)
            return
        if head.started is None:
            head.started = max(head.sent, at)
        if line.startswith("stage "):
            head.stage = line[len("stage ") :]
            return
        if line.startswith("took "):
            head.took = float(line[len("took ") :])
            return
        if line not in ("done", "error"):
            return  # not a protocol line
        self._queue.popleft()
        worker.mark_log()
        if self._queue:  # the child starts the next job now
            self._queue[0].started = max(self._queue[0].sent, at)
        limit = head.started + (head.allowed_s if head.allowed_s is not None else math.inf)
        if at > limit:  # answered, but later than allowed (this process was busy meanwhile)
            head._finish(self._timed_out(head.stage, "rehearsed in a child process"), at)
        elif line == "done":
            head._finish(None, at)
        else:
            message = (head.job / "error.txt").read_text().strip()
            if head.stage == "load":
                head._finish(NotRehearsable(message), at)
            else:
                head._finish(
                    RehearsalError(f"{head.stage}: {message} (in the child process rehearsing it)"),
                    at,
                )

    def _kill_head(self, timed_out: bool) -> None:
        """The child is stuck past the head job's time, or gone: that job's verdict; the jobs
        behind it go to a fresh child."""
        worker, head = self._worker, self._queue.popleft()
        now = time.perf_counter()
        if not worker.ready:
            worker.kill()
            outcome: BaseException = RehearsalUnavailable(
                "the child process did not start" + ("" if timed_out else f" ({worker.death()})")
            )
        elif timed_out:
            worker.kill()
            outcome = self._timed_out(head.stage, "rehearsed in a child process, which was killed")
        else:
            outcome = CandidateCrashed(
                f"{head.stage} killed the child process rehearsing it ({worker.death()})"
            )
        self._worker = None
        head._finish(outcome, now)
        waiting, self._queue = list(self._queue), deque()
        if isinstance(outcome, RehearsalUnavailable):
            for job in waiting:
                job._finish(outcome, now)
            return
        for job in waiting:
            job.started = None
            try:
                self._send(job)
            except RehearsalUnavailable as exc:
                job._finish(exc, now)

    def _directory(self) -> Path:
        if self._tmp is None:
            self._tmp = Path(tempfile.mkdtemp(prefix="infertune-isolation-"))
        return self._tmp

    def close(self) -> None:
        """Stop the child worker and remove every file written for it."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._worker is not None:
            # Jobs nobody waits for any more, or none ever sent (it may still be importing:
            # nothing to wait for).
            if self._queue or not self._jobs:
                self._worker.kill()
            else:
                self._worker.stop()
            self._worker = None
        self._queue.clear()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


_TIMED_OUT = object()  # no line before the deadline
_EMPTY = object()  # no line now (a look without waiting)
_PENDING = object()  # a rehearsal not answered yet


class Rehearsal:
    """One candidate's rehearsal, submitted to the child process; `wait()` for its verdict."""

    def __init__(self, isolation: Isolation, name: str, job: Path, allowed_s: float | None):
        self._isolation = isolation
        self.name = name
        self.job = job
        self.allowed_s = allowed_s
        self.stage = "load"
        self.sent = 0.0
        self.started: float | None = None  # perf_counter when the child began it
        self.finished: float | None = None
        self.took: float | None = None  # seconds, as the child measured them
        self.outcome: Any = _PENDING

    def done(self) -> bool:
        """Whether the verdict is in (reads what the child has said, without waiting)."""
        if self.outcome is _PENDING:
            self._isolation._pump(None)
        return self.outcome is not _PENDING

    def wait(self, give_up_at: float = math.inf) -> bool:
        """True once the child ran it on every input and survived; False if no verdict came
        by `give_up_at` (it stays queued). Else raises CandidateCrashed or CandidateTimeout
        (the child is gone), RehearsalError (the candidate raised there), NotRehearsable
        (its class does not import there), RehearsalUnavailable (no child can run here)."""
        if self.outcome is _PENDING:
            self._isolation._pump(self, give_up_at)
        if self.outcome is _PENDING:
            return False
        if self.outcome is not None:
            raise self.outcome
        return True

    @property
    def child_s(self) -> float | None:
        """Seconds the child spent on it, once answered (its own measurement)."""
        if self.took is not None:
            return self.took
        if self.started is None or self.finished is None:
            return None
        return max(0.0, self.finished - self.started)

    def _finish(self, outcome: BaseException | None, at: float | None) -> None:
        self.outcome = outcome
        self.finished = at
        if self.child_s is not None:
            self._isolation.child_seconds[self.name] = self.child_s
        shutil.rmtree(self.job, ignore_errors=True)


class _Worker:
    """One child process, its protocol lines (a reader thread queues them) and its log."""

    def __init__(self, directory: Path):
        self._log_path = directory / f"child-{time.monotonic_ns()}.log"
        self._log = open(self._log_path, "wb")  # noqa: SIM115 (closed in stop/kill)
        try:
            self._process = start_module(
                "infertune.pipeline.rehearsal_child",
                str(directory),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._log,
                text=True,
            )
        except ChildUnavailable as exc:
            self._log.close()
            raise RehearsalUnavailable(str(exc)) from exc
        self._lines: queue.Queue[tuple[float, str] | None] = queue.Queue()
        self.created = time.perf_counter()
        self.ready = False
        self._log_start = 0  # where the current job's part of the log begins
        threading.Thread(target=self._read, name="infertune rehearsal reader", daemon=True).start()

    def _read(self) -> None:
        for line in self._process.stdout:
            self._lines.put((time.perf_counter(), line.strip()))
        self._lines.put(None)  # end of output: the child is gone

    def alive(self) -> bool:
        return self._process.poll() is None

    def send(self, text: str) -> None:
        try:
            self._process.stdin.write(text + "\n")
            self._process.stdin.flush()
        except OSError:  # already gone: its end of output says how
            pass

    def mark_log(self) -> None:
        """The next job's part of the log begins here (for death()'s last words)."""
        self._log_start = self._log_path.stat().st_size

    def next_line(self, deadline: float | None) -> Any:
        """(arrival time, line) of the child's next line; None once it is gone; _TIMED_OUT
        at the deadline; with deadline None, _EMPTY where no line has arrived yet."""
        try:
            if deadline is None:
                return self._lines.get_nowait()
            wait = deadline - time.perf_counter()
            if wait >= _WAIT_MAX:
                return self._lines.get()
            return self._lines.get(timeout=max(0.0, wait))
        except queue.Empty:
            return _EMPTY if deadline is None else _TIMED_OUT

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
