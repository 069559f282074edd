"""Tiny versions of the production models (benchmarks/production.py): a recommender of four
dict inputs (int64 ids among them) and two named heads, a tabular model with adapted
preprocessing layers. What a service relies on: opt(x) returns the model's own output form
(a dict of named heads stays one), each head matches model(x), and the call path's fast
check of a dict of arrays accepts what the model takes (casting ids as Keras would) and
refuses the rest with a message naming the input.

String inputs, lookup layers and CategoryEncoding are another part of the work:
their tiny versions come with it.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import infertune
from infertune.model.inputs import build_signature

# optimize()'s default rtol: every candidate was verified under it (relative norm).
RTOL = 1e-3
ORT = ["onnxruntime-cpu"]  # the call path this file is about: ONNX Runtime's session
FEATURES = 13


def recommender(users: int = 50, items: int = 40, categories: int = 6):
    """Three int64 ids through Embeddings and 13 float features; heads `click`, `rating`."""
    import keras
    from keras import layers

    keras.utils.set_random_seed(0)
    counts = {"user_id": users, "item_id": items, "category_id": categories}
    ids = {name: keras.Input((1,), dtype="int64", name=name) for name in counts}
    features = keras.Input((FEATURES,), dtype="float32", name="features")
    parts = [layers.Flatten()(layers.Embedding(counts[n], 4)(t)) for n, t in ids.items()]
    x = layers.Concatenate()([*parts, layers.Dense(8, activation="relu")(features)])
    x = layers.Dense(8, activation="relu")(x)
    heads = {
        "click": layers.Dense(1, activation="sigmoid", name="click")(x),
        "rating": layers.Dense(2, name="rating")(x),
    }
    return keras.Model({**ids, "features": features}, heads)


def recommender_inputs(rng, batch: int) -> dict[str, np.ndarray]:
    return {
        "user_id": rng.integers(0, 50, (batch, 1)).astype(np.int64),
        "item_id": rng.integers(0, 40, (batch, 1)).astype(np.int64),
        "category_id": rng.integers(0, 6, (batch, 1)).astype(np.int64),
        "features": rng.standard_normal((batch, FEATURES)).astype(np.float32),
    }


def tabular():
    """A dict of three inputs: numeric features through an adapted Normalization, an amount
    through an adapted Discretization, int64 codes through an Embedding; an MLP."""
    import keras
    from keras import layers

    keras.utils.set_random_seed(0)
    data = tabular_inputs(np.random.default_rng(5), 64)
    normalize = layers.Normalization()
    normalize.adapt(data["numeric"])
    buckets = layers.Discretization(num_bins=4, epsilon=0.01)
    buckets.adapt(data["amount"])
    numeric = keras.Input((5,), dtype="float32", name="numeric")
    amount = keras.Input((1,), dtype="float32", name="amount")
    code = keras.Input((1,), dtype="int64", name="code")
    x = layers.Concatenate()(
        [
            normalize(numeric),
            layers.Flatten()(layers.Embedding(4, 3)(buckets(amount))),
            layers.Flatten()(layers.Embedding(30, 3)(code)),
        ]
    )
    x = layers.Dense(8, activation="relu")(x)
    return keras.Model({"numeric": numeric, "amount": amount, "code": code}, layers.Dense(1)(x))


def tabular_inputs(rng, batch: int) -> dict[str, np.ndarray]:
    return {
        "numeric": rng.normal(50.0, 20.0, (batch, 5)).astype(np.float32),
        "amount": rng.lognormal(3.0, 1.0, (batch, 1)).astype(np.float32),
        "code": rng.integers(0, 30, (batch, 1)).astype(np.int64),
    }


def relative_error(out: np.ndarray, ref) -> float:
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


@pytest.fixture(scope="module")
def recommender_opt():
    model = recommender()
    sample = recommender_inputs(np.random.default_rng(0), 2)
    return model, infertune.optimize(model, sample, backends=ORT, verbose=False)


# -- the recommender -------------------------------------------------------------------------
@pytest.mark.slow
def test_recommender_keeps_its_named_heads_and_matches_the_model(recommender_opt, rng):
    model, opt = recommender_opt
    assert opt.backend == "onnxruntime-cpu"
    for batch in (1, 2, 7):
        x = recommender_inputs(rng, batch)
        got, want = opt(x), model(x)
        assert isinstance(got, dict) and sorted(got) == ["click", "rating"]
        for name in ("click", "rating"):
            assert isinstance(got[name], np.ndarray)
            assert got[name].shape == tuple(want[name].shape)
            assert relative_error(got[name], want[name]) <= RTOL, (batch, name)


def test_recommender_takes_tensors_and_ids_of_another_integer_width(recommender_opt, rng):
    """tf.Tensors go through the full check; int32 ids are cast to the model's int64 on the
    fast path, as Keras casts them; both give the same heads as int64 numpy ids."""
    _, opt = recommender_opt
    x = recommender_inputs(rng, 3)
    want = opt(x)
    as_tensors = {key: tf.constant(value) for key, value in x.items()}
    narrow = {**x, **{key: x[key].astype(np.int32) for key in ("user_id", "item_id")}}
    for label, variant in (("tensors", as_tensors), ("int32 ids", narrow)):
        got = opt(variant)
        for name in ("click", "rating"):
            np.testing.assert_array_equal(got[name], want[name], err_msg=label)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda x: {**x, "user_id": x["user_id"].astype(np.float32)},
            r"Input 'user_id' has dtype float32; expected int64",
        ),
        (
            lambda x: {**x, "features": x["features"][:, :12]},
            r"Input 'features' has shape \(3, 12\); dimension 1 must be 13",
        ),
        (
            lambda x: {**x, "item_id": x["item_id"][:, 0]},
            r"Input 'item_id' has rank 1 \(shape \(3,\)\); expected rank 2",
        ),
        (lambda x: {**x, "category_id": x["category_id"][:2]}, "same batch size"),
        (
            lambda x: {k: v for k, v in x.items() if k != "item_id"},
            r"structure does not match.*expected a dict with keys \['category_id', 'features', "
            r"'item_id', 'user_id'\]",
        ),
        (lambda x: {**x, "extra": x["user_id"]}, "structure does not match"),
        (lambda x: list(x.values()), r"takes a dict of 4 inputs. Received a list"),
    ],
)
def test_a_dict_call_is_checked_on_the_fast_path_too(recommender_opt, rng, change, message):
    """Each wrong input fails with the message naming what is wrong, as before the fast
    check learned to cast."""
    _, opt = recommender_opt
    x = change(recommender_inputs(rng, 3))
    with pytest.raises(infertune.InputError, match=message):
        opt(x)


def test_the_fast_check_passes_right_arrays_on_and_casts_what_keras_would(rng):
    """A flat dict of arrays of the model's dtypes is handed on as the caller's own arrays
    (no copy); int32 ids or float64 features are cast, once, to the model's dtypes; an
    unsigned or boolean id, or float ids, take the full check's decision."""
    signature, _ = build_signature(recommender_inputs(rng, 2), None, np.float32)
    x = recommender_inputs(rng, 3)
    keys = sorted(x)
    flat = signature.flatten(x)
    assert all(array is x[key] for array, key in zip(flat, keys))
    wide = {**x, "user_id": x["user_id"].astype(np.int32), "features": x["features"] * 1.0}
    wide["features"] = wide["features"].astype(np.float64)
    cast = dict(zip(keys, signature.flatten(wide)))
    assert cast["user_id"].dtype == np.int64 and cast["features"].dtype == np.float32
    np.testing.assert_array_equal(cast["user_id"], x["user_id"])
    assert cast["item_id"] is x["item_id"]
    unsigned = dict(zip(keys, signature.flatten({**x, "item_id": x["item_id"].astype(np.uint8)})))
    assert unsigned["item_id"].dtype == np.int64
    with pytest.raises(infertune.InputError, match="'category_id' has dtype bool"):
        signature.flatten({**x, "category_id": x["category_id"] > 2})
    with pytest.raises(infertune.InputError, match="'item_id' has dtype float64"):
        signature.flatten({**x, "item_id": x["item_id"].astype(np.float64)})


