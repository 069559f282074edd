"""Tiny models of many lengths for the traffic tests (optimize(traffic=...)): a text encoder
that takes its padding mask as an input and gives it to attention and pooling, as keras-hub
models do (padding is exact), and one whose Embedding(mask_zero=True) mask Keras 3 loses
between blocks (padding changes its outputs), with requests drawn like real traffic."""

from __future__ import annotations

VOCAB = 50  # the lossy encoder's
WIDTH = 16


def masked_encoder(seed: int = 0, blocks: int = 2):
    """The demo's text encoder (infertune.demo.text_encoder) at width WIDTH: token_ids and
    padding_mask of any length, the mask given to attention and pooling."""
    from infertune.demo import text_encoder

    return text_encoder(seed, WIDTH, blocks)


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
    """One request of `length` tokens, every position real."""
    from infertune.demo import text_request

    return text_request(length, batch, seed)


def traffic(count: int = 120, seed: int = 0) -> list[dict]:
    """Requests of the masked encoder at lengths drawn like queries."""
    from infertune.demo import text_traffic

    return text_traffic(count, seed)
