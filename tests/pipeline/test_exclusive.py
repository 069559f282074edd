"""Timing has the machine to itself (pipeline/exclusive.py): no work of optimize() runs while a
candidate is timed, and the child processes it started are stopped meanwhile."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from helpers import dense_model, needs_onnxruntime, target_for

import infertune
from infertune.pipeline.exclusive import Exclusive
from infertune.pipeline.timing import measure_interleaved
from infertune.system.children import started
from infertune.system.environment import usable_cores


def test_timing_waits_for_the_work_of_other_threads_and_holds_new_work_back():
    exclusive = Exclusive()
    events = []
    working = threading.Event()

    def work(seconds: float, name: str) -> None:
        with exclusive.work():
            working.set()
            time.sleep(seconds)
            events.append(("end", name, time.perf_counter()))

    first = threading.Thread(target=work, args=(0.3, "first"))
    first.start()
    working.wait()
    with exclusive.timing():
        began = time.perf_counter()
        # Work asked for during the timing waits for its end.
        late = threading.Thread(target=work, args=(0.0, "late"))
        late.start()
        time.sleep(0.2)
        ended = time.perf_counter()
    first.join()
    late.join()
    by_name = {name: at for _, name, at in events}
    assert by_name["first"] <= began  # the timing began once the first work had ended
    assert by_name["late"] >= ended  # the late work ran after the timing
    assert exclusive.waited_s >= 0.2  # most of the first work's 0.3 s, said in the report
    assert exclusive.timings == 1
    assert "waited" in exclusive.note()


def test_a_timing_inside_a_stage_of_its_own_thread_does_not_wait_for_it():
    exclusive = Exclusive()
    # A gate's timing inside its own stage, and a timing nested in it: one timing.
    with exclusive.work(), exclusive.timing(), exclusive.timing():
        pass
    assert exclusive.timings == 1


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc (Linux)")
def test_child_processes_are_stopped_while_timing_and_go_on_after():
    spinner = started(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
    try:
        time.sleep(0.3)
        exclusive = Exclusive()
        with exclusive.timing():
            before = _cpu_seconds(spinner.pid)
            time.sleep(0.5)
            during = _cpu_seconds(spinner.pid) - before
        time.sleep(0.5)
        after = _cpu_seconds(spinner.pid) - before - during
        assert during <= 0.05, during  # stopped: a tick of slack for the signal's delivery
        assert after >= 0.2, after  # continued: it spins again
        assert exclusive.stopped == 1
    finally:
        spinner.kill()
        spinner.wait()


@pytest.mark.timing  # a speed ratio: wall-clock time (tests/conftest.py: tiers)
@needs_onnxruntime
def test_a_candidate_timed_beside_a_spinning_child_would_have_been_slowed():
    """The guard is real: ONNX Runtime's default session (one thread per core) timed while
    child processes of infertune spin on every core is slowed, and timed under the guard it
    is not; the two timed in alternating rounds, so the machine's drift hits both."""
    import keras

    from infertune.backends.onnxruntime.cpu import OnnxRuntimeCpu

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((512,)), keras.layers.Dense(1024), keras.layers.Dense(512)]
    )
    sample = np.random.default_rng(0).random((64, 512), np.float32)
    backend = OnnxRuntimeCpu()
    backend.prepare(target_for(model, sample))
    run = {"call": lambda: backend.run([sample])}
    spinners = [
        started(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        for _ in range(usable_cores())
    ]
    guarded, unguarded = [], []
    try:
        for _ in range(6):
            with Exclusive().timing():
                guarded.append(measure_interleaved(run, budget_s=0.3).stats["call"].mean)
            unguarded.append(measure_interleaved(run, budget_s=0.3).stats["call"].mean)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    # Spinners on every core take at least half of each: about 2x slower on two cores. The
    # mean call of a round, since a call shorter than the scheduler's time slice often runs
    # whole between two of a spinner's slices, which the median hides. The best round of
    # each: other load on the machine only adds to either.
    assert min(unguarded) > 1.5 * min(guarded), (guarded, unguarded)


@needs_onnxruntime
def test_the_report_says_how_long_timing_waited():
    sample = np.random.default_rng(0).random((4, 6), np.float32)
    opt = infertune.optimize(dense_model(), sample, backends=["onnxruntime-cpu"], verbose=False)
    assert any(n.startswith("timing had the machine to itself") for n in opt.report.notes)
