"""The saved form: one format for the choice (the manifest and the tuning cache write the same
value), the output signature recorded for servers, and results saved by infertune 0.1.0's
format version 1 still load (tests/data/saved-v1, written by that version's own save())."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import TESTS, dense_model, needs_litert

import infertune
from infertune.result.saved import read_manifest

V1 = TESTS / "data" / "saved-v1"
# The same artifact on the same runtime version, on whichever CPU runs the tests: ONNX
# Runtime and XNNPACK pick kernels by the CPU's instruction set, which moves float32 sums by
# a few ulps between machines (1e-6 relative is ~8 ulps); a wrong input order or output
# mapping is off by the size of the outputs themselves.
SAME_RUNTIME_RTOL = 1e-6
SAME_RUNTIME_ATOL = 1e-7


def _v1(name: str, tmp_path: Path) -> Path:
    """A copy of a version 1 result (loading never writes, but a test must not risk it)."""
    return Path(shutil.copytree(V1 / name, tmp_path / name))


def test_a_version_1_result_loads_and_gives_the_outputs_it_gave(tmp_path):
    data = np.load(V1 / "dense-onnxruntime.npz")
    opt = infertune.load(_v1("dense-onnxruntime", tmp_path), verbose=False)
    assert opt.backend == "onnxruntime-cpu"
    np.testing.assert_allclose(opt(data["x"]), data["y"], SAME_RUNTIME_RTOL, SAME_RUNTIME_ATOL)
    # Version 1 recorded no output shapes: observed by running it, as servers need them.
    (spec,) = opt.output_signature.specs
    assert (spec.name, spec.dtype.name, spec.shape) == ("output", "float32", (None, 3))


def test_a_version_1_dict_result_keeps_its_names_and_order(tmp_path):
    data = np.load(V1 / "dict-onnxruntime.npz")
    opt = infertune.load(_v1("dict-onnxruntime", tmp_path), verbose=False)
    x = {"features": data["in_features"], "tokens": data["in_tokens"]}
    y = opt(x)
    assert set(y) == {"probs", "score"}
    for key in y:
        np.testing.assert_allclose(y[key], data[f"out_{key}"], SAME_RUNTIME_RTOL, SAME_RUNTIME_ATOL)
    assert opt.output_signature.names == ["probs", "score"]


@needs_litert
def test_a_version_1_exact_shape_result_keeps_its_exact_shape_path(tmp_path):
    data = np.load(V1 / "gru-exact-shape.npz")
    opt = infertune.load(_v1("gru-exact-shape", tmp_path), verbose=False)
    assert (opt.backend, opt.general_backend) == ("litert", "onnxruntime-cpu")
    assert opt.report.general_backend == "onnxruntime-cpu"  # its report said "other_shapes"
    for x, y in (("x0", "y0"), ("x1", "y1")):  # the sample's shape, and another length
        np.testing.assert_allclose(opt(data[x]), data[y], SAME_RUNTIME_RTOL, SAME_RUNTIME_ATOL)


@needs_litert
def test_a_version_1_result_saved_again_is_version_2(tmp_path):
    data = np.load(V1 / "gru-exact-shape.npz")
    again = infertune.load(_v1("gru-exact-shape", tmp_path), verbose=False).save(tmp_path / "v2")
    manifest = json.loads((again / "manifest.json").read_text())
    assert manifest["format_version"] == 2
    assert manifest["choice"]["general"] == "onnxruntime-cpu"
    assert manifest["choice"]["exact_shape"] == {"backend": "litert", "shapes": [[2, 6, 4]]}
    assert manifest["outputs"]["specs"] == [
        {"name": "output", "dtype": "float32", "shape": [None, None]}
    ]
    reloaded = infertune.load(again, verbose=False)
    np.testing.assert_array_equal(
        reloaded(data["x1"]), infertune.load(V1 / "gru-exact-shape", verbose=False)(data["x1"])
    )


def test_the_manifest_records_the_choice_and_the_output_signature(tmp_path, rng):
    x = rng.standard_normal((4, 6)).astype("float32")
    opt = infertune.optimize(dense_model(), x, backends=["onnxruntime-cpu"], verbose=False)
    manifest = read_manifest(opt.save(tmp_path / "saved"))
    assert manifest["choice"] == {
        "general": "onnxruntime-cpu", "by_batch": None, "exact_shape": None
    }  # fmt: skip
    assert [e["name"] for e in manifest["backends"]] == ["onnxruntime-cpu"]
    # The batch dimension changed between the verification inputs (batch 4 and 1): None.
    assert manifest["outputs"]["specs"] == [
        {"name": "output", "dtype": "float32", "shape": [None, 3]}
    ]


def test_the_python_triton_export_publishes_the_saved_output_signature(tmp_path, rng):
    x = rng.standard_normal((4, 6)).astype("float32")
    opt = infertune.optimize(dense_model(), x, backends=["onnxruntime-cpu"], verbose=False)
    export = opt.export_triton(tmp_path / "repo", "dense", backend="python")
    assert "dims: [ 3 ]" in export.config  # (None, 3) without the batch Triton gathers
    assert 'name: "output"' in export.config and "TYPE_FP32" in export.config


def test_the_cache_writes_the_choice_in_the_manifest_format(tmp_path, rng, monkeypatch):
    """A decision-only cache entry (a candidate that cannot be saved) keeps the same choice
    value a saved result's manifest keeps."""
    from infertune.backends.base import Backend
    from infertune.backends.onnxruntime.cpu import OnnxRuntimeCpu
    from infertune.backends.registry import BACKENDS

    class Unsaveable(OnnxRuntimeCpu):
        name = "ort-unsaveable"
        save_artifact = Backend.save_artifact  # the base's: "does not support saving yet"

    monkeypatch.setitem(BACKENDS, "ort-unsaveable", Unsaveable)
    x = rng.standard_normal((4, 6)).astype("float32")
    infertune.optimize(dense_model(), x, backends=["ort-unsaveable"], cache=tmp_path, verbose=False)
    (entry,) = tmp_path.iterdir()
    decision = json.loads((entry / "decision.json").read_text())
    assert decision["choice"] == {
        "general": "ort-unsaveable",
        "by_batch": None,
        "exact_shape": None,
    }
    assert decision["outputs"]["specs"][0]["shape"] == [None, 3]


def test_paths_expand_the_home_directory(tmp_path, rng, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    x = rng.standard_normal((4, 6)).astype("float32")
    opt = infertune.optimize(
        dense_model(), x, backends=["onnxruntime-cpu"], cache="~/cache", verbose=False
    )
    saved = opt.save("~/saved")
    assert saved == tmp_path / "home" / "saved" and (saved / "manifest.json").is_file()
    assert (tmp_path / "home" / "cache").is_dir()
    assert not (tmp_path / "~").exists()  # never a directory literally named ~
    assert infertune.load("~/saved", verbose=False).backend == "onnxruntime-cpu"


@pytest.mark.slow
def test_one_candidate_at_every_tuned_batch_size_keeps_every_size(tmp_path, rng):
    x = rng.standard_normal((4, 6)).astype("float32")
    opt = infertune.optimize(
        dense_model(), x, backends=["onnxruntime-cpu"], batch_sizes=[1, 8], verbose=False
    )
    assert set(opt.backends_by_batch) == {1, 4, 8}
    loaded = infertune.load(opt.save(tmp_path / "saved"), verbose=False)
    assert loaded.backends_by_batch == opt.backends_by_batch
    assert len(loaded.backends) == 1  # one runtime serves them all: nothing dispatched
