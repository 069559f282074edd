"""Which shared conversions go to a worker process (tf_worker.py) beside this one's work.

A conversion that a worker may build (export/registry.py `worker`) and that is expected to
take at least OFFLOAD_MIN_S goes there for a Keras model (saved for the worker as a .keras
file) where child processes are in use and no time budget is given (the model's save would
spend seconds before any candidate is known to fit); the worker's start (importing
TensorFlow, loading the model: about 5 s on two cores) then runs beside this process's work,
and the conversion beside the ONNX export. Where it cannot help (no free core, tight memory,
a class the worker cannot import), the report's notes say why it was made here.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from ..errors import one_line
from ..export.registry import CONVERSIONS, stage_name
from ..model.sizes import WORKER_BASE_BYTES
from ..system.environment import usable_cores
from ..system.settings import tf_worker_mode
from .planning import conversion_estimate_s
from .tf_worker import OffloadedConversion, custom_classes

if TYPE_CHECKING:
    from .context import Candidate, Preparation

__all__ = ["BUSY_WINDOW_S", "OFFLOAD_MIN_S", "offload"]

# A shared conversion expected to take at least this long goes to a worker process. Since the
# TFLite conversion stopped rebuilding its frozen function (3-4 s for ResNet50 128x128
# alone), the worker costs more than it saves at that size: optimize() took 31.7 s with it
# (the worker busy 17 s, this process waiting 6.4 s for it) and 28.8 s without, on the quiet
# 2-core machine (benchmarks/tuning_time.py --models resnet50).
OFFLOAD_MIN_S = 15.0


def offload(others: list[Candidate], run: Preparation) -> None:
    """Start a worker process for each shared conversion that is long enough and that a
    candidate to be tried needs (see the module's doc)."""
    source = run.target.source
    mode = tf_worker_mode()  # INFERTUNE_TF_WORKER
    if run.isolation.mode != "process" or run.probe is None or source is None:
        return
    if not source.is_keras:
        return
    if mode == "never":
        return
    if run.budget.limited:  # saving the model costs seconds a LiteRT candidate may not get
        return
    for key, conversion in CONVERSIONS.items():
        if conversion.worker is None or (conversion.samples and not run.target.calibration):
            continue
        needed = any(
            key in s.backend.conversions
            and s.backend.precision in run.options.precision
            and s.backend.available() is None
            for s in others
        )
        if not needed or key in run.target.conversions.built():
            continue
        if mode == "auto" and conversion_estimate_s(key, run.probe, run.record) < OFFLOAD_MIN_S:
            continue
        stage = stage_name(key)
        busy = _free_core() if mode == "auto" else None
        if busy is None and mode == "auto" and run.memory_tight is not None:
            # The worker's TensorFlow (0.65 GB), its copy of the model and its conversion
            # (3-4x the weights) would all be held beside this process's ONNX export.
            busy = f"the model is large here ({run.memory_tight})"
        if busy is None:
            busy = _no_memory_for_worker(key, run)
        classes: list[tuple[str, str]] = []
        if busy is None:
            try:
                classes = custom_classes(source.owner)
            except ValueError as exc:  # the worker could not load the model
                busy = str(exc)
        if busy is not None:
            run.target.notes.append(f"the {stage} was made here, not in a worker process: {busy}")
            continue
        try:
            with run.progress.timed(
                f"{stage}: saving the model for a worker process",
                text=f"starting the {stage} in a worker process",
            ):
                run.target.conversions.offload(key, OffloadedConversion(key, run.target, classes))
        except Exception as exc:  # it is made here, as without a worker
            run.target.notes.append(f"no worker process for the {stage}: {one_line(exc)}")


def _free_core() -> str | None:
    """None where a core is free for a worker process, else why not. A worker adds work (its
    imports, the model saved and loaded again: 5-10 s of CPU for ResNet50) to save time only
    by running on a core nothing else uses: on a machine whose cores other processes already
    fill, it would slow this process down instead. What this process and its children do
    does not count: the 1-minute load average, read alone, counted this process's own work
    just before (a model.predict() in the caller's script held the worker back); it is read
    only where /proc/stat is missing."""
    cores = usable_cores()
    others = _cores_busy_elsewhere()
    if others is not None:
        if others <= cores - 1:
            return None
        return (
            f"other processes kept {others:.1f} of {cores} cores busy (timed for "
            f"{BUSY_WINDOW_S:g} s), which leaves no core free for it"
        )
    try:
        load = os.getloadavg()[0]
    except OSError:  # not available on this platform: nothing says the cores are busy
        return None
    if load <= cores - 1:
        return None
    return f"the load average {load:.1f} on {cores} cores leaves no core free for it"


BUSY_WINDOW_S = 0.5  # how long the machine's use by other processes is timed


def _cores_busy_elsewhere() -> float | None:
    """Cores kept busy by other processes over BUSY_WINDOW_S: the machine's busy time
    (/proc/stat) less this process's own and its children's (the rehearsal child imports its
    runtimes meanwhile: 1.6 cores of 2 counted as busy elsewhere without it); None where
    /proc/stat is missing."""
    ticks_per_s = os.sysconf("SC_CLK_TCK")

    def busy_s() -> float:
        with open("/proc/stat") as stat:
            ticks = [int(v) for v in stat.readline().split()[1:8]]
        # user, nice, system, irq, softirq: not idle, iowait, nor steal (a virtual machine's
        # cores taken by its host count there, and no process of its own runs on them)
        return (sum(ticks) - ticks[3] - ticks[4]) / ticks_per_s

    def own_s() -> float:
        import resource  # POSIX: where it is missing, so is /proc/stat

        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime + _children_s(ticks_per_s)

    try:
        start, machine, own = time.perf_counter(), busy_s(), own_s()
        time.sleep(BUSY_WINDOW_S)
        elapsed = time.perf_counter() - start
        return max(0.0, (busy_s() - machine - (own_s() - own)) / elapsed)
    except (OSError, ValueError, ImportError):
        return None


def _children_s(ticks_per_s: int) -> float:
    """CPU seconds of this process's live children (/proc/PID/stat: utime, stime)."""
    me, total = str(os.getpid()), 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:  # it ended meanwhile
            continue
        if fields[1] == me:  # after the name: state, ppid, ... utime (12th), stime (13th)
            total += (int(fields[11]) + int(fields[12])) / ticks_per_s
    return total


def _no_memory_for_worker(key: str, run: Preparation) -> str | None:
    """None where the memory left holds a worker (a second copy of the model and its
    conversion) while this process makes the ONNX export, else why not."""
    budget = run.memory_budget
    if budget is None:
        return None
    try:
        weights = run.target.weights_bytes()
    except Exception:  # the trace fails: the conversions will say why
        return None
    factor = 1.0 + CONVERSIONS[key].memory + CONVERSIONS["onnx"].memory
    need = factor * weights + WORKER_BASE_BYTES
    if need <= budget:
        return None
    return (
        f"it would need about {need / 1e9:.1f} GB beside this process's ONNX export "
        f"(a second copy of the weights' {weights / 1e9:.2f} GB and its conversion); "
        f"{budget / 1e9:.1f} GB were free"
    )
