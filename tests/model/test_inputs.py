"""Bad inputs fail early with a message naming the input and the expected signature."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import dense_model, dict_model, dict_sample

import infertune
from infertune.model.inputs import build_signature
from infertune.model.structure import (
    Structure,
    flatten,
)


@pytest.fixture(scope="module")
def dense_opt():
    model = dense_model()
    sample = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    return infertune.optimize(model, sample, backends=["onnxruntime-cpu"], verbose=False)


@pytest.fixture(scope="module")
def dict_opt():
    return infertune.optimize(
        dict_model(), dict_sample(np.random.default_rng(0)), backends=["tf-function"], verbose=False
    )


def test_wrong_rank_names_input_and_signature(dense_opt):
    with pytest.raises(ValueError, match=r"Input 'x' has rank 3.*x: shape \(None, 6\) float32"):
        dense_opt(np.zeros((2, 6, 1), "float32"))


def test_wrong_feature_shape(dense_opt):
    with pytest.raises(
        infertune.InputError, match=r"Input 'x' has shape \(2, 5\); dimension 1 must be 6"
    ):
        dense_opt(np.zeros((2, 5), "float32"))


def test_float_into_integer_input_is_refused(dict_opt):
    x = dict_sample(np.random.default_rng(1))
    x["tokens"] = x["tokens"].astype("float32")
    with pytest.raises(ValueError, match=r"Input 'tokens' has dtype float32; expected int32"):
        dict_opt(x)


def test_same_kind_casts_are_accepted(dense_opt):
    x64 = np.random.default_rng(2).standard_normal((3, 6))  # float64, as numpy makes it
    np.testing.assert_allclose(dense_opt(x64), dense_opt(x64.astype("float32")))


def test_missing_dict_key(dict_opt):
    x = dict_sample(np.random.default_rng(1))
    del x["tokens"]
    with pytest.raises(ValueError, match=r"structure does not match.*keys \['features'\].*tokens"):
        dict_opt(x)


def test_list_where_dict_expected(dict_opt):
    with pytest.raises(ValueError, match=r"takes a dict of 2 inputs. Received a list"):
        dict_opt([np.zeros((1, 4), "float32"), np.zeros((1, 5), "int32")])


def test_inconsistent_batch_sizes(dict_opt):
    x = dict_sample(np.random.default_rng(1), batch=3)
    x["features"] = x["features"][:2]
    with pytest.raises(ValueError, match="same batch size"):
        dict_opt(x)


def test_single_input_model_given_a_list(dense_opt):
    with pytest.raises(ValueError, match="takes a single array. Received a list"):
        dense_opt([np.zeros((1, 6), "float32")])


def test_sample_the_model_rejects():
    with pytest.raises(infertune.InputError, match=r"(?s)the sample|rank|shape"):
        infertune.optimize(dense_model(), np.zeros((2, 5), "float32"), verbose=False)


def test_sample_with_nan_is_refused():
    sample = np.zeros((2, 6), "float32")
    sample[1, 3] = np.nan
    with pytest.raises(infertune.InputError, match="NaN or Inf"):
        infertune.optimize(dense_model(), sample, verbose=False)


def test_empty_batch_is_refused():
    with pytest.raises(infertune.InputError, match="empty batch"):
        infertune.optimize(dense_model(), np.zeros((0, 6), "float32"), verbose=False)


def test_model_path_that_does_not_exist(tmp_path):
    with pytest.raises(infertune.ModelError, match="does not exist"):
        infertune.optimize(tmp_path / "missing.keras", np.zeros((1, 6), "float32"), verbose=False)


def test_unsupported_model_object():
    with pytest.raises(
        infertune.ModelError, match=r"must be a keras.Model.*Received: model=<lambda>|Received"
    ):
        infertune.optimize(lambda x: x, np.zeros((1, 6), "float32"), verbose=False)


def test_bad_options():
    model, x = dense_model(), np.zeros((1, 6), "float32")
    with pytest.raises(infertune.OptionError, match="objective"):
        infertune.optimize(model, x, objective="fastest", verbose=False)
    with pytest.raises(infertune.OptionError, match="Unknown backend 'tensorflow-lite'"):
        infertune.optimize(model, x, backends=["tensorflow-lite"], verbose=False)
    with pytest.raises(infertune.OptionError, match="rtol and atol"):
        infertune.optimize(model, x, rtol=-1, verbose=False)


def test_signature_keeps_declared_dims_and_frees_batch():
    sample = {"a": np.ones((2, 3), "float64"), "b": np.arange(8, dtype="int64").reshape(2, 4)}
    signature, arrays = build_signature(sample, None, np.dtype("float32"))
    assert [s.shape for s in signature.specs] == [(None, 3), (None, 4)]
    assert [a.dtype for a in arrays] == [np.dtype("float32"), np.dtype("int64")]
    assert signature.specs[1].low == 0 and signature.specs[1].high == 7
    assert signature.sample_batch == 2 and signature.batch_is_dynamic


def test_structure_round_trip():
    value = {"b": [1, (2, 3)], "a": 4}
    leaves, structure = flatten(value)
    assert leaves == [4, 1, 2, 3]
    assert structure.pack(leaves) == {"a": 4, "b": [1, (2, 3)]}
    assert Structure.from_dict(structure.to_dict()) == structure
    assert structure.leaf_names() == ["a", "b[0]", "b[1][0]", "b[1][1]"]


@pytest.fixture(scope="module")
def free_size_opt():
    """A CNN over images of any height and width (3 channels): the call path that checks the
    dtype, the rank and the channels inline (optimized._calling_free)."""
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((None, None, 3))
    hidden = keras.layers.Conv2D(4, 3, activation="relu")(inputs)
    model = keras.Model(inputs, keras.layers.GlobalAveragePooling2D()(hidden))
    sample = np.random.default_rng(0).random((2, 12, 12, 3), "float32")
    return model, infertune.optimize(model, sample, backends=["onnxruntime-cpu"], verbose=False)


@pytest.mark.parametrize("shape", [(2, 12, 12, 3), (1, 20, 9, 3), (5, 7, 7, 3)])
def test_a_free_size_input_runs_at_any_size(free_size_opt, shape):
    model, opt = free_size_opt
    x = np.random.default_rng(1).random(shape, "float32")
    # ONNX Runtime against TensorFlow: float32 round-off of a 3x3 convolution and a mean
    np.testing.assert_allclose(opt(x), model(x), rtol=1e-5, atol=1e-6)


def test_a_free_size_input_still_has_its_fixed_dimensions_and_dtype_checked(free_size_opt):
    _, opt = free_size_opt
    with pytest.raises(infertune.InputError, match=r"shape \(1, 8, 8, 4\); dimension 3 must be 3"):
        opt(np.zeros((1, 8, 8, 4), "float32"))
    with pytest.raises(infertune.InputError, match=r"has rank 3"):
        opt(np.zeros((8, 8, 3), "float32"))
    x64 = np.random.default_rng(2).random((1, 9, 9, 3))  # float64: cast, as for fixed sizes
    np.testing.assert_array_equal(opt(x64), opt(x64.astype("float32")))


def test_a_flat_dict_of_right_arrays_is_passed_on_as_it_is(rng):
    """The fast check of a flat dict hands the runtime the caller's own arrays (no copy, in
    the model's order); anything it does not take goes through the full check, which casts
    (int64 ids to the model's int32) or says what is wrong."""
    signature, _ = build_signature(dict_sample(rng), None, np.float32)
    x = dict_sample(rng, batch=3)
    flat = signature.flatten(x)
    assert [a is x[k] for a, k in zip(flat, ("features", "tokens"))] == [True, True]
    wide = {**x, "tokens": x["tokens"].astype(np.int64)}
    cast = signature.flatten(wide)
    assert cast[1].dtype == np.int32 and np.array_equal(cast[1], x["tokens"])
    with pytest.raises(infertune.InputError, match="same batch size"):
        signature.flatten({**x, "tokens": x["tokens"][:2]})
    with pytest.raises(infertune.InputError, match="structure"):
        signature.flatten({**x, "extra": x["tokens"]})
    with pytest.raises(infertune.InputError, match="dimension 1 must be 4"):
        signature.flatten({**x, "features": np.zeros((3, 5), np.float32)})
