"""The `infertune` command as a user runs it, in a new process."""

from __future__ import annotations

import json
import subprocess
import sys


def _run(*args, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "infertune", *args],
        capture_output=True,
        text=True,
        timeout=300,
        **kwargs,
    )


def test_demo_prints_report_and_writes_json(tmp_path):
    done = _run("demo", "--model", "mlp", "--json", str(tmp_path / "r.json"), "--budget", "20")
    assert done.returncode == 0, done.stderr
    assert "infertune report: Keras model 'mlp'" in done.stdout
    assert "selected:" in done.stdout
    assert "[infertune" in done.stderr  # progress goes to stderr, the report to stdout
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["selected"] in [c["name"] for c in data["candidates"]]


def test_bad_argument_is_one_line_and_nonzero():
    done = _run("demo", "--model", "resnet9000")
    assert done.returncode != 0
    assert "invalid choice: 'resnet9000'" in done.stderr
