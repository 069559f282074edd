"""Quiet by default: a user who did not ask sees neither TensorFlow's C++ log lines nor
LiteRT's banner; one who sets TF_CPP_MIN_LOG_LEVEL gets what they set."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import needs_litert

NOISE = ("XNNPACK delegate", "cuInit", "oneDNN", "cuda drivers", "absl::InitializeLog", "0000 ")


def _without_level() -> dict:
    return {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}


@pytest.mark.slow
@needs_litert
def test_nothing_but_progress_reaches_a_user_who_did_not_ask(tmp_path):
    """The demo command on a CPU machine: progress and the report, none of TensorFlow's
    start-up lines (printed twice before), no cuInit error, no LiteRT banner. (In tmp_path:
    the demo writes its HTML report in the current directory.)"""
    done = subprocess.run(
        [sys.executable, "-m", "infertune", "demo", "--model", "mlp", "--backends", "litert",
         "--budget", "20"],
        env=_without_level(), capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "selected:" in done.stdout and "[infertune" in done.stderr  # progress is kept
    noise = [line for line in done.stderr.splitlines() if any(n in line for n in NOISE)]
    assert not noise, done.stderr


def test_a_level_the_user_set_is_kept():
    code = "import os, infertune; print(os.environ['TF_CPP_MIN_LOG_LEVEL'])"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.stdout.strip() == "0", done.stderr


def test_stderr_without_drops_only_the_unwanted_line():
    """Native writes (os.write) and Python's, in order, all but the unwanted line (real file
    descriptors: a new process, not pytest's capture)."""
    code = (
        "import os, re, sys\n"
        "from infertune.system.quiet import stderr_without\n"
        "with stderr_without(re.compile(rb'^banner\\n', re.M)):\n"
        "    os.write(2, b'before\\nbanner\\n')\n"
        "    print('from python', file=sys.stderr, flush=True)\n"
        "print('after', file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == "before\nfrom python\nafter\n", done.stderr