# -- the tabular model -----------------------------------------------------------------------
def test_tabular_model_with_adapted_preprocessing_matches_the_model(rng):
    model = tabular()
    opt = infertune.optimize(
        model, tabular_inputs(rng, 2), backends=["tf-function", *ORT], verbose=False
    )
    assert opt.report.candidate("tf-function").status in ("ok", "selected")
    for batch in (1, 9):
        x = tabular_inputs(rng, batch)
        assert relative_error(opt(x), model(x)) <= RTOL, batch


# -- the benchmark ---------------------------------------------------------------------------
def test_the_production_benchmark_has_its_options_and_models():
    """benchmarks/production.py runs for minutes, so the suite runs only its --help: the
    options the docs give exist, and its models are those docs/benchmarks.md lists."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "benchmarks/production.py", "--help"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**os.environ, "COLUMNS": "1000"},  # argparse would wrap names at their hyphens
    )
    for option in ("--quick", "--models", "--out", "--budget", "--model-timeout"):
        assert option in done.stdout, option
    models = re.search(r"default all: \[([^\]]*)\]", done.stdout)
    names = re.findall(r"'([\w-]+)'", models.group(1))
    assert names == [
        "text-classifier", "tabular", "recommender", "audio", "two-tower", "image", "fnet"
    ]  # fmt: skip
    docs = (root / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    section = docs.split("## Production models", 1)[1].split("\n## ", 1)[0]
    assert [n for n in names if f"| {n} |" not in section] == []


# -- a dict of inputs on LiteRT: the interpreter checks the tuned shapes itself -----------------
def two_tower(users: int = 30, items: int = 40):
    """A query tower (user id, the last 5 item ids) and an item tower (item id, 3 float
    features), their normalized dot product."""
    import keras
    from keras import layers

    keras.utils.set_random_seed(0)
    user = keras.Input((1,), dtype="int64", name="user_id")
    history = keras.Input((5,), dtype="int64", name="history")
    item = keras.Input((1,), dtype="int64", name="item_id")
    features = keras.Input((3,), dtype="float32", name="item_features")
    items_table = layers.Embedding(items, 4)
    query = layers.Concatenate()(
        [
            layers.Flatten()(layers.Embedding(users, 4)(user)),
            layers.GlobalAveragePooling1D()(items_table(history)),
        ]
    )
    candidate = layers.Concatenate()([layers.Flatten()(items_table(item)), features])
    score = layers.Dot(axes=1, normalize=True)([layers.Dense(4)(query), layers.Dense(4)(candidate)])
    inputs = {"user_id": user, "history": history, "item_id": item, "item_features": features}
    return keras.Model(inputs, score)


def two_tower_inputs(rng, batch: int) -> dict[str, np.ndarray]:
    return {
        "user_id": rng.integers(0, 30, (batch, 1)).astype(np.int64),
        "history": rng.integers(0, 40, (batch, 5)).astype(np.int64),
        "item_id": rng.integers(0, 40, (batch, 1)).astype(np.int64),
        "item_features": rng.standard_normal((batch, 3)).astype(np.float32),
    }


@pytest.fixture(scope="module")
def two_tower_opt():
    pytest.importorskip("ai_edge_litert")
    model = two_tower()
    sample = two_tower_inputs(np.random.default_rng(0), 1)
    opt = infertune.optimize(model, sample, backends=["litert:threads=1"], verbose=False)
    return model, opt


def test_a_dict_on_litert_runs_at_the_tuned_shapes_and_any_other(two_tower_opt, rng):
    """At the sample's shapes the dict goes straight to an interpreter allocated at them
    (its SetTensor checks each array); at another batch size, or with int32 ids, through
    the signature's check (which casts) and run(): the same scores either way."""
    model, opt = two_tower_opt
    assert opt.backend == "litert:threads=1"
    for batch in (1, 1, 4):
        x = two_tower_inputs(rng, batch)
        got = opt(x)
        assert isinstance(got, np.ndarray) and got.shape == (batch, 1)
        assert relative_error(got, model(x)) <= RTOL, batch
    x = two_tower_inputs(rng, 1)
    narrow = {**x, "history": x["history"].astype(np.int32)}
    np.testing.assert_array_equal(opt(narrow), opt(x))
    as_tensors = {key: tf.constant(value) for key, value in x.items()}
    np.testing.assert_array_equal(opt(as_tensors), opt(x))


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda x: {**x, "history": x["history"][:, :4]},
            r"Input 'history' has shape \(1, 4\); dimension 1 must be 5",
        ),
        (
            lambda x: {**x, "item_features": x["item_features"] > 0},
            r"Input 'item_features' has dtype bool; expected float32",
        ),
        (
            lambda x: {**x, "user_id": x["user_id"].astype(np.float32)},
            r"Input 'user_id' has dtype float32; expected int64",
        ),
        (
            lambda x: {**x, "item_id": x["item_id"][0]},
            r"Input 'item_id' has rank 1 \(shape \(1,\)\); expected rank 2",
        ),
        (lambda x: {**x, "user_id": np.zeros((2, 1), np.int64)}, "same batch size"),
        (lambda x: {**x, "extra": x["user_id"]}, "structure does not match"),
        (lambda x: {k: v for k, v in x.items() if k != "history"}, "structure does not match"),
    ],
)
def test_a_dict_on_litert_is_refused_with_the_signatures_message(two_tower_opt, change, message):
    """Inputs the interpreter refuses (or the direct path does not take) at the sample's
    shapes get the signature's own message, as on any other path; the next right call runs."""
    _, opt = two_tower_opt
    x = two_tower_inputs(np.random.default_rng(3), 1)
    with pytest.raises(infertune.InputError, match=message):
        opt(change(x))
    assert opt(x).shape == (1, 1)


