"""Packages: made once with TensorFlow, tuned where the model is served, without TensorFlow,
Keras or the model (pipeline/packaging.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers import assert_matches_model, dense_model, dict_model, dict_sample, needs_onnxruntime

import infertune
from infertune.errors import ArtifactError, ModelError, OptionError

pytestmark = needs_onnxruntime


@pytest.fixture(scope="module")
def dict_package(tmp_path_factory):
    """The dict model's package, with batch sizes 4 and 16."""
    model, sample = dict_model(), dict_sample(np.random.default_rng(0))
    path = tmp_path_factory.mktemp("package") / "dict"
    infertune.package(model, sample, path, batch_sizes=[4, 16], verbose=False)
    return model, path


def test_a_package_is_tuned_from_its_files_and_reproduces_the_model(dict_package):
    model, path = dict_package
    opt = infertune.optimize(path, backends=["onnxruntime-cpu", "litert"], verbose=False)
    statuses = {c.name: c.status for c in opt.report.candidates}
    assert statuses["keras-eager"] == "unavailable"  # the model is not in a package
    assert statuses["onnxruntime-cpu"] in ("ok", "selected")
    assert statuses["litert"] in ("ok", "selected")
    assert sorted(opt.backends_by_batch) == [4, 16]
    for batch in (1, 4, 16, 9):
        x = dict_sample(np.random.default_rng(batch), batch=batch)
        expected = model(x)
        assert_matches_model({k: np.asarray(v) for k, v in expected.items()}, opt(x))
    assert any("tuned from the package" in note for note in opt.report.notes)


def test_a_tuned_package_reports_what_a_tuned_model_reports(dict_package):
    """The model and its package go through the same contest (pipeline/contest.py), so the two
    reports have the same parts: the memory line, the diagnosis, the stages, the notes on
    verification and on the rule, and candidates with the same fields filled in."""
    model, path = dict_package
    sample = dict_sample(np.random.default_rng(0))
    backends = ["onnxruntime-cpu", "litert"]
    from_model = infertune.optimize(
        model, sample, backends=backends, batch_sizes=[4, 16], verbose=False
    ).report
    from_package = infertune.optimize(path, backends=backends, verbose=False).report

    def parts(report) -> dict:
        data = report.to_dict()
        return {
            "sections": sorted(k for k, v in data.items() if v not in (None, [], {}, "")),
            "memory": sorted(report.memory or {}),
            "diagnosis": report.diagnosis is not None and report.diagnosis.peak_gflops > 0,
            "stages": sorted(report.stages.shared) if report.stages else [],
            "verified": [n.split(" inputs:")[0] for n in report.notes if "inputs:" in n],
            "rule": any(n.startswith("an element fails when") for n in report.notes),
            "measured": {
                c.name: sorted(k for k, v in c.to_dict().items() if v is not None)
                for c in report.candidates
                if c.name in backends
            },
        }

    model_parts, package_parts = parts(from_model), parts(from_package)
    assert model_parts["memory"] == package_parts["memory"] != []
    assert model_parts["diagnosis"] and package_parts["diagnosis"]
    assert model_parts["verified"] == package_parts["verified"] != []
    assert model_parts["rule"] and package_parts["rule"]
    assert model_parts["measured"] == package_parts["measured"]
    assert model_parts["sections"] == package_parts["sections"]
    assert {"measurement", "environment", "warm-up"} <= set(package_parts["stages"])


def test_a_package_keeps_the_options_that_decide_the_result(dict_package):
    _, path = dict_package
    with pytest.raises(OptionError, match="decides the result"):
        infertune.optimize(path, rtol=1e-2, verbose=False)
    with pytest.raises(OptionError, match="sample_input is missing"):
        infertune.optimize(dense_model(), verbose=False)


