"""Tiny models with their preprocessing inside, as production services ship them (Keras'
own guidance: export the model with its preprocessing layers): a text classifier on a string
input and a tabular model on a dict of float and int64 inputs. Built in milliseconds."""

from __future__ import annotations

import numpy as np

SENTENCES = [
    "the cat sat on the mat",
    "a dog ate my homework",
    "the quick brown fox jumps",
    "hello world again and again",
    "my cat and the dog",
    "a brown mat on the floor",
]


def text_sample(batch: int = 4) -> np.ndarray:
    """A (batch, 1) numpy str array of the sentences above."""
    return np.array([[SENTENCES[i % len(SENTENCES)]] for i in range(batch)])


def text_classifier():
    """TextVectorization (adapted on SENTENCES) -> Embedding -> GlobalAveragePooling1D ->
    Dense, on a (batch, 1) string input named "text"."""
    import keras

    keras.utils.set_random_seed(0)
    vectorize = keras.layers.TextVectorization(
        max_tokens=64, output_sequence_length=8, name="vectorize"
    )
    vectorize.adapt(np.array(SENTENCES))
    text = keras.Input(shape=(1,), dtype="string", name="text")
    hidden = keras.layers.Embedding(64, 8)(vectorize(text))
    hidden = keras.layers.GlobalAveragePooling1D()(hidden)
    return keras.Model(text, keras.layers.Dense(3)(hidden), name="text_classifier")


def tabular_sample(batch: int = 8) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {
        "amount": rng.normal(50.0, 20.0, size=(batch, 3)).astype(np.float32),
        "category": rng.integers(1, 6, size=(batch, 1)).astype(np.int64),
        "age": rng.uniform(18.0, 80.0, size=(batch, 1)).astype(np.float32),
    }


def tabular_model():
    """A dict of three inputs: "amount" (float32, 3) through an adapted Normalization,
    "category" (int64, 1) through an adapted IntegerLookup (one-hot), "age" (float32, 1)
    through an adapted Discretization (one-hot); concatenated, then two Dense layers."""
    import keras

    keras.utils.set_random_seed(0)
    data = tabular_sample(64)
    normalize = keras.layers.Normalization(name="normalize")
    normalize.adapt(data["amount"])
    lookup = keras.layers.IntegerLookup(output_mode="one_hot", name="lookup")
    lookup.adapt(data["category"])
    buckets = keras.layers.Discretization(num_bins=4, output_mode="one_hot", name="buckets")
    buckets.adapt(data["age"])
    inputs = {
        "amount": keras.Input(shape=(3,), dtype="float32", name="amount"),
        "category": keras.Input(shape=(1,), dtype="int64", name="category"),
        "age": keras.Input(shape=(1,), dtype="float32", name="age"),
    }
    features = keras.layers.Concatenate()(
        [normalize(inputs["amount"]), lookup(inputs["category"]), buckets(inputs["age"])]
    )
    hidden = keras.layers.Dense(16, activation="relu")(features)
    return keras.Model(inputs, keras.layers.Dense(1)(hidden), name="tabular")
