"""A model of a layer class Keras does not define, in a module a child process can import
(the TFLite worker process loads it: test_tuning_time.py)."""

from __future__ import annotations

import keras


class Doubling(keras.layers.Layer):
    """x * 2: a class of the user's own, not registered with Keras."""

    def call(self, x):
        return x * 2.0


def doubling_model() -> keras.Model:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    return keras.Model(inputs, keras.layers.Dense(3)(Doubling()(inputs)))
