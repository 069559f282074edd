"""A small, fast subset of the model zoo (benchmarks/zoo.py): the architecture kinds users
bring, tiny, through optimize() with every candidate that can run here.

What a user relies on, for each: no exact (fp32) candidate is rejected as `mismatch` (an
exact runtime that computes the same function must pass verification), the callable
matches `model(x)` at another batch size and at another length or image size than the
sample's, and the report names the candidate it chose.
"""

from __future__ import annotations

import numpy as np
import pytest

import infertune

# optimize()'s default rtol: every candidate was verified under it, so the callable must
# stay within it on inputs of other shapes too. Relative norm, as verification measures it.
RTOL = 1e-3


def relative_error(outputs, reference) -> float:
    import tensorflow as tf

    outs, refs = tf.nest.flatten(outputs), tf.nest.flatten(reference)
    assert len(outs) == len(refs)
    worst = 0.0
    for out, ref in zip(outs, refs):
        assert isinstance(out, np.ndarray)
        ref = np.asarray(ref, dtype=np.float64)
        assert out.shape == ref.shape
        worst = max(worst, float(np.linalg.norm(out - ref) / np.linalg.norm(ref)))
    return worst


def check_tuned(model, sample, others: dict[str, object]):
    """optimize() on `sample`; then the checks every zoo model must pass. Returns the result."""
    opt = infertune.optimize(model, sample, verbose=False)
    report = opt.report
    rejected = {
        c.name: c.reason
        for c in report.candidates
        if c.precision == "fp32" and c.status == "mismatch"
    }
    assert not rejected, f"exact candidates rejected as mismatch: {rejected}"
    assert report.selected == opt.backend
    assert report.candidate(opt.backend).status == "selected"
    assert opt.backend in str(report)
    for label, x in others.items():
        assert relative_error(opt(x), model(x)) <= RTOL, label
    return opt


def assert_ran(opt, name: str) -> None:
    """The candidate `name` passed verification (whether chosen or not)."""
    candidate = opt.report.candidate(name)
    assert candidate.status in ("ok", "selected"), f"{name} {candidate.status}: {candidate.reason}"


# -- models, tiny versions of the zoo's ------------------------------------------------------
def text_conv1d():
    """Token ids of any length -> Embedding -> Conv1D -> max over time -> logits."""
    import keras
    from keras import layers

    keras.utils.set_random_seed(0)
    tokens = keras.Input((None,), dtype="int32")
    x = layers.Conv1D(16, 3, padding="same", activation="relu")(layers.Embedding(50, 8)(tokens))
    return keras.Model(tokens, layers.Dense(3)(layers.GlobalMaxPooling1D()(x)))


def gru_varlen():
    import keras
    from keras import layers

    keras.utils.set_random_seed(0)
    sequence = keras.Input((None, 8))
    return keras.Model(sequence, layers.Dense(3)(layers.GRU(16)(sequence)))


def transformer_varlen(vocab: int = 50, dim: int = 16):
    """One encoder block over {token_ids, padding_mask} of any length, masked mean pooling."""
    import keras
    from keras import layers, ops

    keras.utils.set_random_seed(0)
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    mask = keras.Input((None,), dtype="int32", name="padding_mask")
    x = layers.Embedding(vocab, dim)(ids)
    attended = layers.MultiHeadAttention(2, dim // 2)(
        x, x, attention_mask=ops.cast(mask, "bool")[:, None, :]
    )
    x = layers.LayerNormalization()(x + attended)
    x = layers.LayerNormalization()(x + layers.Dense(dim)(layers.Dense(2 * dim, "gelu")(x)))
    weights = ops.cast(mask, "float32")[:, :, None]
    pooled = ops.sum(x * weights, axis=1) / ops.maximum(ops.sum(weights, axis=1), 1.0)
    return keras.Model({"token_ids": ids, "padding_mask": mask}, layers.Dense(3)(pooled))


def padded_tokens(rng, batch: int, length: int, vocab: int = 50) -> dict[str, np.ndarray]:
    """Each sequence 1..length tokens long; token id 0 and mask 0 past its end."""
    valid = rng.integers(1, length + 1, batch)
    valid[0] = length  # one full row: the sample's range of ids and mask values is complete
    mask = (np.arange(length)[None, :] < valid[:, None]).astype(np.int32)
    ids = rng.integers(1, vocab, (batch, length)).astype(np.int32) * mask
    return {"token_ids": ids, "padding_mask": mask}


