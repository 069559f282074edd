"""Crashes and hangs contained: optimize() survives a candidate that really segfaults or hangs.

The crashing candidates (tests/crashing_backends.py) are real: one reads address 0 (SIGSEGV),
one sleeps for an hour. Without isolation either would kill or block this test process.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from crashing_backends import (
    RELEASE,
    HangsAtCompile,
    HangsInProcess,
    NotImportableInChild,
    RaisesInChild,
    RunsInChild,
    SegfaultsAtFirstCall,
)
from helpers import TESTS, dense_model, model_free_target

import infertune
from infertune.errors import OptionError


@pytest.fixture
def model_and_sample(rng):
    return dense_model(), rng.standard_normal((4, 6)).astype(np.float32)


def _by_name(opt):
    return {c.name: c for c in opt.report.candidates}


def test_a_segfaulting_candidate_is_failed_and_the_next_one_still_runs(model_and_sample):
    model, x = model_and_sample
    opt = infertune.optimize(
        model, x, backends=[SegfaultsAtFirstCall(), "onnxruntime-cpu"], verbose=False
    )
    crashed = _by_name(opt)["segfaults-at-first-call"]
    assert crashed.status == "failed"
    assert "SIGSEGV" in crashed.reason and "first call" in crashed.reason
    # A fresh child rehearsed the next candidate; it was verified and measured.
    assert _by_name(opt)["onnxruntime-cpu"].status in ("selected", "ok")
    np.testing.assert_allclose(opt(x), model(x), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_candidate_that_hangs_in_its_compiler_times_out(model_and_sample):
    model, x = model_and_sample
    start = time.perf_counter()
    opt = infertune.optimize(
        model,
        x,
        backends=[HangsAtCompile(), "onnxruntime-cpu"],
        candidate_timeout_s=3,
        verbose=False,
    )
    hung = _by_name(opt)["hangs-at-compile"]
    assert hung.status == "timeout"
    assert "compile" in hung.reason and "candidate_timeout_s=3" in hung.reason
    assert _by_name(opt)["onnxruntime-cpu"].status in ("selected", "ok")
    # Not the hour the candidate sleeps. 60 s is over 10x this test's 2-5 s on a busy 2-core
    # machine: a margin that keeps this wall-clock check in the unit tier (tests/conftest.py).
    assert time.perf_counter() - start < 60


def test_a_python_error_in_the_child_is_reported_with_its_message(model_and_sample):
    model, x = model_and_sample
    opt = infertune.optimize(model, x, backends=[RaisesInChild()], verbose=False)
    failed = _by_name(opt)["raises-at-first-call"]
    assert failed.status == "failed"
    assert "unsupported operator Foo" in failed.reason and "child process" in failed.reason


def test_a_hang_inside_this_process_times_out_with_thread_isolation(model_and_sample):
    model, x = model_and_sample
    try:
        opt = infertune.optimize(
            model,
            x,
            backends=[HangsInProcess()],
            isolation="thread",
            candidate_timeout_s=1,
            verbose=False,
        )
    finally:
        RELEASE.set()  # let the abandoned thread end
    hung = _by_name(opt)["hangs-in-process"]
    assert hung.status == "timeout" and "first call" in hung.reason
    assert opt.backend == "keras-eager"


def test_without_a_usable_python_executable_isolation_falls_back_to_threads(
    model_and_sample, monkeypatch
):
    import sys

    monkeypatch.setattr(sys, "executable", "/usr/sbin/uwsgi")  # an embedding host
    model, x = model_and_sample
    opt = infertune.optimize(model, x, backends=["onnxruntime-cpu"], verbose=False)
    assert _by_name(opt)["onnxruntime-cpu"].status in ("selected", "ok")
    assert any("fell back to threads" in note for note in opt.report.notes), opt.report.notes


def test_a_class_the_child_cannot_import_is_prepared_here_unrehearsed(model_and_sample):
    model, x = model_and_sample
    opt = infertune.optimize(model, x, backends=[NotImportableInChild()], verbose=False)
    assert _by_name(opt)["not-importable-in-child"].status == "mismatch"  # it ran, here
    assert any("without a rehearsal" in note for note in opt.report.notes), opt.report.notes


def test_an_enormous_timeout_means_no_limit(model_and_sample):
    model, x = model_and_sample
    opt = infertune.optimize(
        model, x, backends=["onnxruntime-cpu"], candidate_timeout_s=1e12, verbose=False
    )
    assert _by_name(opt)["onnxruntime-cpu"].status in ("selected", "ok")


def test_no_child_process_with_isolation_off(model_and_sample, monkeypatch):
    import subprocess

    def no_child(*args, **kwargs):
        raise AssertionError("isolation='off' started a child process")

    monkeypatch.setattr(subprocess, "Popen", no_child)
    model, x = model_and_sample
    opt = infertune.optimize(model, x, backends=["onnxruntime-cpu"], isolation="off", verbose=False)
    assert _by_name(opt)["onnxruntime-cpu"].status in ("selected", "ok")


@pytest.mark.parametrize(("option", "value"), [("isolation", "fork"), ("candidate_timeout_s", 0)])
def test_bad_isolation_options_are_refused(model_and_sample, option, value):
    model, x = model_and_sample
    with pytest.raises(OptionError, match=option):
        infertune.optimize(model, x, verbose=False, **{option: value})


def test_the_child_process_is_gone_after_optimize(model_and_sample):
    model, x = model_and_sample
    infertune.optimize(model, x, backends=["onnxruntime-cpu"], verbose=False)
    children = _children(os.getpid())
    assert not any("rehearsal_child" in command for command in children), children


def _children(pid: int) -> list[str]:
    """Command lines of the live child processes of `pid` (Linux /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            if parent == pid:
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    found.append(cmdline.read().replace(b"\0", b" ").decode())
        except (OSError, ValueError, IndexError):
            continue
    return found


def test_rehearsals_waited_for_by_several_threads_each_get_their_verdict():
    # optimize() prepares candidates on two background threads, and a thread variant waits
    # for its twin's rehearsal: every waiter must get the verdict, none may read another's
    # answer and wait for a line that never comes.
    import threading

    from infertune.pipeline.isolation import Isolation

    target, sample = model_free_target(np.zeros((2, 3), np.float32))
    isolation = Isolation("process", 60.0)
    try:
        for _ in range(5):
            rehearsals = [
                isolation.submit(RunsInChild(), target, [sample] * 3, 60.0) for _ in range(3)
            ]
            verdicts: list[bool] = []

            def wait(rehearsal, verdicts=verdicts):
                verdicts.append(rehearsal.wait(time.perf_counter() + 30))

            waiters = [  # two threads on each, as a twin and its variant
                threading.Thread(target=wait, args=(r,)) for r in rehearsals * 2
            ]
            start = time.perf_counter()
            for waiter in waiters:
                waiter.start()
            for waiter in waiters:
                waiter.join(40)
            assert verdicts == [True] * 6, verdicts
            assert time.perf_counter() - start < 30
    finally:
        isolation.close()


PARENT = """
import sys
import numpy as np
from crashing_backends import HangsAtCompile
from infertune.model.inputs import build_signature
from infertune.pipeline.isolation import Isolation
from infertune.model.structure import flatten
from infertune.model.target import Target

x = np.zeros((2, 3), np.float32)
signature, sample = build_signature(x, None, np.float32)
isolation = Isolation("process", None)
isolation.start()
print(isolation._worker._process.pid, flush=True)
isolation.submit(
    HangsAtCompile(), Target(None, signature, flatten(x)[1], [np.dtype("float32")]), [sample],
    None,
).wait()
"""


@pytest.mark.slow
def test_a_hung_child_ends_with_its_killed_parent_and_removes_its_files(tmp_path):
    import signal
    import subprocess
    import sys

    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(TESTS)}
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True, env=env
    )
    child = int(parent.stdout.readline())
    time.sleep(2)  # the child is inside the hung compile now
    assert _alive(child) and list(tmp_path.glob("infertune-isolation-*"))
    os.kill(parent.pid, signal.SIGKILL)  # as the OOM killer would
    parent.wait()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(child)
    assert not list(tmp_path.glob("infertune-isolation-*"))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
