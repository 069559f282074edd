"""Triton export: config.pbtxt checked by parsing it with Triton's own ModelConfig schema
(tritonclient's model_config_pb2), the model files in place, the tuned settings carried over."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import dense_model, dict_model, dict_sample, needs_litert, needs_openvino

import infertune
from infertune.cli import main
from infertune.system.environment import install_hint

model_config_pb2 = pytest.importorskip(
    "tritonclient.grpc.model_config_pb2", reason="pip install tritonclient (the test extra)"
)
from google.protobuf import text_format  # noqa: E402  (after the skip: protobuf comes with it)


def parse(path):
    """config.pbtxt as Triton reads it: a ModelConfig message in protobuf text format."""
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def tensors(config_tensors):
    return {
        t.name: (model_config_pb2.DataType.Name(t.data_type), list(t.dims)) for t in config_tensors
    }


def test_onnxruntime_result_with_its_threads_and_dict_io(tmp_path, rng):
    opt = infertune.optimize(
        dict_model(), dict_sample(rng), backends=["onnxruntime-cpu:threads=1"], verbose=False
    )
    assert opt.backend == "onnxruntime-cpu:threads=1", str(opt.report)
    export = opt.export_triton(tmp_path / "repo", "scorer")
    config = parse(tmp_path / "repo" / "scorer" / "config.pbtxt")
    assert config.name == "scorer" and config.backend == "onnxruntime"
    assert config.max_batch_size == 0 and config.default_model_filename == "model.onnx"
    assert tensors(config.input) == {
        "in_0": ("TYPE_FP32", [-1, 4]),
        "in_1": ("TYPE_INT32", [-1, 5]),
    }
    outputs = tensors(config.output)
    assert sorted(outputs.values()) == [("TYPE_FP32", [-1, 1]), ("TYPE_FP32", [-1, 3])]
    assert config.parameters["intra_op_thread_count"].string_value == "1"
    assert config.parameters["execution_mode"].string_value == "0"
    assert [g.kind for g in config.instance_group] == [model_config_pb2.ModelInstanceGroup.KIND_CPU]
    assert (tmp_path / "repo" / "scorer" / "1" / "model.onnx").is_file()
    assert export.names["in_0"] == "features" and export.names["in_1"] == "tokens"
    assert sorted(export.names[name] for name in outputs) == ["probs", "score"]

    batched = opt.export_triton(tmp_path / "repo", "scorer", version=2, max_batch_size=16)
    config = parse(tmp_path / "repo" / "scorer" / "config.pbtxt")
    assert config.max_batch_size == 16 and config.HasField("dynamic_batching")
    assert tensors(config.input)["in_0"] == ("TYPE_FP32", [4])  # Triton adds the batch
    assert any("replaced the existing" in note for note in batched.notes)
    with pytest.raises(infertune.ExportError, match="already exists"):
        opt.export_triton(tmp_path / "repo", "scorer", version=2)


@needs_openvino
def test_openvino_result_carries_its_hint_and_says_what_it_cannot(tmp_path):
    x = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    opt = infertune.optimize(dense_model(), x, backends=["openvino-cpu"], verbose=False)
    assert opt.backend == "openvino-cpu", str(opt.report)
    export = opt.export_triton(tmp_path, "dense")
    config = parse(tmp_path / "dense" / "config.pbtxt")
    assert config.backend == "openvino" and config.default_model_filename == "model.onnx"
    assert config.parameters["PERFORMANCE_HINT"].string_value == "LATENCY"
    assert "HINT_BF16" not in config.parameters
    assert any("f32 inference precision cannot be pinned" in note for note in export.notes)
    assert tensors(config.input) == {"in_0": ("TYPE_FP32", [-1, 6])}


def test_tf_xla_result_is_a_savedmodel_with_xla(tmp_path):
    x = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    opt = infertune.optimize(dense_model(), x, backends=["tf-xla"], verbose=False)
    assert opt.backend == "tf-xla", str(opt.report)
    opt.export_triton(tmp_path, "dense")
    config = parse(tmp_path / "dense" / "config.pbtxt")
    assert config.platform == "tensorflow_savedmodel" and not config.backend
    assert config.optimization.graph.level == 1  # XLA in Triton's TensorFlow backend
    assert tensors(config.input) == {"in_0": ("TYPE_FP32", [-1, 6])}
    assert tensors(config.output) == {"output_0": ("TYPE_FP32", [-1, 3])}
    assert (tmp_path / "dense" / "1" / "model.savedmodel" / "saved_model.pb").is_file()


@needs_litert
def test_litert_result_is_refused_with_the_reason(tmp_path):
    x = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    opt = infertune.optimize(dense_model(), x, backends=["litert"], verbose=False)
    assert opt.backend == "litert", str(opt.report)
    with pytest.raises(infertune.ExportError, match="no official LiteRT/TFLite backend"):
        opt.export_triton(tmp_path, "dense")
    assert not (tmp_path / "dense").exists()


def test_command_line_saves_then_exports(tmp_path, capsys):
    dense_model().save(tmp_path / "m.keras")
    code = main(["optimize", str(tmp_path / "m.keras"), "--backends", "onnxruntime-cpu",
                 "--batch", "2", "--quiet", "--save", str(tmp_path / "saved"),
                 "--cache", str(tmp_path / "cache")])  # fmt: skip
    assert code == 0 and "saved onnxruntime-cpu to" in capsys.readouterr().out
    assert len(list((tmp_path / "cache").iterdir())) == 1
    code = main(["export-triton", str(tmp_path / "saved"), str(tmp_path / "repo"),
                 "--name", "dense", "--max-batch-size", "8"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "(onnxruntime)" in out and "in_0 = x" in out
    config = parse(tmp_path / "repo" / "dense" / "config.pbtxt")
    assert config.max_batch_size == 8 and tensors(config.input) == {"in_0": ("TYPE_FP32", [6])}

    assert main(["export-triton", str(tmp_path / "saved"), str(tmp_path / "repo"),
                 "--name", "dense"]) == 1  # fmt: skip
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "already exists" in err
    assert main(["export-triton", str(tmp_path), str(tmp_path / "repo"), "--name", "x"]) == 1
    assert "has no manifest.json" in capsys.readouterr().err


@needs_litert
def test_python_backend_takes_any_candidate_litert_included(tmp_path):
    x = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    opt = infertune.optimize(dense_model(), x, backends=["litert"], verbose=False)
    assert opt.backend == "litert", str(opt.report)
    export = opt.export_triton(tmp_path, "dense", backend="python")
    config = parse(tmp_path / "dense" / "config.pbtxt")
    assert config.backend == "python" and config.max_batch_size == 32
    assert config.HasField("dynamic_batching")
    assert tensors(config.input) == {"x": ("TYPE_FP32", [6])}  # the model's own names
    assert tensors(config.output) == {"output": ("TYPE_FP32", [3])}
    version = tmp_path / "dense" / "1"
    assert (
        "from infertune.deploy.triton_python import TritonPythonModel"
        in (version / "model.py").read_text()
    )
    restored = infertune.load(version / "infertune_result", verbose=False)  # a whole result
    np.testing.assert_array_equal(restored(x), opt(x))
    assert any(install_hint("litert") in note for note in export.notes)
    with pytest.raises(infertune.OptionError, match="backend must be None"):
        opt.export_triton(tmp_path, "dense", backend="onnxruntime")


def test_command_line_exports_for_the_python_backend(tmp_path, capsys):
    dense_model().save(tmp_path / "m.keras")
    assert main(["optimize", str(tmp_path / "m.keras"), "--backends", "onnxruntime-cpu",
                 "--quiet", "--save", str(tmp_path / "saved")]) == 0  # fmt: skip
    code = main(["export-triton", str(tmp_path / "saved"), str(tmp_path / "repo"),
                 "--name", "dense", "--backend", "python", "--max-batch-size", "8"])  # fmt: skip
    assert code == 0 and "(python)" in capsys.readouterr().out
    config = parse(tmp_path / "repo" / "dense" / "config.pbtxt")
    assert config.backend == "python" and config.max_batch_size == 8


def test_a_string_model_exports_for_the_python_backend_only(text_saved, tmp_path):
    """The text classifier (split: TensorFlow head, ONNX Runtime body): no one Triton
    backend runs it, so the default export is refused with the reason; the Python backend
    takes it, its string input a TYPE_STRING tensor (BYTES on the wire)."""
    from infertune.deploy.triton import export_saved

    with pytest.raises(infertune.ExportError, match=r"backend='python'\) serves it"):
        export_saved(text_saved, tmp_path, "text")
    export_saved(text_saved, tmp_path, "text", backend="python")
    config = parse(tmp_path / "text" / "config.pbtxt")
    assert config.backend == "python" and config.max_batch_size == 32
    assert tensors(config.input) == {"x": ("TYPE_STRING", [1])}
    assert tensors(config.output) == {"output": ("TYPE_FP32", [3])}
