"""Built-in demo models: the classic "why is my TensorFlow slow?" cases, random weights.

Used by `infertune demo`, the benchmarks and the tests, so that all of them run on a fresh
machine with nothing to download.
"""

from __future__ import annotations

import numpy as np

__all__ = ["DEMO_MODELS", "demo_model", "small_cnn", "mlp"]


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


DEMO_MODELS = {
    "small-cnn": (small_cnn, (1, 28, 28, 1)),
    "mlp": (mlp, (1000, 10)),
}


def demo_model(name: str, seed: int = 0):
    """A demo model and a sample batch for it: (model, sample)."""
    if name not in DEMO_MODELS:
        raise ValueError(f"Unknown demo model {name!r}; choose one of {sorted(DEMO_MODELS)}.")
    build, shape = DEMO_MODELS[name]
    sample = np.random.default_rng(seed).random(shape, dtype=np.float32)
    return build(seed), sample
