"""Production models: the kinds of Keras models services run, written for this benchmark.

Random weights, CPU. Each model takes its inputs as a service receives them, with its
preprocessing inside, as Keras' guidance on exporting models says:

* `text-classifier`: a (batch, 1) string input through an adapted TextVectorization, an
  Embedding, average pooling and two Dense layers;
* `tabular`: a dict of three inputs (float32 numeric features through an adapted
  Normalization, a float32 amount through an adapted Discretization, int64 codes through an
  adapted IntegerLookup), Embeddings and an MLP;
* `recommender`: a dict of four inputs, three int64 ids (user, item, category) through
  Embeddings and thirteen float32 features, the category ids also multi-hot encoded
  (CategoryEncoding), two named heads (`click`, `rating`);
* `audio`: a waveform through a custom layer computing a log-mel spectrogram
  (tf.signal.stft, its magnitude, a mel matrix, log), then a small Conv2D head;
* `two-tower`: a retrieval model, a query tower (user id, the last ten item ids) and an item
  tower (item id, eight float features), their normalized dot product as the score;
* `image`: uint8 images resized and rescaled inside the model, then a small CNN. Keras'
  `Resizing` rounds a uint8 image back to uint8 when called eagerly and not in a traced
  graph, so this model is tuned with `reference="traced"` (what `model.predict()` computes)
  and every error below is taken against `tf.function(model)` for it;
* `fnet`: an FNet-style text encoder, token ids through an Embedding, then two blocks of
  Fourier mixing (the real part of `tf.signal.fft2d` over the sequence and hidden axes, on
  a complex cast) and a feed-forward layer, each with a residual and LayerNormalization,
  pooled into a classifier: what only the TensorFlow candidates ran before the FFT rewrite
  (export/rewrites.py; XLA is the one to beat there).

For each model, in a child process of its own (as benchmarks/zoo.py): `infertune.optimize`,
timed, or the reason it refused the model; every candidate's fate from the report; the
callable's error against `model(x)` (the reference) at two batch sizes (relative norm and the
largest element); the runtimes written by hand with their defaults (by_hand.py: tf.function,
tf.function with XLA, ONNX Runtime on a tf2onnx export, OpenVINO f32 from that export,
LiteRT), each where it converts, its failure recorded otherwise; and those that ran timed
with infertune's callable in one interleaved run.

Targets (exit code 1 if one fails): every model runs through optimize(); infertune within 5%
of the fastest exact by-hand runtime on each (exact: within 1e-3 of `model(x)`, relative
norm); faster than `tf.function(model)` on each model where a converter (ONNX Runtime,
OpenVINO, LiteRT, XLA) ran it by hand, within 1e-3 of `model(x)` or not.

    python benchmarks/production.py [--models recommender,audio | --quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
from timing import (
    EXACT_RTOL,
    fate_lines,
    machine_description,
    relative_error,
    run_in_child,
    runtime_table,
    write_results,
)
from zoo import describe_input, flat_outputs, reason, timed_against_by_hand

CONVERTERS = ("tf.function+XLA", "onnxruntime", "openvino-f32", "litert")
TOO_SLOW = 1.05  # infertune may be at most 5% slower than the fastest exact by-hand runtime
SAMPLE_BATCH = 1  # a service's single request
CHECK_BATCH = 8  # the other batch size the callable is checked at


@dataclass(frozen=True)
class Sizes:
    """How large the models are: the full run's, or --quick's tiny ones."""

    vocabulary: int = 5000
    sequence: int = 64
    embedding: int = 32
    users: int = 100_000
    items: int = 50_000
    categories: int = 200
    waveform: int = 16_000  # one second at 16 kHz
    image: int = 160
    hidden: int = 128


FULL = Sizes()
QUICK = Sizes(
    vocabulary=200,
    sequence=16,
    embedding=8,
    users=500,
    items=400,
    categories=20,
    waveform=2000,
    image=48,
    hidden=16,
)


# -- models ------------------------------------------------------------------------------------
WORDS = [f"w{i}" for i in range(400)]


def sentences(rng: np.random.Generator, batch: int, sizes: Sizes) -> np.ndarray:
    """(batch, 1) strings of 3..sequence+8 words (some past the vocabulary, some cut)."""
    lengths = rng.integers(3, sizes.sequence + 8, batch)
    text = [" ".join(rng.choice(WORDS, n)) for n in lengths]
    return np.array(text, dtype=object).reshape(batch, 1)


def text_classifier(sizes: Sizes):
    import keras
    from keras import layers

    vectorize = layers.TextVectorization(
        max_tokens=sizes.vocabulary, output_sequence_length=sizes.sequence
    )
    vectorize.adapt(sentences(np.random.default_rng(1), 256, sizes).ravel())
    text = keras.Input((1,), dtype="string", name="text")
    x = layers.Embedding(sizes.vocabulary, sizes.embedding)(vectorize(text))
    x = layers.GlobalAveragePooling1D()(x)
    x = layers.Dense(sizes.hidden, activation="relu")(x)
    return keras.Model(text, layers.Dense(4)(x), name="text_classifier")


NUMERIC = 8  # the tabular model's numeric features
CODES = 300  # distinct int64 codes the tabular model's IntegerLookup learns


def tabular_inputs(rng: np.random.Generator, batch: int, sizes: Sizes) -> dict[str, np.ndarray]:
    return {
        "numeric": rng.normal(50.0, 20.0, (batch, NUMERIC)).astype(np.float32),
        "amount": rng.lognormal(3.0, 1.0, (batch, 1)).astype(np.float32),
        # codes as a database hands them: large, sparse int64 values (some never seen)
        "code": (rng.integers(0, CODES + 20, (batch, 1)) * 7919 + 100_000).astype(np.int64),
    }


def tabular(sizes: Sizes):
    import keras
    from keras import layers

    data = tabular_inputs(np.random.default_rng(1), 512, sizes)
    normalize = layers.Normalization()
    normalize.adapt(data["numeric"])
    buckets = layers.Discretization(num_bins=16, epsilon=0.01)
    buckets.adapt(data["amount"])
    lookup = layers.IntegerLookup(max_tokens=CODES, output_mode="int")
    lookup.adapt(data["code"])
    numeric = keras.Input((NUMERIC,), dtype="float32", name="numeric")
    amount = keras.Input((1,), dtype="float32", name="amount")
    code = keras.Input((1,), dtype="int64", name="code")
    x = layers.Concatenate()(
        [
            normalize(numeric),
            layers.Flatten()(layers.Embedding(16, 4)(buckets(amount))),
            layers.Flatten()(layers.Embedding(lookup.vocabulary_size(), 8)(lookup(code))),
        ]
    )
    x = layers.Dense(sizes.hidden, activation="relu")(x)
    x = layers.Dense(sizes.hidden // 2, activation="relu")(x)
    inputs = {"numeric": numeric, "amount": amount, "code": code}
    return keras.Model(inputs, layers.Dense(1)(x), name="tabular")


FEATURES = 13  # the recommender's float features


def recommender_inputs(rng: np.random.Generator, batch: int, sizes: Sizes) -> dict[str, np.ndarray]:
    return {
        "user_id": rng.integers(0, sizes.users, (batch, 1)).astype(np.int64),
        "item_id": rng.integers(0, sizes.items, (batch, 1)).astype(np.int64),
        "category_id": rng.integers(0, sizes.categories, (batch, 1)).astype(np.int64),
        "features": rng.standard_normal((batch, FEATURES)).astype(np.float32),
    }


def recommender(sizes: Sizes, multi_hot: bool = True):
    """Three int64 ids through Embeddings and thirteen float features; the category ids also
    multi-hot (CategoryEncoding, where `multi_hot`); two named heads."""
    import keras
    from keras import layers

    ids = {
        name: keras.Input((1,), dtype="int64", name=name)
        for name in ("user_id", "item_id", "category_id")
    }
    features = keras.Input((FEATURES,), dtype="float32", name="features")
    counts = {"user_id": sizes.users, "item_id": sizes.items, "category_id": sizes.categories}
    parts = [
        layers.Flatten()(layers.Embedding(counts[name], sizes.embedding)(tensor))
        for name, tensor in ids.items()
    ]
    if multi_hot:
        encode = layers.CategoryEncoding(num_tokens=sizes.categories, output_mode="multi_hot")
        parts.append(encode(ids["category_id"]))
    parts.append(layers.Dense(sizes.hidden, activation="relu")(features))
    x = layers.Dense(sizes.hidden, activation="relu")(layers.Concatenate()(parts))
    x = layers.Dense(sizes.hidden // 2, activation="relu")(x)
    heads = {
        "click": layers.Dense(1, activation="sigmoid", name="click")(x),
        "rating": layers.Dense(1, name="rating")(x),
    }
    return keras.Model({**ids, "features": features}, heads, name="recommender")


MEL_BINS = 40
SAMPLE_RATE = 16_000


def waveforms(rng: np.random.Generator, batch: int, sizes: Sizes) -> np.ndarray:
    t = np.arange(sizes.waveform) / SAMPLE_RATE
    tone = np.sin(2 * np.pi * rng.uniform(100, 2000, (batch, 1)) * t)
    return (0.5 * tone + 0.1 * rng.standard_normal((batch, sizes.waveform))).astype(np.float32)


def audio(sizes: Sizes):
    import keras
    import tensorflow as tf
    from keras import layers

    class LogMel(layers.Layer):
        """A log-mel spectrogram: STFT (frames of 512, hop 256), magnitude, 40 mel bins, log."""

        def build(self, input_shape):
            self.mel = tf.signal.linear_to_mel_weight_matrix(MEL_BINS, 257, SAMPLE_RATE, 20, 8000)

        def call(self, waveform):
            spectrum = tf.abs(tf.signal.stft(waveform, 512, 256, 512))
            return tf.math.log(tf.tensordot(spectrum, self.mel, 1) + 1e-6)[..., None]

    wave = keras.Input((sizes.waveform,), dtype="float32", name="waveform")
    x = LogMel()(wave)
    x = layers.Conv2D(16, 3, padding="same", activation="relu")(x)
    x = layers.MaxPooling2D(2)(x)
    x = layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(wave, layers.Dense(10)(x), name="audio")


HISTORY = 10  # item ids of a user's recent history
ITEM_FEATURES = 8


def two_tower_inputs(rng: np.random.Generator, batch: int, sizes: Sizes) -> dict[str, np.ndarray]:
    return {
        "user_id": rng.integers(0, sizes.users, (batch, 1)).astype(np.int64),
        "history": rng.integers(0, sizes.items, (batch, HISTORY)).astype(np.int64),
        "item_id": rng.integers(0, sizes.items, (batch, 1)).astype(np.int64),
        "item_features": rng.standard_normal((batch, ITEM_FEATURES)).astype(np.float32),
    }


def two_tower(sizes: Sizes):
    import keras
    from keras import layers

    user = keras.Input((1,), dtype="int64", name="user_id")
    history = keras.Input((HISTORY,), dtype="int64", name="history")
    item = keras.Input((1,), dtype="int64", name="item_id")
    item_features = keras.Input((ITEM_FEATURES,), dtype="float32", name="item_features")
    items = layers.Embedding(sizes.items, sizes.embedding)  # shared by both towers
    query = layers.Concatenate()(
        [
            layers.Flatten()(layers.Embedding(sizes.users, sizes.embedding)(user)),
            layers.GlobalAveragePooling1D()(items(history)),
        ]
    )
    query = layers.Dense(sizes.embedding)(layers.Dense(sizes.hidden, activation="relu")(query))
    candidate = layers.Concatenate()([layers.Flatten()(items(item)), item_features])
    candidate = layers.Dense(sizes.embedding)(
        layers.Dense(sizes.hidden, activation="relu")(candidate)
    )
    score = layers.Dot(axes=1, normalize=True)([query, candidate])
    inputs = {"user_id": user, "history": history, "item_id": item, "item_features": item_features}
    return keras.Model(inputs, score, name="two_tower")


def images(rng: np.random.Generator, batch: int, sizes: Sizes) -> np.ndarray:
    side = sizes.image
    return rng.integers(0, 256, (batch, side, side, 3)).astype(np.uint8)


def image(sizes: Sizes):
    """uint8 images resized to 3/4 of their side and rescaled inside, then a small CNN."""
    import keras
    from keras import layers

    side = sizes.image * 3 // 4
    pixels = keras.Input((sizes.image, sizes.image, 3), dtype="uint8", name="image")
    x = layers.Rescaling(1 / 127.5, offset=-1)(layers.Resizing(side, side)(pixels))
    for filters in (16, 32, 64):
        x = layers.Conv2D(filters, 3, strides=2, padding="same", activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(pixels, layers.Dense(5)(x), name="image")


@dataclass(frozen=True)
class ProductionModel:
    kind: str
    build: Callable[[Sizes], Any]
    draw: Callable[[np.random.Generator, int, Sizes], Any]  # (rng, batch, sizes) -> input
    # What the outputs are checked against: "eager" (model(x)) or "traced" (the traced graph,
    # what model.predict() and model.export() compute), as optimize(reference=...) takes it.
    reference: str = "eager"


def token_ids(rng: np.random.Generator, batch: int, sizes: Sizes) -> np.ndarray:
    return rng.integers(0, sizes.vocabulary, (batch, sizes.sequence)).astype(np.int32)


def fnet(sizes: Sizes):
    import keras
    import tensorflow as tf
    from keras import layers

    class FourierMixing(layers.Layer):
        """FNet's token mixing: the real part of the 2-D FFT over sequence and hidden axes."""

        def call(self, x):
            return tf.math.real(tf.signal.fft2d(tf.cast(x, tf.complex64)))

    tokens = keras.Input((sizes.sequence,), dtype="int32", name="token_ids")
    x = layers.Embedding(sizes.vocabulary, sizes.hidden)(tokens)
    for _ in range(2):
        x = layers.LayerNormalization()(x + FourierMixing()(x))
        hidden = layers.Dense(4 * sizes.hidden, activation="gelu")(x)
        x = layers.LayerNormalization()(x + layers.Dense(sizes.hidden)(hidden))
    pooled = layers.GlobalAveragePooling1D()(x)
    return keras.Model(tokens, layers.Dense(2)(pooled), name="fnet")


