"""The test session: its environment, the fixtures, and the tiers.

Tiny real models for the tests (real TensorFlow, real ONNX export, real ONNX Runtime) and the
other shared helpers live in helpers.py (`from helpers import dense_model`); fixtures here.

Tiers. `python -m pytest` runs the unit tier: every test without a tier marker, under four
minutes on two cores. Three markers (pyproject.toml) put a test in another tier, deselected by
default:

- `slow`: builds a Triton environment, starts Triton or Ray, or takes more than ~2 s on two
  cores (an end-to-end optimize() of several candidates or of a real network, a training, a
  child process: what a change to one part rarely needs at every run; CI runs it all);
- `network`: reaches the package index (pip resolving or installing);
- `timing`: asserts wall-clock time or page residency, which another process on the machine
  can move. A clock-free check of the same behaviour is in the unit tier where one exists;
  a wall-clock check left in the unit tier says in a comment why its margin cannot be
  reached; speed itself is measured in benchmarks/.

`--all-tiers` runs every tier (what CI runs: README.md, .ci/run); `--tier slow` (repeatable)
adds one; `-m EXPR` selects by marker instead (`-m timing` runs that tier alone); a test named
by its node id (`tests/deploy/test_ray.py::test_...`) runs whatever its tier. The run's summary
says how many tests of each tier were deselected, so that none seems to have vanished.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# What runs learn about the machine (its peak, tuning costs) goes to a file of this test
# session, never the user's ~/.cache (pipeline/machine.py).
if "INFERTUNE_MACHINE_FILE" not in os.environ:
    _machine_dir = tempfile.mkdtemp(prefix="infertune-tests-")
    atexit.register(shutil.rmtree, _machine_dir, ignore_errors=True)
    os.environ["INFERTUNE_MACHINE_FILE"] = os.path.join(_machine_dir, "machine.json")

# Measure for 0.3 s instead of 5 s (system/settings.py): tests check correctness, benchmarks speed.
os.environ.setdefault("INFERTUNE_MEASURE_S", "0.3")

import numpy as np
import pytest
from helpers import dense_model

import infertune


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture(scope="module")
def dense_saved(tmp_path_factory):
    """dense_model() tuned on ONNX Runtime and saved as `.../dense`: what the serving tests
    (Ray, the Open Inference Protocol) load."""
    x = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    opt = infertune.optimize(
        dense_model(), x, backends=["onnxruntime-cpu"], isolation="off", verbose=False
    )
    return opt.save(tmp_path_factory.mktemp("served") / "dense")


@pytest.fixture(scope="module")
def text_saved(tmp_path_factory):
    """The tiny text classifier (a (None, 1) string input, `x`) tuned with ONNX Runtime as
    the body and saved as `.../text`: what the serving tests send BYTES tensors to."""
    from preprocessing_models import text_classifier, text_sample

    opt = infertune.optimize(
        text_classifier(), text_sample(4), backends=["onnxruntime-cpu"], isolation="off",
        verbose=False,
    )  # fmt: skip
    return opt.save(tmp_path_factory.mktemp("served") / "text")


# -- tiers ------------------------------------------------------------------------------------
TIERS = ("slow", "network", "timing")  # markers registered in pyproject.toml
_LEFT_OUT = pytest.StashKey[tuple[int, dict[str, int]]]()


def pytest_addoption(parser):
    group = parser.getgroup("infertune tiers", "test tiers (tests/conftest.py)")
    group.addoption(
        "--all-tiers",
        action="store_true",
        help="run every tier: unit, slow, network and timing (what CI runs)",
    )
    group.addoption(
        "--tier",
        action="append",
        default=[],
        choices=TIERS,
        help="add this tier to the unit tier (repeatable); default: the unit tier alone",
    )


def _named(config) -> list[str]:
    """Node ids named on the command line (`path::test...`), relative to the rootdir."""
    named = []
    for arg in config.args:
        path, sep, rest = arg.partition("::")
        if not sep:
            continue
        full = (config.invocation_params.dir / path).resolve()
        try:
            path = full.relative_to(config.rootpath).as_posix()
        except ValueError:
            continue
        named.append(f"{path}::{rest}")
    return named


@pytest.hookimpl(trylast=True)  # after -k: the summary counts what the tiers alone left out
def pytest_collection_modifyitems(config, items):
    if config.getoption("all_tiers") or config.getoption("markexpr"):
        return  # every tier, or the marker expression decides
    wanted = set(config.getoption("tier"))
    named = _named(config)
    kept, left_out = [], []
    counts: dict[str, int] = {}
    for item in items:
        tiers = [t for t in TIERS if item.get_closest_marker(t) is not None]
        if not tiers or set(tiers) & wanted or _is_named(item.nodeid, named):
            kept.append(item)
            continue
        left_out.append(item)
        for tier in tiers:
            counts[tier] = counts.get(tier, 0) + 1
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept
    config.stash[_LEFT_OUT] = (len(left_out), counts)


def _is_named(nodeid: str, named: list[str]) -> bool:
    return any(nodeid == n or nodeid.startswith((f"{n}::", f"{n}[")) for n in named)


def pytest_terminal_summary(terminalreporter, config):
    total, counts = config.stash.get(_LEFT_OUT, (0, {}))
    if not total:
        return
    tiers = ", ".join(f"{n} {tier}" for tier, n in counts.items())
    terminalreporter.write_line(
        f"unit tier: {total} test{'s' if total > 1 else ''} of other tiers deselected ({tiers}); "
        "`--all-tiers` runs every tier, as CI does; `--tier NAME` adds one (tests/conftest.py)"
    )
