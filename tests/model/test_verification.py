"""A candidate whose outputs differ from the model's is rejected, whatever the output scale."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from helpers import dense_model

import infertune
from infertune.backends import Backend
from infertune.model.source import tensor_specs
from infertune.model.tolerance import (
    compare_outputs,
    row_scale,
)


class PerturbedTfFunction(Backend):
    """A real tf.function of the model whose outputs are scaled by (1 + error): a wrong backend."""

    name = "perturbed"

    def __init__(self, error: float):
        self.error = error

    def prepare(self, target):
        self._fn = tf.function(
            target.source.graph_function(target.signature),
            input_signature=tensor_specs(target.signature),
        )

    def run(self, inputs):
        return [t.numpy() * np.float32(1 + self.error) for t in self._fn(*inputs)]


def test_perturbed_candidate_is_rejected_with_its_error():
    sample = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    opt = infertune.optimize(
        dense_model(), sample, backends=[PerturbedTfFunction(0.01)], verbose=False
    )
    bad = opt.report.candidate("perturbed")
    assert bad.status == "mismatch"
    assert bad.max_rel_err == pytest.approx(0.01, rel=1e-3)  # the error it was given
    assert "rtol=0.001" in bad.reason
    assert opt.backend != "perturbed"


def test_small_error_within_tolerance_is_accepted():
    sample = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    # 1e-5 relative is a float32-sized error, well inside rtol=1e-3.
    opt = infertune.optimize(
        dense_model(), sample, backends=[PerturbedTfFunction(1e-5)], verbose=False
    )
    assert opt.report.candidate("perturbed").status in ("ok", "selected")


def test_tiny_outputs_do_not_let_a_wrong_candidate_through_atol():
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4)])
    model.layers[0].kernel.assign(model.layers[0].kernel * 1e-12)  # outputs around 1e-12
    sample = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    assert np.abs(model(sample)).max() < 1e-10
    opt = infertune.optimize(model, sample, backends=[PerturbedTfFunction(0.5)], verbose=False)
    # Every element is within atol=1e-5 of the model; the relative error is 50%.
    assert opt.report.candidate("perturbed").status == "mismatch"
    assert "relative error" in opt.report.candidate("perturbed").reason


def test_compare_rules():
    ref = np.array([1.0, 2.0, 3.0], "float32")
    assert compare_outputs([ref + 1e-6], [ref], rtol=1e-3, atol=1e-5)
    assert not compare_outputs([ref * 1.01], [ref], rtol=1e-3, atol=1e-5)
    assert not compare_outputs([ref[:2]], [ref], rtol=1e-3, atol=1e-5)  # shape
    assert not compare_outputs([ref.astype("float64")], [ref], rtol=1e-3, atol=1e-5)  # dtype
    assert not compare_outputs([ref, ref], [ref], rtol=1e-3, atol=1e-5)  # structure
    with_nan = ref.copy()
    with_nan[1] = np.nan
    found = compare_outputs([with_nan], [ref], rtol=1e-3, atol=1e-5)
    assert not found and "NaN/Inf" in found.reason
    assert compare_outputs(
        [with_nan], [with_nan], rtol=1e-3, atol=1e-5
    )  # NaN where the model has it
    ints = np.array([1, 2, 3])
    assert not compare_outputs([ints + np.array([0, 1, 0])], [ints], rtol=1e-3, atol=1e-5)
    zeros = np.zeros(3, "float32")
    assert compare_outputs(
        [zeros + 1e-7], [zeros], rtol=1e-3, atol=1e-5
    )  # zero reference: atol rules


def deep_residual_cnn(seed: int = 0):
    """Nine convolutions with batch norm and residual adds, Dense(1000) on top, no softmax:
    on image-like inputs (0..255) its outputs are of scale ~200, so float32 round-off is
    ~1e-4 absolute and an element that sits near zero fails a rule that compares each
    element with its own magnitude (as NASNetMobile's and ResNet50's did)."""
    import keras

    keras.utils.set_random_seed(seed)
    x = inp = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    for _ in range(8):
        y = keras.layers.Conv2D(32, 3, padding="same")(x)
        y = keras.layers.BatchNormalization()(y)
        x = keras.layers.Add()([x, keras.layers.Activation("relu")(y)])
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inp, keras.layers.Dense(1000)(x))


@pytest.fixture(scope="module")
def deep_outputs():
    """The deep model's real outputs on an image-like batch, and its feature map."""
    model = deep_residual_cnn()
    x = np.random.default_rng(0).uniform(0, 255, (4, 32, 32, 3)).astype("float32")
    features = keras_feature_map(model, x)
    return model(x).numpy(), features