MODELS: dict[str, ProductionModel] = {
    "text-classifier": ProductionModel(
        "strings: TextVectorization, Embedding, pooling", text_classifier, sentences
    ),
    "tabular": ProductionModel(
        "dict of 3: Normalization, Discretization, IntegerLookup", tabular, tabular_inputs
    ),
    "recommender": ProductionModel(
        "dict of 4 (3 int64 ids), multi-hot, two heads", recommender, recommender_inputs
    ),
    "audio": ProductionModel("waveform: custom log-mel layer (STFT), Conv2D", audio, waveforms),
    "two-tower": ProductionModel(
        "dict of 4 (int64 ids, history): two towers, dot", two_tower, two_tower_inputs
    ),
    # Keras' Resizing rounds a uint8 image back to uint8 called eagerly, not traced: a service
    # that serves model.predict() or model.export() tunes against the traced graph.
    "image": ProductionModel(
        "uint8 image: Resizing, Rescaling, CNN (reference: traced)", image, images, "traced"
    ),
    "fnet": ProductionModel("token ids: Fourier mixing (FFT2D), feed-forward", fnet, token_ids),
}


# -- one model, in a child process -------------------------------------------------------------
def reference_call(model, spec: ProductionModel) -> Callable[[Any], Any]:
    """The model as the outputs are checked against: its eager call, or its traced graph."""
    if spec.reference == "eager":
        return model
    import tensorflow as tf

    return tf.function(model)