def cnn_free_size():
    import keras
    from keras import layers

    keras.utils.set_random_seed(0)
    images = keras.Input((None, None, 3))
    x = layers.Rescaling(1 / 255)(images)
    x = layers.Conv2D(8, 3, strides=2, padding="same", use_bias=False)(x)
    x = layers.ReLU()(layers.BatchNormalization()(x))
    x = layers.Conv2D(16, 3, padding="same", activation="relu")(x)
    return keras.Model(images, layers.Dense(4)(layers.GlobalAveragePooling2D()(x)))


def normalized_cnn():
    """The preprocessing stem of keras.applications' EfficientNet and ConvNeXt (Rescaling,
    then a Normalization layer with ImageNet's mean and variance) before a small CNN."""
    import keras
    from keras import layers

    keras.utils.set_random_seed(0)
    images = keras.Input((None, None, 3))
    x = layers.Rescaling(1 / 255)(images)
    x = layers.Normalization(mean=[0.485, 0.456, 0.406], variance=[0.052, 0.050, 0.051])(x)
    x = layers.Conv2D(8, 3, strides=2, padding="same", activation="swish")(x)
    return keras.Model(images, layers.Dense(4)(layers.GlobalAveragePooling2D()(x)))


def images(rng, batch: int, height: int, width: int) -> np.ndarray:
    """Image-like values in 0..255, as keras.applications models expect them."""
    return rng.uniform(0, 255, (batch, height, width, 3)).astype(np.float32)


# -- tests -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_text_model_over_a_variable_length(rng):
    sample = rng.integers(0, 50, (2, 12)).astype(np.int32)
    others = {
        "batch 3": rng.integers(0, 50, (3, 12)).astype(np.int32),
        "length 5": rng.integers(0, 50, (2, 5)).astype(np.int32),
        "length 31": rng.integers(0, 50, (2, 31)).astype(np.int32),
    }
    check_tuned(text_conv1d(), sample, others)


@pytest.mark.slow
def test_gru_over_a_variable_length(rng):
    def sequences(batch, length):
        return rng.standard_normal((batch, length, 8)).astype(np.float32)

    opt = check_tuned(
        gru_varlen(),
        sequences(2, 6),
        {"batch 3": sequences(3, 6), "length 2": sequences(2, 2), "length 15": sequences(2, 15)},
    )
    # ONNX Runtime runs a GRU at any length (FIELD_NOTES: LiteRT needs TF select ops for it).
    assert_ran(opt, "onnxruntime-cpu")


@pytest.mark.slow
def test_transformer_with_dict_inputs_over_a_variable_length(rng):
    opt = check_tuned(
        transformer_varlen(),
        padded_tokens(rng, 2, 8),
        {
            "batch 3": padded_tokens(rng, 3, 8),
            "length 5": padded_tokens(rng, 2, 5),
            "length 13": padded_tokens(rng, 2, 13),
        },
    )
    assert_ran(opt, "onnxruntime-cpu")


@pytest.mark.slow
def test_cnn_with_free_height_and_width(rng):
    opt = check_tuned(
        cnn_free_size(),
        images(rng, 2, 16, 16),
        {
            "batch 3": images(rng, 3, 16, 16),
            "12x20": images(rng, 2, 12, 20),
            "24x24": images(rng, 2, 24, 24),
        },
    )
    assert_ran(opt, "onnxruntime-cpu")


@pytest.mark.slow
def test_cnn_with_efficientnet_preprocessing_layers(rng):
    opt = check_tuned(
        normalized_cnn(),
        images(rng, 2, 16, 16),
        {"batch 3": images(rng, 3, 16, 16), "12x20": images(rng, 2, 12, 20)},
    )
    # The Normalization layer's constants belong in the ONNX graph, not among its inputs.
    assert_ran(opt, "onnxruntime-cpu")


@pytest.mark.slow
def test_keras_applications_mobilenet():
    """The cheapest keras.applications model to prepare (MobileNet, alpha 0.25, 32x32: about
    90 layers, 20 s here); every exact CPU runtime runs it."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.applications.MobileNet(
        weights=None, input_shape=(32, 32, 3), alpha=0.25, classifier_activation=None
    )
    rng = np.random.default_rng(0)
    # mobilenet.preprocess_input: the model expects values in -1..1, as a user's pipeline gives.
    sample = images(rng, 1, 32, 32) / 127.5 - 1
    opt = check_tuned(model, sample, {"batch 4": images(rng, 4, 32, 32) / 127.5 - 1})
    broken = {
        c.name: f"{c.status}: {c.reason}"
        for c in opt.report.candidates
        if c.precision == "fp32" and c.status in ("failed", "timeout")
    }
    assert not broken
