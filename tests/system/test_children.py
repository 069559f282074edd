"""Child processes are started one way (system/children.py): this interpreter, this sys.path, and a
time limit on whatever waits for them."""

from __future__ import annotations

import sys
import time

import pytest

from infertune.system.children import (
    ChildTimeout,
    ChildUnavailable,
    child_environment,
    run_module,
    start_module,
)


def test_a_child_runs_a_module_with_this_sys_path():
    done = run_module("timeit", "-n", "1", "-r", "1", "pass", timeout_s=60)
    assert done.returncode == 0 and "loop" in done.stdout
    assert child_environment(EXTRA="1")["EXTRA"] == "1"
    assert sys.path[0] in child_environment()["PYTHONPATH"].split(":")


def test_a_child_past_its_time_limit_is_killed():
    start = time.perf_counter()
    with pytest.raises(ChildTimeout, match="did not finish within 0.5 s"):
        run_module("timeit", "-n", "1", "-r", "1", "import time; time.sleep(60)", timeout_s=0.5)
    # Killed, not waited for (the limit plus the interpreter's start, with room for a busy
    # machine: far below the child's 60 s).
    assert time.perf_counter() - start < 30


def test_no_child_without_a_python_to_run_it(monkeypatch):
    monkeypatch.setattr(sys, "executable", "/usr/sbin/uwsgi")  # an embedding host
    with pytest.raises(ChildUnavailable, match="not a Python interpreter"):
        start_module("timeit")