def callable_errors(opt, model, spec: ProductionModel, sizes: Sizes, rng) -> dict:
    """{"batch N": {"rel": relative norm, "max_abs": largest element} or "failed: ..."}."""
    errors: dict[str, Any] = {}
    call = reference_call(model, spec)
    for batch in (SAMPLE_BATCH, CHECK_BATCH):
        x = spec.draw(rng, batch, sizes)
        try:
            outs, refs = flat_outputs(opt(x)), flat_outputs(call(x))
            errors[f"batch {batch}"] = {
                "rel": relative_error(outs, refs),
                "max_abs": max(float(np.max(np.abs(o - r))) for o, r in zip(outs, refs)),
            }
        except Exception as exc:  # the callable refusing an input is a result too
            errors[f"batch {batch}"] = f"failed: {reason(exc)}"
    return errors


def candidate_fates(report) -> list[dict]:
    return [
        {"name": c.name, "status": c.status, "precision": c.precision, "reason": c.reason,
         "p50_ms": c.p50, "max_rel_err": c.max_rel_err}
        for c in report.candidates
    ]  # fmt: skip


def run_model(name: str, quick: bool, budget_s: float) -> dict:
    import keras

    import infertune

    sizes = QUICK if quick else FULL
    spec = MODELS[name]
    keras.utils.set_random_seed(0)
    model = spec.build(sizes)
    rng = np.random.default_rng(0)
    sample = spec.draw(rng, SAMPLE_BATCH, sizes)
    result: dict[str, Any] = {"model": name, "kind": spec.kind, "input": describe_input(sample)}
    print(f"[production] {name}: optimize()", file=sys.stderr, flush=True)
    start = time.perf_counter()
    try:
        opt = infertune.optimize(model, sample, reference=spec.reference, verbose=False)
    except Exception as exc:  # a refused model is a result: say why
        opt = None
        result["optimize_failed"] = reason(exc)
    result["optimize_s"] = time.perf_counter() - start
    if opt is not None:
        result.update(
            selected=opt.backend,
            selection_reason=opt.report.selection_reason,
            candidates=candidate_fates(opt.report),
            callable_err=callable_errors(opt, model, spec, sizes, rng),
            report=opt.report.to_dict(),
        )
    reference = flat_outputs(reference_call(model, spec)(sample))
    result.update(timed_against_by_hand(name, "production", model, sample, reference, opt,
                                        budget_s))  # fmt: skip
    p50, ours = result["p50_ms"], result["p50_ms"].get("infertune")
    result.update(
        vs_tf_function=p50["tf.function"] / ours if ours and "tf.function" in p50 else None,
        # a converter ran the model by hand (exact or not: the model's body converts)
        converted_by_hand=[label for label in CONVERTERS if label in p50],
    )
    return result


