"""Built-in demo models: the classic "why is my TensorFlow slow?" cases, random weights.

Used by `infertune demo`, the benchmarks and the tests, so that all of them run on a fresh
machine with nothing to download.
"""

from __future__ import annotations

import numpy as np

from .system.quiet import import_tensorflow

__all__ = [
    "DEMO_MODELS",
    "demo_model",
    "matmul",
    "mlp",
    "mobilenet_v2",
    "small_cnn",
    "text_encoder",
    "text_request",
    "text_traffic",
    "transformer_block",
]


def small_cnn(seed: int = 0):
    """28x28x1 -> Conv2D 32 3x3 relu -> MaxPool 2 -> Flatten -> Dense 10 softmax."""
    import keras

    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Flatten(),
            keras.layers.Dense(10, activation="softmax"),
        ],
        name="small_cnn",
    )


def mlp(seed: int = 0):
    """10 -> Dense 50 relu -> Dense 1."""
    import keras

    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [keras.Input((10,)), keras.layers.Dense(50, activation="relu"), keras.layers.Dense(1)],
        name="mlp",
    )


def matmul(seed: int = 0):
    """One 1000x1000 matrix product (Dense without bias): compute-bound at batch 1000."""
    import keras

    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [keras.Input((1000,)), keras.layers.Dense(1000, use_bias=False)], name="matmul"
    )


def mobilenet_v2(seed: int = 0):
    """MobileNetV2 224x224, random weights (nothing to download), logits out.

    No final softmax: with random weights the logits are tiny (about 1e-13) and a softmax of
    them is uniform to float precision, which any output would match. The logits themselves
    are verified scale-aware, so a wrong candidate cannot hide.
    """
    import keras

    keras.utils.set_random_seed(seed)
    return keras.applications.MobileNetV2(
        weights=None, input_shape=(224, 224, 3), classifier_activation=None
    )


def transformer_block(seed: int = 0, seq: int = 128, dim: int = 128, heads: int = 4):
    """One encoder block: MultiHeadAttention, residual + LayerNorm, MLP 4x, residual + LayerNorm."""
    import keras

    keras.utils.set_random_seed(seed)
    x = keras.Input((seq, dim))
    attended = keras.layers.MultiHeadAttention(heads, dim // heads)(x, x)
    h = keras.layers.LayerNormalization()(x + attended)
    mlp_out = keras.layers.Dense(dim)(keras.layers.Dense(4 * dim, activation="gelu")(h))
    return keras.Model(x, keras.layers.LayerNormalization()(h + mlp_out), name="transformer_block")


# name -> (builder, sample shape): the sample's batch size is the first dimension.
DEMO_MODELS = {
    "small-cnn": (small_cnn, (1, 28, 28, 1)),
    "mlp": (mlp, (1000, 10)),
    "matmul": (matmul, (1000, 1000)),
    "mobilenet-v2": (mobilenet_v2, (1, 224, 224, 3)),
    "transformer": (transformer_block, (1, 128, 128)),
}


def demo_model(name: str, seed: int = 0, batch: int | None = None):
    """A demo model and a sample batch for it: (model, sample)."""
    if name not in DEMO_MODELS:
        raise ValueError(f"Unknown demo model {name!r}; choose one of {sorted(DEMO_MODELS)}.")
    build, shape = DEMO_MODELS[name]
    import_tensorflow()  # before Keras does: without its start-up lines (system/quiet.py)
    if batch is not None:
        shape = (batch, *shape[1:])
    sample = np.random.default_rng(seed).random(shape, dtype=np.float32)
    return build(seed), sample


# -- a model of many lengths, and traffic for it (optimize(traffic=...)) ---------------------
TEXT_VOCABULARY = 1000


def text_encoder(seed: int = 0, width: int = 32, blocks: int = 2):
    """A small text encoder of any length that takes its padding mask as an input and gives
    it to every attention layer and to the pooling, as keras-hub models do (so padding it is
    exact): inputs token_ids and padding_mask, (batch, length) int32 each; outputs the
    sequence (batch, length, width) and its masked mean (batch, width)."""
    import_tensorflow()
    import keras
    from keras import layers, ops

    keras.utils.set_random_seed(seed)
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    mask = keras.Input((None,), dtype="int32", name="padding_mask")
    x = layers.Embedding(TEXT_VOCABULARY, width)(ids)
    keys = ops.expand_dims(ops.cast(mask, "bool"), 1)  # (batch, 1, length): keys masked
    for _ in range(blocks):
        attended = layers.MultiHeadAttention(num_heads=2, key_dim=width // 2)(
            x, x, attention_mask=keys
        )
        x = layers.LayerNormalization()(layers.Add()([x, attended]))
        x = layers.LayerNormalization()(layers.Add()([x, layers.Dense(width)(x)]))
    weights = ops.expand_dims(ops.cast(mask, "float32"), -1)
    pooled = ops.sum(x * weights, axis=1) / ops.maximum(ops.sum(weights, axis=1), 1.0)
    return keras.Model(
        {"token_ids": ids, "padding_mask": mask},
        {"sequence": x, "pooled": pooled},
        name="text_encoder",
    )


def text_request(length: int, batch: int = 1, seed: int = 0) -> dict:
    """One request for `text_encoder`: `length` token ids (1..TEXT_VOCABULARY-1), every
    position real (a mask of ones)."""
    rng = np.random.default_rng(seed)
    return {
        "token_ids": rng.integers(1, TEXT_VOCABULARY, (batch, length)).astype("int32"),
        "padding_mask": np.ones((batch, length), "int32"),
    }


def text_traffic(count: int = 200, seed: int = 0, median: float = 12, longest: int = 48) -> list:
    """`count` requests for `text_encoder` whose lengths are drawn log-normal, as queries'
    are (most short, a few long), from 2 to `longest` tokens."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.round(rng.lognormal(np.log(median), 0.6, count)), 2, longest)
    return [text_request(int(n), seed=seed + i) for i, n in enumerate(lengths)]
