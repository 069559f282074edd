"""ONNX Runtime candidates: tuned session settings and int8 quantization, all verified."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx.numpy_helper
import pytest
from helpers import assert_matches_model, dense_model, forced, target_for

import infertune
from infertune.backends.onnxruntime.cpu import (
    OnnxRuntimeCpuInt8,
    OrtSettings,
    onnxruntime_cpu_variants,
)


def towers(seed: int = 0):
    """Two Dense towers side by side: parallel branches ORT_PARALLEL can run at once."""
    import keras

    keras.utils.set_random_seed(seed)
    x = keras.Input((6,))
    left, right = keras.layers.Dense(8)(x), keras.layers.Dense(8)(x)
    return keras.Model(x, keras.layers.Dense(3)(keras.layers.Concatenate()([left, right])))


@pytest.mark.slow
def test_every_session_variant_is_verified_and_distinct():
    sample = np.random.default_rng(0).standard_normal((8, 6)).astype("float32")
    names = [n for n in onnxruntime_cpu_variants() if not n.endswith("int8")]
    opt = infertune.optimize(towers(), sample, backends=names, verbose=False)
    for name in names:
        assert opt.report.candidate(name).status in ("ok", "selected"), opt.report
    assert "onnxruntime-cpu:threads=1" in names and "onnxruntime-cpu:parallel" in names


def test_the_parallel_mode_is_not_tried_on_a_chain_of_layers():
    """A chain has nothing to run at once: the parallel execution mode would only hand each
    node to another thread; it is skipped, and the report says why."""
    sample = np.random.default_rng(0).standard_normal((8, 6)).astype("float32")
    opt = infertune.optimize(
        dense_model(), sample, backends=["onnxruntime-cpu:parallel"], verbose=False
    )
    parallel = opt.report.candidate("onnxruntime-cpu:parallel")
    assert parallel.status == "skipped" and "no parallel branches" in parallel.reason


def test_the_parallel_width_counts_independent_matrix_operations():
    from infertune.export.onnx import parallel_width
    from infertune.export.registry import export_onnx

    def width(model, sample):
        target = target_for(model, sample)
        return parallel_width(onnx.load_from_string(export_onnx(target).model_bytes).graph)

    sample = np.zeros((2, 6), np.float32)
    assert width(dense_model(), sample) == 1
    assert width(towers(), sample) == 2


def test_chosen_settings_are_the_ones_called():
    sample = np.random.default_rng(0).standard_normal((8, 6)).astype("float32")
    model = dense_model()
    opt = forced(model, sample, "onnxruntime-cpu:threads=1")
    assert opt.backend == "onnxruntime-cpu:threads=1"
    options = opt.backends[0]._session.get_session_options()
    assert options.intra_op_num_threads == 1
    x = np.random.default_rng(3).standard_normal((5, 6)).astype("float32")
    assert_matches_model(model(x), opt(x), rtol=1e-4)  # float32 round-off of a 2-layer MLP


def test_settings_names():
    assert OrtSettings().suffix() == ""
    assert OrtSettings(intra_op_threads=2, graph_optimization="basic").suffix() == (
        ":threads=2:opt=basic"
    )


@pytest.mark.slow
def test_int8_is_off_by_default_and_judged_by_agreement_not_the_tolerance(tmp_path):
    model = dense_model(in_dim=32, out_dim=16)
    sample = np.random.default_rng(0).standard_normal((8, 32)).astype("float32")
    int8 = ["onnxruntime-cpu-int8"]
    default = infertune.optimize(model, sample, backends=int8, verbose=False)
    assert default.report.candidate("onnxruntime-cpu-int8").status == "skipped"
    assert "precision=" in default.report.candidate("onnxruntime-cpu-int8").reason

    # rtol=1e-6: int8 rounds every weight and every activation to one of at most 256 steps,
    # so its error is orders of magnitude above 1e-6 (float32 round-off of this MLP, what an
    # exact candidate shows, is about 1e-7). The float32 tolerance measures it, the agreement
    # rule judges it (accuracy.py: this regression output within 5% relative error).
    loose = infertune.optimize(
        model, sample, backends=int8, precision=("fp32", "int8"), rtol=1e-6, verbose=False
    )
    good = loose.report.candidate("onnxruntime-cpu-int8")
    assert good.status in ("ok", "selected"), str(loose.report)
    assert 1e-6 < good.max_rel_err < 0.05 and good.gate.startswith("agreement")
    assert good.precision == "int8"

    # What it ran is saved with its settings named, and its weights are 7-bit per channel: the
    # setting that keeps int16 pair sums from saturating on CPUs without VNNI (see
    # backends/onnxruntime/cpu.py), checked in the model file, not through an error level.
    loose.save(tmp_path / "int8")
    manifest = json.loads((tmp_path / "int8" / "manifest.json").read_text())
    assert manifest["backends"][0]["settings"]["quantization"] == {
        "weight_type": "QInt8", "per_channel": True, "reduce_range": True,
    }  # fmt: skip
    assert "per channel" in OnnxRuntimeCpuInt8.precision_note
    # The report names them too.
    assert f"onnxruntime-cpu-int8: {OnnxRuntimeCpuInt8.precision_note}" in loose.report.notes
    graph = onnx.load(tmp_path / "int8" / "model.onnx").graph
    weights = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer}
    quantized = {n: w for n, w in weights.items() if n.endswith("_quantized")}
    assert len(quantized) == 2  # both Dense kernels
    for name, w in quantized.items():
        assert w.dtype == np.int8 and 2 * 255 * int(np.abs(w).max()) <= 32767, name
        scale = weights[name.removesuffix("_quantized") + "_scale"]
        assert scale.shape == (w.shape[1],), name  # one scale per output channel


def test_gelu_converts_through_the_erfc_handler():
    """Keras' exact GELU lowers to TF's Erfc, which tf2onnx alone cannot convert."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="gelu")])
    sample = np.random.default_rng(0).standard_normal((4, 8)).astype("float32")
    opt = infertune.optimize(model, sample, backends=["onnxruntime-cpu"], verbose=False)
    result = opt.report.candidate("onnxruntime-cpu")
    # erfc as 1 - erf in float32: round-off near 1e-7, far inside rtol=1e-3.
    assert result.status in ("ok", "selected") and result.max_rel_err < 1e-5, str(opt.report)


def test_spinning_sessions_declare_a_cooldown_and_nospin_is_a_variant():
    from infertune.backends.onnxruntime.cpu import OnnxRuntimeCpu

    assert "onnxruntime-cpu:nospin" in onnxruntime_cpu_variants()
    nospin = OrtSettings(allow_spinning=False)
    options = nospin.session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert OnnxRuntimeCpu(nospin).cooldown_s == 0
    assert OnnxRuntimeCpu(OrtSettings(intra_op_threads=1)).cooldown_s == 0  # no workers
    assert OnnxRuntimeCpu().cooldown_s > 0