# -- report ------------------------------------------------------------------------------------


def worst_error(r: dict) -> str:
    if "optimize_failed" in r:
        return "-"
    values = list(r["callable_err"].values())
    if any(isinstance(v, str) for v in values):
        return "failed"
    return f"{max(v['rel'] for v in values):.0e}"


def markdown(results: list[dict]) -> str:
    def tail(r: dict) -> list[str]:
        ratio = r["vs_tf_function"]
        return ["-" if ratio is None else f"{ratio:.2f}x", worst_error(r)]

    return runtime_table(
        results,
        ["vs tf.function", "opt(x) err"],
        lambda r: "refused" if "optimize_failed" in r else r["selected"],
        tail,
    )


def fates(results: list[dict]) -> str:
    """Every candidate's fate, and why each by-hand runtime or candidate failed."""
    lines = []
    for r in results:
        if "error" in r:
            lines.append(f"- **{r['model']}**: {r['error']}")
            continue
        if "optimize_failed" in r:
            lines.append(f"- **{r['model']}** ({r['kind']}): optimize() refused it:")
            lines.append(f"  - {r['optimize_failed']}")
        else:
            lines += fate_lines(f"**{r['model']}** ({r['kind']})", r["candidates"])
            errors = ", ".join(
                f"{label} {v}"
                if isinstance(v, str)
                else f"{label} {v['rel']:.1e} (largest element {v['max_abs']:.1e})"
                for label, v in r["callable_err"].items()
            )
            lines.append(f"  - opt(x) error against model(x), relative norm: {errors}")
        for label, why in r["raw_failed"].items():
            lines.append(f"  - by hand, {label} failed: {why}")
    return "\n".join(lines)


