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
