"""Saving and loading tuned results: real files, real runtimes, a new process without TensorFlow."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers import dense_model, dict_model, dict_sample, forced, needs_litert, needs_openvino

import infertune
from infertune._version import __version__
from infertune.backends.onnxruntime.cpu import OnnxRuntimeCpu
from infertune.model.inputs import (
    InputSignature,
    build_signature,
)

X = np.random.default_rng(7).standard_normal((5, 6)).astype("float32")


def tune(model, sample, backends, **options):
    """optimize() (its short measurement is conftest's): these tests check files and outputs."""
    opt = infertune.optimize(model, sample, backends=backends, verbose=False, **options)
    wanted = backends[0] if isinstance(backends[0], str) else backends[0].name
    assert opt.backend == wanted, str(opt.report)
    return opt


@pytest.fixture(scope="module")
def saved_ort(tmp_path_factory):
    """An ONNX Runtime result (one intra-op thread) of the dense model, saved once."""
    opt = tune(dense_model(), X, ["onnxruntime-cpu:threads=1"])
    return opt, opt.save(tmp_path_factory.mktemp("saved") / "ort")


@pytest.fixture
def ort_copy(saved_ort, tmp_path):
    """A private copy of the saved ONNX Runtime result, to modify."""
    return shutil.copytree(saved_ort[1], tmp_path / "copy")


def test_manifest_records_the_artifact_settings_signature_and_environment(saved_ort):
    opt, path = saved_ort
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["format_version"] == 2 and manifest["infertune_version"] == __version__
    assert manifest["choice"]["general"] == "onnxruntime-cpu:threads=1"
    (backend,) = manifest["backends"]
    assert backend["name"] == "onnxruntime-cpu:threads=1" and backend["kind"] == "onnxruntime-cpu"
    assert backend["settings"]["session"]["intra_op_threads"] == 1
    assert sorted(manifest["files"]) == ["model.onnx", "report.json"]
    assert len(manifest["files"]["model.onnx"]["sha256"]) == 64
    assert manifest["inputs"] == opt.input_signature.to_dict()
    assert manifest["outputs"]["specs"] == [
        {"name": "output", "dtype": "float32", "shape": [None, 3]}
    ]
    assert manifest["environment"]["packages"]["onnxruntime"] and manifest["fingerprint"]
    assert not any(p.suffix in (".pkl", ".pickle") for p in path.iterdir())


def test_load_in_a_new_process_is_identical_and_never_imports_tensorflow(saved_ort, tmp_path):
    opt, path = saved_ort
    paths = [path]
    if importlib.util.find_spec("openvino") is not None:
        ov = tune(dense_model(), X, ["openvino-cpu"])
        paths.append(ov.save(tmp_path / "ov"))
    np.save(tmp_path / "x.npy", X)
    script = textwrap.dedent(
        f"""
        import sys, numpy as np
        import infertune
        x = np.load({str(tmp_path / "x.npy")!r})
        for i, path in enumerate({[str(p) for p in paths]!r}):
            opt = infertune.load(path)
            np.save({str(tmp_path)!r} + f"/y{{i}}.npy", opt(x))
            print(opt.backend)
        print("tensorflow" in sys.modules, "keras" in sys.modules)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split()
    assert lines[-2:] == ["False", "False"], done.stdout  # TensorFlow and Keras never imported
    assert lines[0] == "onnxruntime-cpu:threads=1"
    # Same runtime, same model bytes, same session settings, same input: the same kernels run
    # in the same order, so the outputs are bit-identical, no tolerance.
    np.testing.assert_array_equal(np.load(tmp_path / "y0.npy"), opt(X))
    if len(paths) == 2:
        assert lines[1] == "openvino-cpu"
        np.testing.assert_array_equal(np.load(tmp_path / "y1.npy"), ov(X))


@pytest.mark.parametrize("backend", ["tf-function", "tf-xla", "keras-eager"])
def test_tensorflow_candidates_round_trip(backend, tmp_path, rng):
    model = dict_model()
    sample = dict_sample(rng)
    opt = tune(model, sample, [backend])
    loaded = infertune.load(opt.save(tmp_path / backend))
    assert loaded.backend == backend
    x = dict_sample(rng, batch=3)
    expected, got = opt(x), loaded(x)
    assert set(got) == {"score", "probs"}
    for key in expected:
        # The same graph (or Keras model) with the same weights on the same TensorFlow.
        np.testing.assert_array_equal(got[key], expected[key])
    assert any("loaded from" in note for note in loaded.report.notes)


def test_a_loaded_result_saves_again(saved_ort, tmp_path):
    loaded = infertune.load(saved_ort[1])
    again = infertune.load(loaded.save(tmp_path / "again"))
    np.testing.assert_array_equal(again(X), saved_ort[0](X))  # the same file, bit for bit


def test_a_modified_artifact_is_refused_naming_the_file(ort_copy):
    model = ort_copy / "model.onnx"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model.write_bytes(bytes(data))
    with pytest.raises(infertune.ArtifactError, match=r"'model.onnx' .* was modified"):
        infertune.load(ort_copy)


def test_an_added_or_missing_file_is_refused(ort_copy):
    (ort_copy / "extra.onnx").write_bytes(b"\x00")
    with pytest.raises(infertune.ArtifactError, match="'extra.onnx' .* was not written by save"):
        infertune.load(ort_copy)
    (ort_copy / "extra.onnx").unlink()
    (ort_copy / "model.onnx").unlink()
    with pytest.raises(infertune.ArtifactError, match="'model.onnx' is missing"):
        infertune.load(ort_copy)


def test_a_newer_format_or_a_foreign_directory_is_refused(ort_copy, tmp_path):
    manifest = json.loads((ort_copy / "manifest.json").read_text())
    manifest["format_version"] = 99
    (ort_copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(infertune.ArtifactError, match="format version 99 .* a newer infertune"):
        infertune.load(ort_copy)
    with pytest.raises(infertune.ArtifactError, match="has no manifest.json"):
        infertune.load(tmp_path)
    with pytest.raises(infertune.ArtifactError, match="No saved result"):
        infertune.load(tmp_path / "nowhere")


def test_another_runtime_version_loads_with_a_warning(ort_copy):
    manifest = json.loads((ort_copy / "manifest.json").read_text())
    manifest["environment"]["packages"]["onnxruntime"] = "0.0.1"
    (ort_copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.warns(UserWarning, match="onnxruntime 0.0.1 when saved"):
        opt = infertune.load(ort_copy)
    assert any("tuned in another environment" in note for note in opt.report.notes)
    assert opt(X).shape == (5, 3)


@needs_openvino
def test_a_missing_runtime_names_the_extra_and_retune_falls_back(tmp_path, monkeypatch):
    model = dense_model()
    path = tune(model, X, ["openvino-cpu"]).save(tmp_path / "ov")
    # Fakes a missing package (the only mock here): find_spec returns None for a module whose
    # sys.modules entry is None, which is how OpenVinoCpu.available() looks for it.
    monkeypatch.setitem(sys.modules, "openvino", None)
    with pytest.raises(infertune.EnvironmentMismatchError, match=r'pip install "\.\[openvino\]"'):
        infertune.load(path)
    with pytest.raises(infertune.OptionError, match="needs the original model"):
        infertune.load(path, on_mismatch="retune")
    opt = infertune.load(path, model=model, sample_input=X, on_mismatch="retune", verbose=False)
    assert opt.backend == "keras-eager"  # the only candidate left that runs here
    assert opt.report.candidate("openvino-cpu").status == "unavailable"
    assert any("tuned again instead of loading" in note for note in opt.report.notes)


def test_save_refuses_a_non_empty_directory_and_an_unregistered_backend(saved_ort, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "file.txt").write_text("mine")
    with pytest.raises(infertune.ExportError, match="not an empty directory"):
        saved_ort[0].save(tmp_path / "full")

    class MyOrt(OnnxRuntimeCpu):  # a user's own candidate: load() could not find it
        name = "my-ort"

    opt = tune(dense_model(), X, [MyOrt()])
    with pytest.raises(infertune.ExportError, match="not one of infertune's registered"):
        opt.save(tmp_path / "mine")
    assert not (tmp_path / "mine").exists()


def test_signature_from_dict_round_trips(rng):
    signature, _ = build_signature(dict_sample(rng), None, np.dtype("float32"))
    data = json.loads(json.dumps(signature.to_dict()))
    again = InputSignature.from_dict(data)
    assert again.specs == signature.specs and again.structure == signature.structure
    assert again.sample_shapes == signature.sample_shapes


@needs_litert
def test_litert_result_saves_and_loads_without_tensorflow(tmp_path):
    model = dense_model()
    sample = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    opt = forced(model, sample, "litert")
    opt.save(tmp_path / "saved")
    code = (
        "import sys, numpy as np, infertune\n"
        f"opt = infertune.load({str(tmp_path / 'saved')!r}, verbose=False)\n"
        "x = np.load(sys.argv[1])\n"
        "np.save(sys.argv[2], opt(x))\n"
        "np.save(sys.argv[3], opt(x[:4]))\n"  # the sample's batch
        "assert 'tensorflow' not in sys.modules, 'load imported tensorflow'\n"
        "print(opt.backend)\n"
    )
    x = np.random.default_rng(1).standard_normal((5, 6)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "x.npy"), str(tmp_path / "y.npy"),
         str(tmp_path / "y4.npy")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "litert"
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), opt(x))  # the same runtime
    np.testing.assert_array_equal(np.load(tmp_path / "y4.npy"), opt(x[:4]))
