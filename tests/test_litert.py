"""LiteRT: the TFLite conversion run by ai-edge-litert, verified against the model."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest
from conftest import assert_matches_model, dense_model, dict_model, dict_sample

import infertune
from infertune.backends.litert import LiteRT
from infertune.inputs import build_signature
from infertune.models import load_model
from infertune.target import Target

needs_litert = pytest.mark.skipif(
    importlib.util.find_spec("ai_edge_litert") is None, reason="ai-edge-litert not installed"
)
# XNNPACK's float32 kernels sum in another order than TensorFlow's: round-off near 1e-7
# relative on outputs of order 1; 1e-5 is far below any conversion error.
FP32_RTOL = 1e-5


def conv_model():
    import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((12, 12, 3)),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(4),
        ]
    )


def prepared(model, sample) -> LiteRT:
    """The backend prepared on the Target that optimize() builds, outside the pipeline."""
    source = load_model(model)
    signature, flat = build_signature(sample, source.declared_inputs, source.default_float)
    reference, structure = source.call_flat(signature, flat)
    backend = LiteRT()
    backend.prepare(Target(source, signature, structure, [r.dtype for r in reference]))
    return backend, signature


@needs_litert
@pytest.mark.parametrize("make_model, shape", [(dense_model, (4, 6)), (conv_model, (4, 12, 12, 3))])
def test_litert_is_verified(make_model, shape):
    sample = np.random.default_rng(0).random(shape, dtype=np.float32)
    opt = infertune.optimize(make_model(), sample, backends=["litert"], verbose=False)
    result = opt.report.candidate("litert")
    assert result.status in ("ok", "selected"), str(opt.report)
    assert result.max_rel_err < FP32_RTOL


@needs_litert
def test_two_inputs_and_dict_outputs_map_by_name():
    # Outputs of different shapes (3 and 1 wide): a swapped order would fail on shape.
    model = dict_model()
    opt = infertune.optimize(
        model, dict_sample(np.random.default_rng(0)), backends=["litert"], verbose=False
    )
    assert opt.report.candidate("litert").status in ("ok", "selected"), str(opt.report)


@needs_litert
def test_any_batch_size_resizes_once():
    model = dict_model()
    backend, signature = prepared(model, dict_sample(np.random.default_rng(0), batch=4))
    for batch in (4, 1, 9, 9):  # the sample's size, two others, and a repeat
        x = dict_sample(np.random.default_rng(batch), batch=batch)
        flat = signature.flatten(x)  # inputs in signature order: features, tokens
        got = backend.run(flat)  # outputs in flat order: dict keys sorted, probs then score
        expected = model(x)
        assert_matches_model([expected["probs"], expected["score"]], got, rtol=FP32_RTOL)
        assert backend._shapes == [a.shape for a in flat]


@needs_litert
def test_outputs_are_copies():
    backend, signature = prepared(dense_model(), np.ones((2, 6), "float32"))
    first = backend.run([np.ones((2, 6), "float32")])[0].copy()
    kept = backend.run([np.ones((2, 6), "float32")])[0]
    backend.run([np.zeros((2, 6), "float32")])
    np.testing.assert_array_equal(kept, first)  # the next call did not overwrite it


def test_unavailable_without_litert(monkeypatch):
    # Stands for a machine without ai-edge-litert: None in sys.modules makes find_spec fail.
    monkeypatch.setitem(sys.modules, "ai_edge_litert", None)
    assert "pip install 'infertune[litert]'" in LiteRT().available()
    sample = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    model = dense_model()
    opt = infertune.optimize(model, sample, backends=["litert"], verbose=False)
    assert opt.report.candidate("litert").status == "unavailable"
    assert_matches_model(model(sample), opt(sample), rtol=1e-5)