def test_a_changed_or_newer_package_is_refused(dict_package, tmp_path):
    import shutil

    _, path = dict_package
    changed = tmp_path / "changed"
    shutil.copytree(path, changed)
    with open(changed / "onnx" / "model.onnx", "ab") as f:
        f.write(b"\0")
    with pytest.raises(ArtifactError, match="differs from its manifest.*onnx/model.onnx"):
        infertune.optimize(changed, verbose=False)
    newer = tmp_path / "newer"
    shutil.copytree(path, newer)
    manifest = json.loads((newer / "manifest.json").read_text())
    manifest["format_version"] = 99
    (newer / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="format version 99, newer than"):
        infertune.optimize(newer, verbose=False)


def test_a_package_is_tuned_where_tensorflow_cannot_be_imported(tmp_path):
    """The whole tuning from a package, int8 quantized there from the stored export and
    calibration inputs, in a process where importing TensorFlow or Keras fails."""
    rng = np.random.default_rng(0)
    model = dense_model(16, 4)
    x = rng.standard_normal((2, 16)).astype("float32")
    calibration = rng.standard_normal((64, 16)).astype("float32")
    # Two batch sizes: the int8 candidate is judged there even where float32 is faster.
    path = infertune.package(
        model, x, tmp_path / "pkg", precision=("fp32", "int8"), calibration=calibration,
        batch_sizes=[2, 5], verbose=False,
    )  # fmt: skip
    fresh = rng.standard_normal((5, 16)).astype("float32")
    np.save(tmp_path / "fresh.npy", fresh)
    np.save(tmp_path / "expected.npy", np.asarray(model(fresh)))
    script = textwrap.dedent(
        f"""
        import sys, json, numpy as np
        sys.modules["tensorflow"] = None  # importing it fails
        sys.modules["keras"] = None
        import infertune
        opt = infertune.optimize({str(path)!r},
            backends=["onnxruntime-cpu", "onnxruntime-cpu-int8-static"], verbose=False)
        got = opt(np.load({str(tmp_path / "fresh.npy")!r}))
        expected = np.load({str(tmp_path / "expected.npy")!r})
        print(json.dumps({{
            "statuses": {{c.name: c.status for c in opt.report.candidates}},
            "error": float(np.abs(got - expected).max()),
            "scale": float(np.abs(expected).max()),
            "backend": opt.backend,
        }}))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["statuses"]["keras-eager"] == "unavailable"
    assert found["statuses"]["onnxruntime-cpu"] in ("ok", "selected")
    # Quantized there, from the package's export and calibration inputs, and judged there.
    assert found["statuses"]["onnxruntime-cpu-int8-static"] in ("ok", "selected"), found
    # int8 where chosen: within its agreement rule's 5%; float32: round-off.
    assert found["error"] <= 0.05 * found["scale"]


def test_a_split_model_package_says_it_needs_tensorflow(tmp_path):
    from preprocessing_models import text_classifier, text_sample

    path = infertune.package(text_classifier(), text_sample(4), tmp_path / "text", verbose=False)
    manifest = json.loads((path / "manifest.json").read_text())
    assert "TensorFlow" in manifest["needs_tensorflow"]
    with pytest.raises(ModelError, match="needs TensorFlow where it is tuned"):
        infertune.optimize(path, verbose=False)


@pytest.mark.slow
def test_the_command_line_packages_and_tunes(tmp_path):
    model = dense_model()
    model.save(tmp_path / "model.keras")
    np.savez(tmp_path / "x.npz", x=np.ones((2, 6), "float32"))
    package = [
        sys.executable, "-m", "infertune", "package", str(tmp_path / "model.keras"),
        "--sample", str(tmp_path / "x.npz"), "-o", str(tmp_path / "pkg"), "--quiet",
    ]  # fmt: skip
    done = subprocess.run(package, capture_output=True, text=True)
    assert done.returncode == 0 and "package written to" in done.stdout, done.stderr[-2000:]
    tune = [
        sys.executable, "-m", "infertune", "optimize", str(tmp_path / "pkg"),
        "--backends", "onnxruntime-cpu", "--quiet",
    ]  # fmt: skip
    done = subprocess.run(tune, capture_output=True, text=True)
    assert done.returncode == 0 and "selected: onnxruntime-cpu" in done.stdout, done.stderr[-2000:]