def keras_feature_map(model, x):
    import keras

    return keras.Model(model.input, model.layers[-3].output)(x).numpy()


@pytest.mark.slow
def test_exact_runtimes_on_a_deep_network_are_accepted():
    import infertune.backends.registry as registry

    # Every exact runtime that can run here, verified on the image-like sample, two fresh
    # random inputs in its range and one at another batch size: on each of these the old
    # element-wise rule rejected at least one runtime over a single element near zero.
    wanted = ["tf-xla", "onnxruntime-cpu", "openvino-cpu", "litert"]
    present = [name for name in wanted if registry.BACKENDS[name]().available() is None]
    assert "onnxruntime-cpu" in present and "tf-xla" in present  # required dependencies
    x = np.random.default_rng(1).uniform(0, 255, (8, 32, 32, 3)).astype("float32")
    opt = infertune.optimize(deep_residual_cnn(), x, backends=present, verbose=False)
    for name in present:
        found = opt.report.candidate(name)
        assert found.status in ("ok", "selected"), (name, found.reason)
        # Exact runtimes differ by float32 round-off only: ~5e-7 of the output's norm.
        assert found.max_rel_err < 1e-5, (name, found.max_rel_err)
    assert "RMS of |ref|" in str(opt.report)  # the report says which scale was used


def test_one_element_off_by_one_percent_of_the_row_is_rejected(deep_outputs):
    ref, _ = deep_outputs
    for pick in (np.argmin(np.abs(ref[0])), np.argmax(np.abs(ref[0]))):
        out = ref.copy()
        out[0, pick] += 0.01 * np.abs(ref[0]).max()  # 1% of the row's largest value
        found = compare_outputs([out], [ref], rtol=1e-3, atol=1e-5)
        assert not found and "1 of 4000 values" in found.reason


def test_one_percent_relative_noise_is_rejected(deep_outputs):
    ref, _ = deep_outputs
    noise = np.random.default_rng(0).standard_normal(ref.shape).astype("float32")
    out = ref * (1 + 0.01 * noise)  # 1% relative noise, 10x rtol
    assert not compare_outputs([out], [ref], rtol=1e-3, atol=1e-5)


def test_swapped_channels_are_rejected(deep_outputs):
    _, features = deep_outputs
    swapped = features[..., ::-1].copy()  # NHWC read as if it were the other channel order
    found = compare_outputs([swapped], [features], rtol=1e-3, atol=1e-5)
    assert not found


def test_bfloat16_rounding_is_rejected_under_a_tight_rtol(deep_outputs):
    ref, features = deep_outputs
    for array in (ref, features):
        # bfloat16 keeps 8 bits of mantissa: relative error up to 2**-8 = 4e-3, about 1e-3
        # on average; rtol=1e-4 is float32 round-off's order times 100, far below it.
        bits = array.astype("float32").view(np.uint32)
        rounded = ((bits + 0x8000) & 0xFFFF0000).view(np.float32)
        assert not compare_outputs([rounded], [array], rtol=1e-4, atol=1e-5)
        assert compare_outputs([rounded], [array], rtol=1e-2, atol=1e-5)  # within 1%


def test_garbage_of_the_same_tiny_scale_is_rejected():
    rng = np.random.default_rng(0)
    ref = (rng.standard_normal((4, 10)) * 1e-12).astype("float32")
    garbage = (rng.standard_normal((4, 10)) * 1e-12).astype("float32")
    # Every element is within atol=1e-5: only the relative norm sees the garbage.
    found = compare_outputs([garbage], [ref], rtol=1e-3, atol=1e-5)
    assert not found and "relative error" in found.reason


def test_row_scale_is_per_example_and_whole_output_for_single_values():
    rows = np.array([[3.0, 4.0], [0.0, 0.0]])
    assert row_scale(rows).ravel().tolist() == pytest.approx([np.sqrt(12.5), 0.0])
    single = np.array([[1.0], [7.0]])  # (batch, 1): the whole output's RMS
    assert float(row_scale(single)) == pytest.approx(5.0)
    # An example whose outputs are small is judged on its own scale, not its neighbour's.
    ref = np.array([[100.0, -100.0], [1e-3, -1e-3]], "float32")
    out = ref.copy()
    out[1] *= 2  # the small example is 100% off; it is 1e-3 against the large one
    assert not compare_outputs([out], [ref], rtol=1e-2, atol=1e-6)
