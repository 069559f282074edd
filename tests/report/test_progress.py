"""Progress: plain lines when stderr is not a terminal, a live line on one, silence if asked."""

from __future__ import annotations

import io

import numpy as np
from helpers import dense_model

import infertune
from infertune.report.progress import Progress


class FakeTerminal(io.StringIO):
    """Stands for a terminal (no real TTY in CI): rich draws its live line into it."""

    def isatty(self) -> bool:
        return True


def test_plain_lines_when_not_a_terminal(capsys):
    sample = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    infertune.optimize(dense_model(), sample, backends=["tf-function"], verbose=True)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("[infertune")]
    assert any("tf-function: preparing" in line for line in lines)
    assert any("tf-function: verified" in line for line in lines)
    assert any(" selected " in line for line in lines)
    assert not any("measuring: round" in line for line in lines)  # no line per round


def test_verbose_false_is_silent(capsys):
    sample = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    infertune.optimize(dense_model(), sample, backends=["tf-function"], verbose=False)
    assert capsys.readouterr().err == ""


def test_live_line_on_a_terminal():
    stream = FakeTerminal()
    with Progress(True, stream) as progress:
        progress.stage("tf-xla: preparing")
        progress.say("tf-xla: verified")
    text = stream.getvalue()
    assert "tf-xla: verified" in text  # events are printed above the live line
    assert "\x1b[" in text  # rich drew (and cleared) a live status line with escape codes