def check_targets(results: list[dict]) -> list[str]:
    checks: list[tuple[bool, str]] = []
    for r in results:
        name = r["model"]
        if "error" in r:
            checks.append((False, f"{name}: {r['error']}"))
            continue
        if "optimize_failed" in r:
            checks.append((False, f"{name}: optimize() refused it: {r['optimize_failed']}"))
            continue
        checks.append((True, f"{name}: runs ({r['selected']})"))
        ratio, best = r["vs_best_exact_raw"], r["best_exact_raw"]
        if ratio is None and r["p50_ms"].get("infertune") is not None:
            errors = ", ".join(f"{k} {v:.0e}" for k, v in r["raw_rel_err"].items())
            checks.append(
                (
                    False,
                    f"{name}: no by-hand runtime matches model(x) within {EXACT_RTOL:g} "
                    f"(relative error: {errors or 'none ran'})",
                )
            )
        elif ratio is None:
            checks.append((False, f"{name}: infertune's callable was not timed"))
        else:
            checks.append(
                (
                    ratio >= 1 / TOO_SLOW,
                    f"{name}: {ratio:.2f}x the fastest exact by-hand runtime {best} "
                    f"(>= {1 / TOO_SLOW:.2f}: within 5%)",
                )
            )
        converted = r["converted_by_hand"]
        if converted and r["vs_tf_function"] is not None:
            checks.append(
                (
                    r["vs_tf_function"] > 1.0,
                    f"{name}: {r['vs_tf_function']:.2f}x tf.function(model) "
                    f"(> 1: converters ran it by hand, exact or not: {', '.join(converted)})",
                )
            )
    return [f"{'PASS' if ok else 'FAIL'} {text}" for ok, text in checks]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help=f"comma-separated names; default all: {list(MODELS)}")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes and 2 s of measuring per model: a smoke run, not numbers",
    )
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks/production"))
    parser.add_argument(
        "--budget", type=float, default=None, help="measurement s per model (10; --quick: 2)"
    )
    parser.add_argument(
        "--model-timeout", type=float, default=1200.0, help="s one model may take in all"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    budget = args.budget if args.budget is not None else (2.0 if args.quick else 10.0)
    if args.child:
        result = run_model(args.child, args.quick, budget)
        args.child_out.write_text(json.dumps(result, default=str), encoding="utf-8")
        return 0
    names = [n for n in args.models.split(",") if n] if args.models else list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; known: {list(MODELS)}")
    results = []
    for name in names:
        print(f"[production] {name} ({len(results) + 1} of {len(names)})", file=sys.stderr)
        results.append(
            run_in_child(
                __file__,
                name,
                ["--budget", str(budget)] + (["--quick"] if args.quick else []),
                args.model_timeout,
            )
        )
    from infertune.system.environment import collect_environment

    env = collect_environment()
    targets = check_targets(results)
    text = "\n\n".join(
        [
            f"Median ms per call (p50) at batch {SAMPLE_BATCH}"
            + (" (--quick: tiny sizes, not numbers to keep)" if args.quick else "")
            + "; the by-hand runtimes and infertune's callable timed in one interleaved run "
            f"per model. `(err E)`: not exact (relative error above {EXACT_RTOL:g}); "
            f"`opt(x) err`: the callable's largest relative error against model(x) at batch "
            f"{SAMPLE_BATCH} and {CHECK_BATCH}.",
            f"Machine: {machine_description(env)}",
            markdown(results),
            "Every candidate's fate:\n\n" + fates(results),
            "\n".join(targets),
        ]
    )
    print(text)
    write_results(args.out, text, env, results, targets)
    return 0 if all(t.startswith("PASS") for t in targets) else 1


if __name__ == "__main__":
    sys.exit(main())
