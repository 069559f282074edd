"""Tiny models of many lengths for the traffic tests (optimize(traffic=...)): a text encoder
that takes its padding mask as an input and gives it to attention and pooling, as keras-hub
models do (padding is exact), and one whose Embedding(mask_zero=True) mask Keras 3 loses
between blocks (padding changes its outputs), with requests drawn like real traffic."""

from __future__ import annotations

import numpy as np

VOCAB = 50
WIDTH = 16


def masked_encoder(seed: int = 0, blocks: int = 2):
    """token_ids and padding_mask, both (batch, length) of any length; outputs the sequence
    (batch, length, WIDTH) and the masked mean over it (batch, WIDTH)."""
    import keras
    from keras import layers, ops

    keras.utils.set_random_seed(seed)
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    mask = keras.Input((None,), dtype="int32", name="padding_mask")
    x = layers.Embedding(VOCAB, WIDTH)(ids)
    keys = ops.expand_dims(ops.cast(mask, "bool"), 1)  # (batch, 1, length): keys masked
    for _ in range(blocks):
        attended = layers.MultiHeadAttention(num_heads=2, key_dim=8)(x, x, attention_mask=keys)
        x = layers.LayerNormalization()(layers.Add()([x, attended]))
        x = layers.LayerNormalization()(layers.Add()([x, layers.Dense(WIDTH)(x)]))
    weights = ops.expand_dims(ops.cast(mask, "float32"), -1)
    pooled = ops.sum(x * weights, axis=1) / ops.maximum(ops.sum(weights, axis=1), 1.0)
    return keras.Model({"token_ids": ids, "padding_mask": mask}, {"sequence": x, "pooled": pooled})


def lossy_encoder(seed: int = 0):
    """token_ids only, Embedding(mask_zero=True), residuals written `x + a`: Keras 3 drops
    the mask after the first block, so padding with zeros reaches the attention and the
    pooling (the outputs change)."""
    import keras
    from keras import layers

    keras.utils.set_random_seed(seed)
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    x = layers.Embedding(VOCAB, WIDTH, mask_zero=True)(ids)
    for _ in range(2):
        x = x + layers.MultiHeadAttention(num_heads=2, key_dim=8)(x, x)
        x = layers.LayerNormalization()(x)
    pooled = layers.GlobalAveragePooling1D()(x)
    return keras.Model(ids, pooled)


def request(length: int, batch: int = 1, seed: int = 0) -> dict:
    """One request of `length` tokens (ids 1..VOCAB-1, every position real)."""
    rng = np.random.default_rng(seed)
    return {
        "token_ids": rng.integers(1, VOCAB, (batch, length)).astype("int32"),
        "padding_mask": np.ones((batch, length), "int32"),
    }


def lengths(count: int, seed: int = 0, median: float = 12, high: int = 48) -> np.ndarray:
    """Lengths drawn log-normal, like queries: most short, a few long, 2..high."""
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.lognormal(np.log(median), 0.6, count)), 2, high).astype(int)


def traffic(count: int = 120, seed: int = 0) -> list[dict]:
    """Requests of the masked encoder at lengths drawn like queries."""
    return [request(int(n), seed=seed + i) for i, n in enumerate(lengths(count, seed))]
