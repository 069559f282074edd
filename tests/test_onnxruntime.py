"""ONNX Runtime candidates: tuned session settings and int8 quantization, all verified."""

from __future__ import annotations

import numpy as np
from conftest import assert_matches_model, dense_model

import infertune
from infertune.backends.onnxruntime import OrtSettings, onnxruntime_cpu_variants


def test_every_session_variant_is_verified_and_distinct():
    sample = np.random.default_rng(0).standard_normal((8, 6)).astype("float32")
    names = [n for n in onnxruntime_cpu_variants() if not n.endswith("int8")]
    opt = infertune.optimize(dense_model(), sample, backends=names, verbose=False)
    for name in names:
        assert opt.report.candidate(name).status in ("ok", "selected"), opt.report
    assert "onnxruntime-cpu:threads=1" in names and "onnxruntime-cpu:parallel" in names


def test_chosen_settings_are_the_ones_called():
    sample = np.random.default_rng(0).standard_normal((8, 6)).astype("float32")
    model = dense_model()
    opt = infertune.optimize(model, sample, backends=["onnxruntime-cpu:threads=1"], verbose=False)
    if opt.backend == "onnxruntime-cpu:threads=1":
        options = opt._backend._session.get_session_options()
        assert options.intra_op_num_threads == 1
    x = np.random.default_rng(3).standard_normal((5, 6)).astype("float32")
    assert_matches_model(model(x), opt(x), rtol=1e-4)  # float32 round-off of a 2-layer MLP


def test_settings_names():
    assert OrtSettings().suffix() == ""
    assert OrtSettings(intra_op_threads=2, graph_optimization="basic").suffix() == (
        ":threads=2:opt=basic"
    )


def test_int8_is_off_by_default_and_follows_the_tolerance():
    model = dense_model(in_dim=32, out_dim=16)
    sample = np.random.default_rng(0).standard_normal((8, 32)).astype("float32")
    default = infertune.optimize(model, sample, backends=["onnxruntime-cpu-int8"], verbose=False)
    assert default.report.candidate("onnxruntime-cpu-int8").status == "skipped"
    assert "precision=" in default.report.candidate("onnxruntime-cpu-int8").reason

    # Dynamic int8 quantizes weights and activations: about 1% relative error and up to 0.03
    # absolute on outputs of order 1. Far outside rtol=1e-4; inside rtol=0.2, atol=0.1.
    tight = infertune.optimize(
        model, sample, backends=["onnxruntime-cpu-int8"], precision=("fp32", "int8"),
        rtol=1e-4, verbose=False,
    )  # fmt: skip
    bad = tight.report.candidate("onnxruntime-cpu-int8")
    assert bad.status == "mismatch" and bad.max_rel_err > 1e-4
    loose = infertune.optimize(
        model, sample, backends=["onnxruntime-cpu-int8"], precision=("fp32", "int8"),
        rtol=0.2, atol=0.1, verbose=False,
    )  # fmt: skip
    good = loose.report.candidate("onnxruntime-cpu-int8")
    assert good.status in ("ok", "selected") and 0 < good.max_rel_err < 0.2


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
    from infertune.backends.onnxruntime import OnnxRuntimeCpu

    assert "onnxruntime-cpu:nospin" in onnxruntime_cpu_variants()
    nospin = OrtSettings(allow_spinning=False)
    options = nospin.session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert OnnxRuntimeCpu(nospin).cooldown_s == 0
    assert OnnxRuntimeCpu(OrtSettings(intra_op_threads=1)).cooldown_s == 0  # no workers
    assert OnnxRuntimeCpu().cooldown_s > 0