def test_a_dict_on_the_free_batch_litert_model_is_resized_back_to_the_tuned_shapes(rng):
    """Where the model converted at the sample's shapes is the free-batch one (nothing to
    fold), the dict goes to the free-batch interpreters: a call at another batch size
    resizes them, the next call at the sample's shapes resizes them back, and a wrong
    dimension still gets the signature's message."""
    pytest.importorskip("ai_edge_litert")
    import keras
    from keras import layers

    keras.utils.set_random_seed(0)
    a = keras.Input((4,), name="a")
    b = keras.Input((3,), name="b")
    x = layers.Concatenate()([layers.Dense(5)(a), layers.Dense(5)(b)])
    model = keras.Model({"a": a, "b": b}, layers.Dense(2)(x))

    def draw(batch):
        return {
            "a": rng.standard_normal((batch, 4)).astype(np.float32),
            "b": rng.standard_normal((batch, 3)).astype(np.float32),
        }

    opt = infertune.optimize(model, draw(2), backends=["litert:threads=1"], verbose=False)
    # The path under test: no interpreter of a model converted at the sample's shapes.
    assert opt.backends[0]._fixed_run is None
    for batch in (2, 5, 2, 1, 2):
        x = draw(batch)
        assert relative_error(opt(x), model(x)) <= RTOL, batch
    with pytest.raises(infertune.InputError, match=r"Input 'b' has shape \(2, 4\)"):
        opt({**draw(2), "b": np.zeros((2, 4), np.float32)})
