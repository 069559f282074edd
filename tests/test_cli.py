"""The `infertune` command: every verb, its errors, and `python -m infertune` in a new process."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from helpers import dense_model, dict_model

from infertune.cli import main


@pytest.mark.slow  # a process importing TensorFlow, tuning under a 20 s budget: 7-23 s
def test_demo_in_a_new_process(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "infertune", "demo", "--model", "mlp", "--budget", "20",
         "--json", str(tmp_path / "r.json")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "infertune report: Keras model 'mlp'" in done.stdout and "selected:" in done.stdout
    assert "[infertune" in done.stderr  # progress goes to stderr, the report to stdout
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["selected"] in [c["name"] for c in data["candidates"]]


def test_optimize_a_keras_file_then_print_its_report(tmp_path, capsys):
    dense_model().save(tmp_path / "m.keras")
    code = main(["optimize", str(tmp_path / "m.keras"), "--backends", "tf-function", "--batch",
                 "3", "--json", str(tmp_path / "r.json"), "--quiet"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "x: shape (None, 6) float32   batch: 3" in out
    assert main(["report", str(tmp_path / "r.json")]) == 0
    assert capsys.readouterr().out.splitlines()[:5] == out.splitlines()[:5]


def test_optimize_with_a_sample_file_and_dict_inputs(tmp_path, capsys):
    dict_model().save(tmp_path / "d.keras")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "x.npz", features=rng.random((2, 4), dtype=np.float32),
             tokens=rng.integers(0, 20, (2, 5)).astype("int32"))  # fmt: skip
    code = main(["optimize", str(tmp_path / "d.keras"), "--sample", str(tmp_path / "x.npz"),
                 "--backends", "onnxruntime-cpu", "--quiet"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "features: shape (None, 4) float32; tokens: shape (None, 5) int32" in out


def test_undeclared_inputs_need_input_shapes(tmp_path, capsys):
    import tensorflow as tf

    class Double(tf.Module):
        @tf.function
        def __call__(self, x):
            return 2.0 * x

    module = Double()
    module.__call__.get_concrete_function(tf.TensorSpec((None, 3), tf.float32))
    module.__call__.get_concrete_function(tf.TensorSpec((None, 4), tf.float32))
    tf.saved_model.save(module, str(tmp_path / "double"))
    assert main(["optimize", str(tmp_path / "double"), "--quiet"]) == 1
    assert "give them with --input" in capsys.readouterr().err
    code = main(["optimize", str(tmp_path / "double"), "--input", "2x3:float32", "--quiet",
                 "--backends", "tf-function"])  # fmt: skip
    assert code == 0 and "x: shape (None, 3) float32" in capsys.readouterr().out


def test_env_lists_every_candidate(capsys):
    from infertune import available_backends

    assert main(["env"]) == 0
    out = capsys.readouterr().out
    for name in available_backends():
        assert name in out
    assert "onnxruntime-cpu-int8" in out and "off by default" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["demo", "--model", "resnet9000"], "invalid choice: 'resnet9000'"),
        (["optimize"], "the following arguments are required: path"),
        (["optimize", "m.keras", "--batch", "0"], "must be >= 1"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
)
def test_bad_arguments_give_one_line_and_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert len(err.strip().splitlines()) == 1 and message in err


def test_errors_from_the_library_exit_1(tmp_path, capsys):
    assert main(["optimize", str(tmp_path / "missing.keras")]) == 1
    assert capsys.readouterr().err.startswith("infertune: error: No model at")
    (tmp_path / "bad.json").write_text("{}")
    assert main(["report", str(tmp_path / "bad.json")]) == 1
    assert "is not an infertune report" in capsys.readouterr().err


def test_isolation_options_reach_optimize(tmp_path, capsys):
    dense_model().save(tmp_path / "m.keras")
    code = main(["optimize", str(tmp_path / "m.keras"), "--backends", "onnxruntime-cpu",
                 "--isolation", "thread", "--candidate-timeout", "none", "--quiet",
                 "--json", str(tmp_path / "r.json")])  # fmt: skip
    assert code == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert [c["status"] for c in report["candidates"]][1] in ("selected", "ok")


@pytest.mark.parametrize("argv", [["--isolation", "fork"], ["--candidate-timeout", "0"]])
def test_bad_isolation_options_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["demo", *argv])
    assert exit_.value.code == 2 and argv[0] in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--save", "{full}"], "is not an empty directory"),
        (["--json", "{missing}/r.json"], "does not exist"),
        (["--cache", "{file}"], "is not a directory"),
        (["--budget", "-1"], "time_budget_s must be a positive number"),
    ],
)
def test_checks_that_need_no_model_come_before_loading_it(tmp_path, capsys, extra, message):
    """The model path does not exist: an error about it would mean the check came later."""
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "kept.txt").write_text("mine")
    (tmp_path / "file").write_text("not a directory")
    paths = {"full": tmp_path / "full", "missing": tmp_path / "missing", "file": tmp_path / "file"}
    argv = ["optimize", str(tmp_path / "no-such-model.keras")]
    argv += [arg.format(**paths) for arg in extra]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert message in err and "no-such-model" not in err, err
    assert (tmp_path / "full" / "kept.txt").read_text() == "mine"


def test_env_says_tensorflow_candidates_need_tensorflow(monkeypatch):
    """A deploy environment without TensorFlow: keras-eager, tf-function and tf-xla are not
    listed as available (the fake is only the missing package, as find_spec sees it)."""
    import sys as _sys

    from infertune.backends.keras_eager import KerasEager
    from infertune.backends.registry import BACKENDS

    monkeypatch.setitem(_sys.modules, "tensorflow", None)
    for backend in (KerasEager(), BACKENDS["tf-function"](), BACKENDS["tf-xla"]()):
        assert backend.available() == "tensorflow is not installed (pip install tensorflow)"
