"""Reduced precision: infertune's bf16 and int8 candidates on trained models, judged by a task
metric, against float32 and int8 written by hand with each library's defaults.

    python benchmarks/precision.py [--models resnet50-224,bert-encoder | --quick]
                                   [--cache DIR] [--out DIR] [--budget SECONDS] [--chosen-only]
                                   [--verbose] [--tuning-rounds N]

Models, trained in the benchmark on a real task (the gate judges a real metric on trained
weights) and cached as .keras files in --cache (default ~/.cache/infertune-bench/precision/,
keyed by the model's name and its Spec's version), so reruns skip the training:

* digits-cnn: a CNN on scikit-learn's handwritten digits (load_digits, bundled offline),
  upscaled from 8x8 to 32x32; trained to at least 95% on the test split.
* shapes-mobilenetv2: a MobileNetV2-style network (inverted residual blocks, ReLU6, 16 to 64
  channels, keras layers) at 64x64, trained from scratch on generated images of circles,
  squares and triangles (random size, place, rotation, colours, noise); at least 95%.
  (keras.applications.MobileNetV2 alpha 0.35 reached 55% after 15 epochs here.)
* tokens-transformer: a small transformer text classifier (token and position embeddings, two
  encoder blocks of width 64, mean pooling) on generated token sequences, the label whether
  token A comes before token B; at least 95%.
* resnet50-224: keras.applications ResNet50 at 224x224, include_top=False with average
  pooling, random weights, and a linear head (logistic regression on the pooled features,
  folded into a Dense layer) trained on the digits upscaled to 224x224x3; at least 50%
  (chance: 10%).
* mobilenetv2-224: keras.applications MobileNetV2 (alpha 1.0) at 224x224, include_top=False
  with average pooling and a Dense head, trained end to end on the digits upscaled to
  224x224x3 (10 epochs, batches of 32, Adam with a cosine decay from 1e-3,
  BatchNormalization momentum 0.9; 14 minutes on 2 cores); at least 95%. (Its random
  body with a linear head lost 4-11 points in every int8, by hand too: the gate judged an
  artefact of random weights, not what users quantize.)
* bert-encoder: a BERT-sized encoder (vocabulary 30522, positions, 4 blocks of width 768, 12
  heads, feed-forward 3072, tanh GELU, sequence 128) on the digits as tokens (each of the 64
  pixels one of 17 grey levels, after a [CLS] token, padded to 128): a linear head fitted on
  its random features, then trained end to end (8 epochs, batches of 32, Adam warming up
  to 5e-5 over the first, then a cosine decay); at least 50%. (Its random body with a linear
  head, version 1, needed five layers in float32 for NNCF's int8 to pass the gate, and LiteRT's
  dynamic-range int8 lost 2.5 points; trained, that one loses none.)

--quick runs tiny versions of each (a two-block residual net and two inverted residual blocks
at 32x32, encoders of one block of width 32 or 64), trained a few epochs, measured 2 s, and
tunes one other accepted candidate alone on the first model: a smoke test of every step.

Every task is split four ways, disjoint: training, calibration (128 samples, what static int8
calibrates on), gate (the labelled data given to `accuracy=`) and a held-out test split.

Per model, in a child process of its own (run_in_child):

* infertune.optimize(model, x, precision=("fp32", "bf16", "int8"), calibration=...,
  accuracy=infertune.Accuracy(gate split, "accuracy", max_drop=0.01)), timed; every
  candidate's fate, gate metric, drop and its bound; on ResNet50 also optimize() in fp32 alone
  on the same model, timed, and the ratio of the two (after a warm-up optimize() on a tiny
  model, so that neither pays the process's one-time imports), each of the two three times
  (--tuning-rounds N: N times; 1 with --quick), in turns whose order alternates, the ratio
  of their medians;
* the fp32 model's accuracy on the test split, the chosen candidate's, and its drop; with the
  default (not --chosen-only) each other reduced-precision candidate that passed the gate too,
  tuned again alone (`backends=[name]`) to run it on the test split;
* float32 by hand (by_hand.py): tf.function, XLA, ONNX Runtime, OpenVINO f32, LiteRT, each
  "exact" when within 1e-3 of model(x); int8 by hand with each library's defaults, calibrated
  on the same 128 samples: ONNX Runtime `quantize_static` (QDQ, per_channel=True) of the
  tf2onnx export, NNCF `quantize` of that export compiled by OpenVINO with f32 inference
  precision, TFLite full int8 (representative dataset, float32 inputs and outputs), each
  judged by the same gate on the same gate split (infertune.accuracy.judge_metric);
* infertune's callable and every by-hand runtime timed at batch 1 in one interleaved run,
  none leaving it for being far behind (the float32 ones would, against int8, after two calls).

Targets (exit code 1 if one fails; --quick checks none: its models are tiny): on a CPU with
VNNI, ResNet50 224 and the BERT-sized encoder at least 2.5x, MobileNetV2 224 at least 1.3x the
best float32 runtime by hand; on every model within 1.05 of the fastest int8 by hand that
passes the gate, or faster; every accepted reduced-precision candidate's drop on the test
split within max_drop + 0.5 points; on a CPU without VNNI or bf16 units, never slower than the
fastest fp32 candidate; optimize() with reduced precision on ResNet50 224 at most 2.5x
optimize() in fp32 alone; every trained model at its stated fp32 accuracy.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("NNCF_CI", "1")  # NNCF reads it at import: no telemetry

import numpy as np
from timing import (
    EXACT_RTOL,
    ONNXRUNTIME_COOLDOWN_S,
    machine_description,
    measure_runners,
    milliseconds,
    relative_error,
    run_in_child,
    write_results,
)
from zoo import describe_input, reason

DEFAULT_CACHE = Path("~/.cache/infertune-bench/precision")
PRECISIONS = ("fp32", "bf16", "int8")
MAX_DROP = 0.01  # the gate: at most one point of accuracy lost, with the bootstrap's margin
HELD_OUT_SLACK = 0.005  # an accepted candidate's drop on the test split: max_drop + 0.5 points
TOO_SLOW = 1.05  # infertune may be at most 5% slower than the best int8 by hand that passes
OPTIMIZE_RATIO = 2.5  # optimize() with reduced precision against fp32 alone (ResNet50 224)
# Each timed this many times, in turns: one pair's ratio moved 2.19-2.72x in three such runs
TUNING_ROUNDS = 3
CALIBRATION = 128  # samples in calibration= (infertune's quantizers take 32-128 of them)
QUICK_OUT = Path(tempfile.gettempdir()) / "infertune-bench-precision-quick"  # not the docs'
CHUNK = 32  # the batch the models are run at on whole splits (training, metrics)
FP32_RUNTIMES = ("tf.function", "tf.function+XLA", "onnxruntime", "openvino-f32", "litert")
INT8_RUNTIMES = ("onnxruntime-int8", "openvino-nncf-int8", "litert-int8")


def log(message: str) -> None:
    print(f"[precision] {message}", file=sys.stderr, flush=True)


# -- tasks -------------------------------------------------------------------------------------
Splits = dict[str, tuple[np.ndarray, np.ndarray]]  # split -> (raw inputs, labels)


def cut(x: np.ndarray, y: np.ndarray, sizes: dict[str, int]) -> Splits:
    """Consecutive, disjoint splits of (x, y); the last split takes the rest."""
    splits, start = {}, 0
    for name, size in sizes.items():
        stop = len(x) if size < 0 else start + size
        splits[name] = (x[start:stop], y[start:stop])
        start = stop
    return splits


def digits(quick: bool) -> Splits:
    """scikit-learn's 1,797 handwritten digits (8x8, grey levels 0..16), shuffled once:
    training 800, calibration 128, gate 435, test 434."""
    from sklearn.datasets import load_digits

    data = load_digits()
    order = np.random.default_rng(0).permutation(len(data.target))
    x = data.images[order].astype(np.float32)
    y = data.target[order].astype(np.int32)
    return cut(x, y, {"train": 800, "calibration": CALIBRATION, "gate": 435, "test": -1})


def upscale(images: np.ndarray, side: int, channels: int) -> np.ndarray:
    """8x8 digits (0..16) as side x side images in 0..1 (bilinear), `channels` copies."""
    import tensorflow as tf

    parts = []
    for start in range(0, len(images), 64):
        batch = images[start : start + 64, :, :, None] / 16.0
        parts.append(tf.image.resize(batch, (side, side), method="bilinear").numpy())
    x = np.concatenate(parts).astype(np.float32)
    return np.repeat(x, channels, axis=-1) if channels > 1 else x


def shape_images(rng: np.random.Generator, n: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """n images of one shape each (0 circle, 1 square, 2 triangle: the label), of random
    size, place, rotation and colours on a plain background, with Gaussian noise; 0..1."""
    yy, xx = np.mgrid[0:side, 0:side].astype(np.float32) + 0.5
    labels = rng.integers(0, 3, n).astype(np.int32)
    images = np.empty((n, side, side, 3), np.float32)
    for i, label in enumerate(labels):
        r = rng.uniform(0.16, 0.34) * side
        cx, cy = rng.uniform(r, side - r, 2)
        angle = rng.uniform(0, 2 * np.pi)
        u = (xx - cx) * np.cos(angle) + (yy - cy) * np.sin(angle)
        v = -(xx - cx) * np.sin(angle) + (yy - cy) * np.cos(angle)
        if label == 0:
            mask = u**2 + v**2 <= r**2
        elif label == 1:
            mask = (np.abs(u) <= 0.8 * r) & (np.abs(v) <= 0.8 * r)
        else:  # equilateral, circumradius r: inside the three edges at distance r / 2
            normals = np.pi / 3 + 2 * np.pi * np.arange(3) / 3
            mask = np.all([u * np.cos(a) + v * np.sin(a) <= r / 2 for a in normals], axis=0)
        background = rng.uniform(0, 1, 3)
        color = rng.uniform(0, 1, 3)
        while np.abs(color - background).max() < 0.4:
            color = rng.uniform(0, 1, 3)
        image = background + (color - background) * mask[..., None]
        images[i] = image + rng.normal(0, 0.05, image.shape)
    return np.clip(images, 0, 1), labels


def shapes(quick: bool) -> Splits:
    side = 32 if quick else 64
    rng = np.random.default_rng(1)
    sizes = {"train": 600 if quick else 4000, "calibration": CALIBRATION}
    sizes |= {"gate": 300 if quick else 1000, "test": 300 if quick else 1000}
    x, y = shape_images(rng, sum(sizes.values()), side)
    return cut(x, y, sizes)


TOKEN_A, TOKEN_B, TOKEN_VOCAB = 1, 2, 12  # the other tokens: 3..11


def token_sequences(rng: np.random.Generator, n: int, length: int) -> tuple[np.ndarray, ...]:
    """Sequences of filler tokens holding token A once and token B once, at random places;
    the label: 1 where A comes before B."""
    ids = rng.integers(3, TOKEN_VOCAB, (n, length)).astype(np.int32)
    places = np.argsort(rng.random((n, length)), axis=1)[:, :2]
    rows = np.arange(n)
    ids[rows, places[:, 0]] = TOKEN_A
    ids[rows, places[:, 1]] = TOKEN_B
    return ids, (places[:, 0] < places[:, 1]).astype(np.int32)


def tokens(quick: bool) -> Splits:
    rng = np.random.default_rng(2)
    sizes = {"train": 2000 if quick else 8000, "calibration": CALIBRATION}
    sizes |= {"gate": 300 if quick else 1000, "test": 300 if quick else 1000}
    x, y = token_sequences(rng, sum(sizes.values()), 16 if quick else 32)
    return cut(x, y, sizes)


BERT_VOCAB, CLS_ID, FIRST_LEVEL_ID = 30522, 101, 1000  # [PAD] is 0


def digit_tokens(images: np.ndarray, length: int) -> np.ndarray:
    """Each digit as [CLS] and its 64 pixels, each one of 17 grey-level tokens, padded."""
    n = len(images)
    ids = np.zeros((n, length), np.int32)
    ids[:, 0] = CLS_ID
    ids[:, 1:65] = FIRST_LEVEL_ID + np.rint(images.reshape(n, 64)).astype(np.int32)
    return ids


@dataclass
class Data:
    """A task's splits, raw, and the inputs the model takes made from them on demand."""

    raw: Splits
    convert: Callable[[np.ndarray], np.ndarray]
    made: dict[str, np.ndarray] = field(default_factory=dict)

    def x(self, split: str) -> np.ndarray:
        if split not in self.made:
            self.made[split] = self.convert(self.raw[split][0])
        return self.made[split]

    def y(self, split: str) -> np.ndarray:
        return self.raw[split][1]

    def batches(self, split: str) -> list[tuple[np.ndarray, np.ndarray]]:
        x, y = self.x(split), self.y(split)
        return [(x[i : i + CHUNK], y[i : i + CHUNK]) for i in range(0, len(x), CHUNK)]


# -- models ------------------------------------------------------------------------------------
def fit(
    model, data: Data, epochs: int, learning_rate: float = 1e-3, batch: int = 64,
    decay: bool = False, warmup_epochs: int = 0,
) -> None:  # fmt: skip
    """Adam on the training split; `decay`: the learning rate decays to 1% along a cosine,
    after rising from 0 along `warmup_epochs`."""
    import keras

    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if decay:
        per_epoch = -(-len(data.y("train")) // batch)
        warmup = warmup_epochs * per_epoch
        learning_rate = keras.optimizers.schedules.CosineDecay(
            0.0 if warmup else learning_rate, epochs * per_epoch - warmup, alpha=0.01,
            warmup_target=learning_rate if warmup else None, warmup_steps=warmup,
        )  # fmt: skip
    model.compile(keras.optimizers.Adam(learning_rate), loss, metrics=["accuracy"])
    history = model.fit(
        data.x("train"), data.y("train"), batch_size=batch, epochs=epochs, shuffle=True, verbose=0
    )
    log(f"  trained {epochs} epochs: training accuracy {history.history['accuracy'][-1]:.4f}")


def digits_cnn(data: Data, quick: bool):
    import keras
    from keras import layers

    model = keras.Sequential(
        [
            keras.Input((32, 32, 1)),
            layers.Conv2D(32, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(64, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Flatten(),
            layers.Dense(64, activation="relu"),
            layers.Dense(10),
        ],
        name="digits_cnn",
    )
    fit(model, data, epochs=10 if quick else 30)
    return model


def inverted_residuals(side: int, stages, last: int | None, name: str):
    """A MobileNetV2-style network: a strided 3x3 stem, then per stage (channels, stride,
    blocks) inverted residual blocks (1x1 expansion by 4, depthwise 3x3, linear 1x1
    projection, a shortcut where the shape allows), ReLU6 and BatchNormalization, a 1x1
    convolution to `last` channels, average pooled."""
    import keras
    from keras import layers

    def bn(x, relu6=True):
        x = layers.BatchNormalization()(x)
        return layers.ReLU(6.0)(x) if relu6 else x

    inputs = keras.Input((side, side, 3))
    x = bn(layers.Conv2D(16, 3, 2, "same", use_bias=False)(inputs))
    for channels, stride, blocks in stages:
        for block in range(blocks):
            strides = stride if block == 0 else 1
            y = bn(layers.Conv2D(4 * x.shape[-1], 1, use_bias=False)(x))
            y = bn(layers.DepthwiseConv2D(3, strides, "same", use_bias=False)(y))
            y = bn(layers.Conv2D(channels, 1, use_bias=False)(y), relu6=False)
            x = x + y if strides == 1 and x.shape[-1] == channels else y
    if last:
        x = bn(layers.Conv2D(last, 1, use_bias=False)(x))
    return keras.Model(inputs, layers.GlobalAveragePooling2D()(x), name=name)


def tiny_mobilenet(side: int):
    """--quick's stand-in for MobileNetV2: two inverted residual blocks."""
    return inverted_residuals(side, [(16, 1, 2)], None, "tiny_mobilenet")


def shapes_mobilenetv2(data: Data, quick: bool):
    import keras

    side = data.x("calibration").shape[1]
    if quick:
        body = tiny_mobilenet(side)
    else:
        stages = [(24, 2, 2), (32, 2, 3), (64, 2, 3)]
        body = inverted_residuals(side, stages, 256, "mobilenetv2_style")
    model = keras.Model(body.input, keras.layers.Dense(3)(body.output), name="shapes")
    short_run_batch_norms(model)
    fit(model, data, epochs=3 if quick else 12, learning_rate=2e-3)
    return model


def short_run_batch_norms(model) -> None:
    """Every BatchNormalization's momentum 0.9: Keras' default (0.99; 0.999 in
    keras.applications) leaves the moving statistics far behind a short training run, and
    the model in inference mode then predicts one class."""
    import keras

    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = 0.9


def encoder(length, vocab, width, heads, ff, blocks, name):
    """Token ids -> embeddings of tokens and positions, `blocks` post-norm encoder blocks
    (attention, feed-forward with tanh GELU, which tf2onnx exports), mean pooling."""
    import keras
    from keras import layers, ops

    ids = keras.Input((length,), dtype="int32", name="token_ids")
    positions = ops.cumsum(ops.ones_like(ids), axis=1) - 1
    x = layers.Embedding(vocab, width)(ids) + layers.Embedding(length, width)(positions)
    x = layers.LayerNormalization(epsilon=1e-12)(x)
    for _ in range(blocks):
        attention = layers.MultiHeadAttention(heads, width // heads)(x, x)
        x = layers.LayerNormalization(epsilon=1e-12)(x + attention)
        hidden = ops.gelu(layers.Dense(ff)(x), approximate=True)
        x = layers.LayerNormalization(epsilon=1e-12)(x + layers.Dense(width)(hidden))
    return keras.Model(ids, layers.GlobalAveragePooling1D()(x), name=name)


def tokens_transformer(data: Data, quick: bool):
    import keras
    from keras import layers

    length = data.x("calibration").shape[1]
    width, heads, ff, blocks = (32, 2, 64, 1) if quick else (64, 4, 128, 2)
    body = encoder(length, TOKEN_VOCAB, width, heads, ff, blocks, "tokens_encoder")
    model = keras.Model(body.input, layers.Dense(2)(body.output), name="tokens_transformer")
    fit(model, data, epochs=3 if quick else 12)
    return model


def with_linear_head(body, data: Data, name: str):
    """`body` (random weights, pooled features out) and a Dense head: logistic regression
    trained on the body's features of the training split, scaled by one number (their RMS,
    folded into the kernel). Not standardized feature by feature: that multiplies the weights
    of the features that barely vary, and a kernel of such a range no int8 weight holds."""
    import keras
    from sklearn.linear_model import LogisticRegression

    features = body.predict(data.x("train"), batch_size=CHUNK, verbose=0).astype(np.float64)
    scale = float(np.sqrt(np.mean(features**2))) or 1.0
    head = LogisticRegression(max_iter=5000).fit(features / scale, data.y("train"))
    log(f"  linear head: training accuracy {head.score(features / scale, data.y('train')):.4f}")
    dense = keras.layers.Dense(len(head.classes_), name="head")
    model = keras.Model(body.input, dense(body.output), name=name)
    dense.set_weights(
        [(head.coef_.T / scale).astype(np.float32), head.intercept_.astype(np.float32)]
    )
    return model


def tiny_resnet(side: int):
    """--quick's stand-in for ResNet50: a stem and two residual blocks, average pooled."""
    import keras
    from keras import layers

    def conv_bn(x, filters, strides=1, relu=True):
        x = layers.Conv2D(filters, 3, strides, "same", use_bias=False)(x)
        x = layers.BatchNormalization()(x)
        return layers.ReLU()(x) if relu else x

    inputs = keras.Input((side, side, 3))
    x = conv_bn(inputs, 16, strides=2)
    for _ in range(2):
        x = layers.ReLU()(x + conv_bn(conv_bn(x, 16), 16, relu=False))
    return keras.Model(inputs, layers.GlobalAveragePooling2D()(x), name="tiny_resnet")


def resnet50_head(data: Data, quick: bool):
    import keras

    side = data.x("calibration").shape[1]
    if quick:
        body = tiny_resnet(side)
    else:
        body = keras.applications.ResNet50(
            weights=None, include_top=False, pooling="avg", input_shape=(side, side, 3)
        )
    return with_linear_head(body, data, "resnet50_digits")


def mobilenetv2_trained(data: Data, quick: bool):
    import keras

    side = data.x("calibration").shape[1]
    if quick:
        body = tiny_mobilenet(side)
    else:
        body = keras.applications.MobileNetV2(
            weights=None, include_top=False, pooling="avg", input_shape=(side, side, 3)
        )
    head = keras.layers.Dense(10, name="head")
    model = keras.Model(body.input, head(body.output), name="mobilenetv2_digits")
    short_run_batch_norms(model)
    fit(model, data, epochs=2 if quick else 10, batch=32, decay=True)
    return model


def bert_trained(data: Data, quick: bool):
    """The encoder with a linear head fitted on its random features (81% on the gate split),
    then trained end to end: Adam, 5e-5 after a warm-up epoch (without one, 3e-5 took the gate
    accuracy to 35% in the first epoch, from which 4 epochs brought it back to 84%)."""
    import keras

    length = data.x("calibration").shape[1]
    width, heads, ff, blocks = (64, 2, 128, 1) if quick else (768, 12, 3072, 4)
    body = encoder(length, BERT_VOCAB, width, heads, ff, blocks, "bert_encoder")
    model = with_linear_head(body, data, "bert_digits")
    fit(model, data, epochs=2 if quick else 8, learning_rate=5e-5, batch=32, decay=True,
        warmup_epochs=1)  # fmt: skip
    # Not compiled: the cached file without Adam's two copies of every weight (623 MB, not 208)
    return keras.Model(model.input, model.output, name=model.name)


def resnet_inputs(side: int) -> Callable[[np.ndarray], np.ndarray]:
    def convert(images):  # keras.applications.resnet50.preprocess_input: BGR, mean subtracted
        x = upscale(images, side, 3) * 255.0
        return (x[..., ::-1] - np.array([103.939, 116.779, 123.68], np.float32)).astype(np.float32)

    return convert


@dataclass(frozen=True)
class Spec:
    """A model of the benchmark: its task, its inputs, how it is built and trained."""

    what: str
    task: Callable[[bool], Splits]
    inputs: Callable[[bool], Callable[[np.ndarray], np.ndarray]]  # quick -> raw -> inputs
    build: Callable[[Data, bool], Any]
    stated: float  # the fp32 accuracy on the test split it must reach (full run)
    vs_fp32: float | None = None  # speed target against the best fp32 by hand, VNNI CPU
    time_fp32_alone: bool = False  # optimize() in fp32 alone too, for OPTIMIZE_RATIO
    version: int = 1  # of its model, data or training: the cache is keyed by it; bump on change


def side(quick: bool) -> int:
    return 32 if quick else 224


MODELS: dict[str, Spec] = {
    "digits-cnn": Spec(
        "CNN, digits upscaled to 32x32",
        digits,
        lambda quick: lambda x: upscale(x, 32, 1),
        digits_cnn,
        0.95,
    ),
    "shapes-mobilenetv2": Spec(
        "MobileNetV2-style, 64x64 generated shapes",
        shapes,
        lambda quick: lambda x: x * 2 - 1,
        shapes_mobilenetv2,
        0.95,
    ),
    "tokens-transformer": Spec(
        "transformer, 2 blocks of 64, token sequences (A before B?)",
        tokens,
        lambda quick: lambda x: x,
        tokens_transformer,
        0.95,
    ),
    "resnet50-224": Spec(
        "ResNet50 224, random body, head trained on digits",
        digits,
        lambda quick: resnet_inputs(side(quick)),
        resnet50_head,
        0.5,
        vs_fp32=2.5,
        time_fp32_alone=True,
    ),
    "mobilenetv2-224": Spec(
        "MobileNetV2 224, trained end to end on digits",
        digits,
        lambda quick: lambda x: upscale(x, side(quick), 3) * 2 - 1,
        mobilenetv2_trained,
        0.95,
        vs_fp32=1.3,
        version=2,  # 1: random body and a linear head
    ),
    "bert-encoder": Spec(
        "BERT-sized encoder, seq 128, trained end to end on digits",
        digits,
        lambda quick: lambda x: digit_tokens(x, 72 if quick else 128),
        bert_trained,
        0.5,
        vs_fp32=2.5,
        version=2,  # 1: random body and a linear head
    ),
}


def trained_model(name: str, data: Data, quick: bool, cache: Path) -> tuple[Any, dict]:
    """The model from the cache, or built, trained and stored there."""
    import keras

    path = cache / f"{name}{'-quick' if quick else ''}-v{MODELS[name].version}.keras"
    if path.exists():
        log(f"{name}: trained model from the cache, {path}")
        return keras.models.load_model(path), {"cached": True, "path": str(path)}
    log(f"{name}: training (cached afterwards in {path})")
    keras.utils.set_random_seed(0)
    start = time.perf_counter()
    model = MODELS[name].build(data, quick)
    seconds = time.perf_counter() - start
    cache.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial.keras")
    model.save(partial)
    partial.replace(path)
    return model, {"cached": False, "path": str(path), "train_s": seconds}


def cached_model(name: str, cache: Path = DEFAULT_CACHE) -> tuple[Any, Data]:
    """The full-size model `name` (trained and stored in `cache` first where it is not there)
    and its task's splits: what the benchmarks that measure one part of the pipeline on these
    models start from."""
    spec = MODELS[name]
    data = Data(spec.task(False), spec.inputs(False))
    model, _ = trained_model(name, data, False, cache.expanduser())
    return model, data


# -- by hand -----------------------------------------------------------------------------------
def first_output(outputs) -> np.ndarray:
    return np.asarray(outputs[0] if isinstance(outputs, list | tuple) else outputs)


def predict_each(runner: Callable[[], Any], buffer: np.ndarray, x: np.ndarray) -> np.ndarray:
    """A by-hand runner's outputs on every row of `x` at batch 1: the runner reads `buffer`
    (its sample) at each call, so each row is copied into it; the sample is put back."""
    sample = buffer.copy()
    outputs = []
    for i in range(len(x)):
        buffer[...] = x[i : i + 1]
        outputs.append(first_output(runner()))
    buffer[...] = sample
    return np.concatenate(outputs)


@contextlib.contextmanager
def quiet_nncf():
    """NNCF's progress bar (rich, on stdout) silenced."""
    import rich

    console = rich.get_console()
    was = console.quiet
    console.quiet = True
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        console.quiet = was


def ort_static_int8(model_bytes: bytes, calibration: np.ndarray, buffer: np.ndarray):
    """ONNX Runtime's quantize_static with its defaults (QDQ, int8 activations and weights,
    min-max calibration) but per-channel weights, as its docs recommend for convolutions."""
    import by_hand
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    name = onnx.load_from_string(model_bytes).graph.input[0].name

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.rows = iter(range(len(calibration)))

        def get_next(self):
            i = next(self.rows, None)
            return None if i is None else {name: calibration[i : i + 1]}

    with tempfile.TemporaryDirectory() as tmp:
        source, target = Path(tmp) / "model.onnx", Path(tmp) / "int8.onnx"
        source.write_bytes(model_bytes)
        # The defaults hold every float tensor of every calibration sample (105 MB a sample
        # on ResNet50 224: 13.5 GB for 128); CalibMaxIntermediateOutputs would bound it, but
        # onnxruntime 1.32 drops each group's data instead of merging its ranges.
        quantize_static(source, target, Reader(), quant_format=QuantFormat.QDQ, per_channel=True)
        quantized = target.read_bytes()
    return by_hand.onnxruntime_session(quantized, buffer)


def nncf_int8(model_bytes: bytes, calibration: np.ndarray, buffer: np.ndarray):
    """NNCF's quantize with its defaults on the ONNX export read by OpenVINO, compiled for
    the CPU with f32 inference precision for what stays float (its default here is bf16)."""
    import logging

    import nncf
    import openvino

    nncf.set_log_level(logging.ERROR)
    core = openvino.Core()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        path.write_bytes(model_bytes)
        model = core.read_model(path)
        dataset = nncf.Dataset([calibration[i : i + 1] for i in range(len(calibration))])
        with quiet_nncf():
            quantized = nncf.quantize(model, dataset)
        compiled = core.compile_model(quantized, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    output = compiled.output(0)
    return lambda: compiled(buffer)[output]


def litert_full_int8(model, calibration: np.ndarray, buffer: np.ndarray):
    """TFLite full int8 as the LiteRT docs show it: Optimize.DEFAULT and a representative
    dataset (float32 inputs and outputs), converted at the sample's shape."""
    import by_hand
    import tensorflow as tf

    fn = tf.function(lambda x: model(x))
    concrete = fn.get_concrete_function(tf.TensorSpec(buffer.shape, tf.as_dtype(buffer.dtype)))
    converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete], fn)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: (
        [calibration[i : i + 1]] for i in range(len(calibration))
    )
    return by_hand.litert_interpreter(model, buffer, content=converter.convert())


def by_hand_runtimes(model, buffer: np.ndarray, calibration: np.ndarray) -> tuple[dict, dict]:
    """Every runtime by hand that could be built, on `buffer`: ({label: runner},
    {label: {"kind", "build_s", "failed"?}}); one that fails is recorded, the run goes on."""
    import by_hand

    builders, onnx = by_hand.float32_builders(model, buffer)
    builders |= {
        "onnxruntime-int8": lambda: ort_static_int8(onnx(), calibration, buffer),
        "openvino-nncf-int8": lambda: nncf_int8(onnx(), calibration, buffer),
        "litert-int8": lambda: litert_full_int8(model, calibration, buffer),
    }
    runners, info = {}, {}
    for label, build in builders.items():
        log(f"  by hand: {label}")
        kind = "int8" if label in INT8_RUNTIMES else "fp32"
        start = time.perf_counter()
        try:
            runners[label] = build()
            info[label] = {"kind": kind}
        except Exception as exc:  # a runtime failing on this model is a result: say why
            info[label] = {"kind": kind, "failed": reason(exc)}
        info[label]["build_s"] = time.perf_counter() - start
    return runners, info


# -- one model, in a child process -------------------------------------------------------------
def accuracy_of(predictions: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(np.argmax(predictions, axis=-1) == labels))


def predict_opt(opt, x: np.ndarray) -> np.ndarray:
    return np.concatenate([first_output(opt(x[i : i + CHUNK])) for i in range(0, len(x), CHUNK)])


def warm_up() -> None:
    """optimize() with every precision once on a tiny model: the process's one-time costs
    (imports of the runtimes and quantizers, tf2onnx's first conversion) paid before the
    optimize() calls whose ratio is a target."""
    import keras

    import infertune

    x = np.random.default_rng(0).random((200, 8), dtype=np.float32)
    tiny = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8), keras.layers.Dense(2)])
    labels = tiny.predict(x[100:], verbose=0).argmax(axis=-1)
    accuracy = infertune.Accuracy((x[100:], labels), "accuracy", max_drop=MAX_DROP)
    options = dict(precision=PRECISIONS, calibration=x[:100], accuracy=accuracy)
    with infertune.optimize(tiny, x[:1], verbose=False, **options):
        pass


def candidate_rows(report) -> list[dict]:
    return [
        {
            "name": c.name,
            "status": c.status,
            "precision": c.precision,
            "reason": c.reason,
            "p50_ms": c.p50,
            "metric": c.metric,
            "reference_metric": c.reference_metric,
            "metric_drop": c.metric_drop,
            "metric_drop_bound": c.metric_drop_bound,
            "quantization": c.quantization,
            "kept_fp32": c.kept_fp32,
        }
        for c in report.candidates
    ]


def held_out(opt, data: Data, fp32_test: float) -> dict:
    metric = accuracy_of(predict_opt(opt, data.x("test")), data.y("test"))
    return {"test_metric": metric, "test_drop": fp32_test - metric}


def tune(model, sample: np.ndarray, options: dict, spec: Spec, rounds: int = 1) -> tuple[Any, dict]:
    """optimize() with reduced precision, timed; where the spec asks, optimize() in fp32
    alone on the same model too, after a warm-up, timed: (the last result with reduced
    precision, the numbers). With `rounds` above 1 (where the spec asks), the two are timed
    that many times each, in turns whose order alternates (precision first in odd rounds,
    fp32 alone first in even ones: a machine that drifts hits both alike), and the numbers
    are the medians of the rounds, each round's times kept beside them."""
    import infertune

    numbers: dict[str, Any] = {"optimize_fp32_s": None, "fp32_alone_choice": None}
    rounds = rounds if spec.time_fp32_alone else 1
    timed: list[dict[str, float]] = []
    opt = None
    if spec.time_fp32_alone:
        log("  warm-up optimize() on a tiny model")
        warm_up()
    kinds = ("precision", "fp32") if spec.time_fp32_alone else ("precision",)
    for index in range(rounds):
        times: dict[str, float] = {}
        suffix = f" (round {index + 1} of {rounds})" if rounds > 1 else ""
        for kind in kinds if index % 2 == 0 else kinds[::-1]:
            if kind == "precision":
                if opt is not None:
                    opt.close()
                log(f"  optimize(precision={PRECISIONS}){suffix}")
                start = time.perf_counter()
                opt = infertune.optimize(model, sample, **options)
                times["precision_s"] = time.perf_counter() - start
            else:
                log(f"  optimize() in fp32 alone{suffix}")
                start = time.perf_counter()
                with infertune.optimize(model, sample, verbose=False) as alone:
                    times["fp32_s"] = time.perf_counter() - start
                    numbers["fp32_alone_choice"] = alone.backend
        timed.append(times)
    numbers["optimize_s"] = float(np.median([t["precision_s"] for t in timed]))
    if spec.time_fp32_alone:
        numbers["optimize_fp32_s"] = float(np.median([t["fp32_s"] for t in timed]))
        numbers["optimize_rounds"] = timed
    return opt, numbers


def judge_by_hand(runners, info, buffer, model, data: Data, reference_gate) -> None:
    """Each by-hand runtime's first call checked: a float32 one's relative error against
    model(x) on the sample, an int8 one's verdict by the gate on the gate split, as
    infertune judges its candidates (a runtime that fails here is dropped, saying why)."""
    import infertune
    from infertune.accuracy import judge_metric

    expected = np.asarray(model(buffer))
    gate = infertune.Accuracy(data.batches("gate"), "accuracy", max_drop=MAX_DROP)
    for label in list(runners):
        try:
            if info[label]["kind"] == "fp32":
                info[label]["rel_err"] = relative_error(first_output(runners[label]()), expected)
                continue
            log(f"  by hand: {label} judged by the gate")
            predictions = predict_each(runners[label], buffer, data.x("gate"))
            verdict = judge_metric(gate, [data.y("gate")], [reference_gate], [predictions])
            info[label]["gate"] = {
                "passed": verdict.passed,
                "metric": verdict.metric,
                "drop": verdict.drop,
                "drop_bound": verdict.drop_bound,
                "reason": verdict.reason,
            }
        except Exception as exc:
            info[label]["failed"] = f"first call: {reason(exc)}"
            del runners[label]


def against_by_hand(opt, model, sample, data: Data, reference_gate, budget_s: float) -> dict:
    """The runtimes by hand built, checked and judged, then timed with `opt(sample)` in one
    interleaved run: by_hand, p50_ms, stats, the best fp32 and the best passing int8 by
    hand, and infertune's speed against each (their p50 over its)."""
    buffer = sample.copy()
    runners, info = by_hand_runtimes(model, buffer, data.x("calibration"))
    judge_by_hand(runners, info, buffer, model, data, reference_gate)
    cooldown = {label: ONNXRUNTIME_COOLDOWN_S for label in runners if "onnxruntime" in label}
    runners["infertune"] = lambda: opt(sample)
    cooldown["infertune"] = max(b.cooldown_s for b in opt.backends)
    log(f"  measuring {len(runners)} runners, interleaved")
    # race=False: the float32 runtimes, 2-5x behind int8, would leave the rounds after two
    # single calls, and the ratio against the best of them rest on a p50 of two calls.
    measured = measure_runners(runners, budget_s=budget_s, cooldown_s=cooldown, race=False)
    for label, why in measured.errors.items():
        if label in info:
            info[label]["failed"] = f"measurement: {why}"
    p50 = {label: stats.p50 for label, stats in measured.stats.items()}
    exact = {
        label: p50[label]
        for label in FP32_RUNTIMES
        if label in p50 and info[label].get("rel_err", 1.0) <= EXACT_RTOL
    }
    passing = {
        label: p50[label]
        for label in INT8_RUNTIMES
        if label in p50 and info[label].get("gate", {}).get("passed")
    }
    best_fp32 = min(exact, key=exact.get) if exact else None
    best_int8 = min(passing, key=passing.get) if passing else None
    ours = p50.get("infertune")
    return {
        "by_hand": info,
        "p50_ms": p50,
        "stats": {label: s.to_dict() for label, s in measured.stats.items()},
        "best_fp32": best_fp32,
        "best_int8": best_int8,
        "vs_best_fp32": exact[best_fp32] / ours if best_fp32 and ours else None,
        "vs_best_int8": passing[best_int8] / ours if best_int8 and ours else None,
    }


def accepted_on_test(model, sample, options, candidates, chosen, data, fp32_test, most):
    """Every reduced-precision candidate that passed the gate, on the test split: the chosen
    one through `opt`, each other (up to `most`) tuned again alone (backends=[name])."""
    import infertune

    accepted, retuned = {}, 0
    for c in candidates:
        if c["precision"] == "fp32" or c["status"] not in ("ok", "selected"):
            continue
        if c["status"] == "selected":
            accepted[c["name"]] = chosen
            continue
        if retuned >= most:
            continue
        retuned += 1
        log(f"  {c['name']} tuned alone, for its accuracy on the test split")
        try:
            with infertune.optimize(model, sample, backends=[c["name"]], **options) as alone:
                if alone.backend != c["name"]:
                    accepted[c["name"]] = {"error": f"tuned alone, {alone.backend} was chosen"}
                else:
                    accepted[c["name"]] = held_out(alone, data, fp32_test)
        except Exception as exc:
            accepted[c["name"]] = {"error": reason(exc)}
    return accepted


def run_model(
    name: str,
    quick: bool,
    cache: Path,
    budget_s: float,
    retune: int,
    verbose: bool = False,
    rounds: int = 1,
) -> dict:
    import tensorflow as tf

    import infertune
    from infertune.system.environment import precision_instructions

    spec = MODELS[name]
    data = Data(spec.task(quick), spec.inputs(quick))
    model, training = trained_model(name, data, quick, cache)
    sample = data.x("test")[:1].copy()
    model(sample)  # built and called once, as a user's model is before they tune it
    log(f"{name}: the fp32 model on the gate and test splits")
    reference_gate = model.predict(data.x("gate"), batch_size=CHUNK, verbose=0)
    fp32_gate = accuracy_of(reference_gate, data.y("gate"))
    fp32_test = accuracy_of(
        model.predict(data.x("test"), batch_size=CHUNK, verbose=0), data.y("test")
    )
    log(f"{name}: fp32 accuracy {fp32_test:.4f} on the test split, {fp32_gate:.4f} on the gate")
    options = dict(
        precision=PRECISIONS,
        calibration=tf.data.Dataset.from_tensor_slices(data.x("calibration")).batch(CHUNK),
        accuracy=infertune.Accuracy(data.batches("gate"), "accuracy", max_drop=MAX_DROP),
        verbose=verbose,
    )
    log(f"{name}: tuning")
    opt, tuning = tune(model, sample, options, spec, rounds)
    candidates = candidate_rows(opt.report)
    selected = next(c for c in candidates if c["name"] == opt.backend)
    log(f"{name}: chose {opt.backend}; its accuracy on the test split")
    chosen = held_out(opt, data, fp32_test)
    log(f"{name}: runtimes by hand")
    timed = against_by_hand(opt, model, sample, data, reference_gate, budget_s)
    accepted = accepted_on_test(model, sample, options, candidates, chosen, data, fp32_test, retune)
    fp32_candidates = {
        c["name"]: c["p50_ms"]
        for c in candidates
        if c["precision"] == "fp32" and c["status"] in ("ok", "selected") and c["p50_ms"]
    }
    fastest_fp32 = min(fp32_candidates, key=fp32_candidates.get) if fp32_candidates else None
    return {
        "model": name,
        "what": spec.what,
        "quick": quick,
        "input": describe_input(sample),
        "instructions": precision_instructions(),
        "training": training,
        "stated_accuracy": spec.stated,
        "fp32_gate_metric": fp32_gate,
        "fp32_test_metric": fp32_test,
        "selected": opt.backend,
        "selected_precision": selected["precision"],
        **chosen,
        "accepted_held_out": accepted,
        **tuning,
        "candidates": candidates,
        "fastest_fp32_candidate": fastest_fp32,
        "fastest_fp32_candidate_ms": fp32_candidates.get(fastest_fp32),
        "selected_ms_in_report": selected["p50_ms"],
        **timed,
        "report": opt.report.to_dict(),
    }


# -- report ------------------------------------------------------------------------------------
def rounds_note(r: dict) -> str:
    """Where optimize() was timed in several rounds: how many, and each round's ratio."""
    rounds = r.get("optimize_rounds") or []
    if len(rounds) < 2:
        return ""
    ratios = ", ".join(f"{t['precision_s'] / t['fp32_s']:.2f}x" for t in rounds)
    return f"; medians of {len(rounds)} rounds in turns, each round's ratio {ratios}"


def points(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.1f} pts"


def ratio_cell(r: dict, best: str, versus: str) -> tuple[str, str]:
    label = r[best]
    if label is None:
        return "none", "-"
    return f"{label} {milliseconds(r['p50_ms'][label])}", f"{r[versus]:.2f}x"


def markdown(results: list[dict]) -> str:
    head = (
        "| model | CPU int8/bf16 instructions | fp32 accuracy | infertune chose | its accuracy "
        "(drop) | optimize() s | infertune ms | best fp32 by hand, ms | vs fp32 | best int8 by "
        "hand passing the gate, ms | vs int8 | targets |"
    )
    lines = [head, "|---" * 12 + "|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['model']} | | | {r['error']} |" + " |" * 8)
            continue
        fp32, vs_fp32 = ratio_cell(r, "best_fp32", "vs_best_fp32")
        int8, vs_int8 = ratio_cell(r, "best_int8", "vs_best_int8")
        optimize = f"{r['optimize_s']:.0f}"
        if r["optimize_fp32_s"]:
            optimize += f" ({r['optimize_s'] / r['optimize_fp32_s']:.2f}x fp32 alone)"
        ours = r["p50_ms"].get("infertune")
        lines.append(
            f"| {r['model']} | {', '.join(r['instructions']) or 'none'} | "
            f"{r['fp32_test_metric']:.4f} | {r['selected']} ({r['selected_precision']}) | "
            f"{r['test_metric']:.4f} ({points(r['test_drop'])}) | {optimize} | "
            f"{'-' if ours is None else milliseconds(ours)} | {fp32} | {vs_fp32} | {int8} | "
            f"{vs_int8} | {r['verdict']} |"
        )
    return "\n".join(lines)


def by_hand_cell(r: dict, label: str) -> str:
    info = r["by_hand"].get(label, {})
    if "failed" in info:
        return "failed"
    value = r["p50_ms"].get(label)
    cell = "-" if value is None else milliseconds(value)
    if "gate" in info:
        gate = info["gate"]
        verdict = "passes" if gate["passed"] else "fails"
        cell += f" ({verdict}: {gate['metric']:.4f}, drop {points(gate['drop'])})"
    elif info.get("rel_err", 0.0) > EXACT_RTOL:
        cell += f" (err {info['rel_err']:.0e})"
    return cell


def by_hand_table(results: list[dict]) -> str:
    columns = [*FP32_RUNTIMES, *INT8_RUNTIMES, "infertune"]
    lines = ["| model | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for r in results:
        if "error" in r:
            continue
        cells = [by_hand_cell(r, label) for label in columns[:-1]]
        ours = r["p50_ms"].get("infertune")
        cells.append("-" if ours is None else milliseconds(ours))
        lines.append(f"| {r['model']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fates(results: list[dict]) -> str:
    """Every reduced-precision candidate's verdict, its accuracy on the test split where it
    was accepted, and why each by-hand runtime or candidate failed."""
    lines = []
    for r in results:
        if "error" in r:
            lines.append(f"- **{r['model']}**: {r['error']}")
            continue
        training = r["training"]
        trained = (
            "from the cache" if training["cached"] else f"trained in {training['train_s']:.0f} s"
        )
        lines.append(
            f"- **{r['model']}** ({r['what']}; {trained}): fp32 accuracy "
            f"{r['fp32_test_metric']:.4f} on the test split (stated: {r['stated_accuracy']:.2f}), "
            f"{r['fp32_gate_metric']:.4f} on the gate"
        )
        unavailable = [c["name"] for c in r["candidates"] if c["status"] == "unavailable"]
        for c in r["candidates"]:
            if c["status"] == "unavailable" or (
                c["precision"] == "fp32" and c["status"] not in ("failed", "timeout", "mismatch")
            ):
                continue
            words = f"  - {c['name']} ({c['precision']}) {c['status']}"
            if c["metric"] is not None:
                words += (
                    f": gate {c['metric']:.4f}, drop {points(c['metric_drop'])}, bound "
                    f"{points(c['metric_drop_bound'])}"
                )
            held = r["accepted_held_out"].get(c["name"])
            if held:
                words += (
                    f"; test {held['test_metric']:.4f}, drop {points(held['test_drop'])}"
                    if "error" not in held
                    else f"; test split: {held['error']}"
                )
            if c["quantization"]:
                words += f"; {c['quantization']}"
            if c["status"] not in ("ok", "selected"):
                words += f": {c['reason']}"
            lines.append(words)
        if unavailable:
            lines.append(f"  - unavailable here: {', '.join(unavailable)}")
        for label, info in r["by_hand"].items():
            if "failed" in info:
                lines.append(f"  - by hand, {label} failed: {info['failed']}")
            elif "gate" in info and not info["gate"]["passed"]:
                lines.append(f"  - by hand, {label} fails the gate: {info['gate']['reason']}")
    return "\n".join(lines)


def check_model(r: dict) -> list[tuple[bool, str]]:
    """One model's targets, (met, words) each."""
    from infertune.system.environment import (
        BF16_FLAGS,
        INT8_DOT_FLAGS,
    )

    name, spec = r["model"], MODELS[r["model"]]
    if "error" in r:
        return [(False, f"{name}: {r['error']}")]
    checks = [
        (
            r["fp32_test_metric"] >= spec.stated,
            f"{name}: fp32 accuracy {r['fp32_test_metric']:.4f} on the test split "
            f"(stated: at least {spec.stated:.2f})",
        )
    ]
    vnni = any(flag in r["instructions"] for flag in INT8_DOT_FLAGS)
    bf16 = any(flag in r["instructions"] for flag in BF16_FLAGS)
    if vnni and spec.vs_fp32 is not None:
        ratio = r["vs_best_fp32"]
        checks.append(
            (
                ratio is not None and ratio >= spec.vs_fp32,
                f"{name}: {'-' if ratio is None else f'{ratio:.2f}'}x the best fp32 by hand "
                f"{r['best_fp32']} (>= {spec.vs_fp32}x on a CPU with VNNI)",
            )
        )
    if r["best_int8"] is None:
        checks.append((True, f"{name}: no int8 by hand passes the gate"))
    else:
        ratio = r["vs_best_int8"]
        checks.append(
            (
                ratio is not None and ratio >= 1 / TOO_SLOW,
                f"{name}: {'-' if ratio is None else f'{ratio:.2f}'}x the best int8 by hand "
                f"passing the gate, {r['best_int8']} (>= {1 / TOO_SLOW:.2f})",
            )
        )
    for candidate, held in r["accepted_held_out"].items():
        if "error" in held:
            checks.append((False, f"{name}: {candidate} on the test split: {held['error']}"))
            continue
        checks.append(
            (
                held["test_drop"] <= MAX_DROP + HELD_OUT_SLACK + 1e-9,
                f"{name}: {candidate} accepted, its drop on the test split "
                f"{points(held['test_drop'])} (<= {points(MAX_DROP + HELD_OUT_SLACK)})",
            )
        )
    if not vnni and not bf16 and r["selected_precision"] != "fp32":
        ours, theirs = r["selected_ms_in_report"], r["fastest_fp32_candidate_ms"]
        checks.append(
            (
                theirs is None or (ours is not None and ours <= theirs),
                f"{name}: no VNNI or bf16 units: {r['selected']} {ours} ms against the fastest "
                f"fp32 candidate {r['fastest_fp32_candidate']} {theirs} ms (not slower)",
            )
        )
    if r["optimize_fp32_s"]:
        ratio = r["optimize_s"] / r["optimize_fp32_s"]
        checks.append(
            (
                ratio <= OPTIMIZE_RATIO,
                f"{name}: optimize() with precision={PRECISIONS} {r['optimize_s']:.1f} s, in fp32 "
                f"alone {r['optimize_fp32_s']:.1f} s: {ratio:.2f}x (<= {OPTIMIZE_RATIO}x)"
                + rounds_note(r),
            )
        )
    return checks


def check_targets(results: list[dict], quick: bool) -> list[str]:
    """Every model's targets as PASS/FAIL lines (under --quick, INFO: tiny models, not
    checked); each result gets its `verdict` cell for the table."""
    lines = []
    for r in results:
        checks = check_model(r)
        missed = [words.split(": ", 1)[1] for ok, words in checks if not ok]
        r["verdict"] = "met" if not missed else "missed: " + "; ".join(missed)
        if quick and "error" not in r:
            r["verdict"] = "(quick: not checked)"
        for ok, words in checks:
            lines.append(
                f"{'INFO' if quick and 'error' not in r else 'PASS' if ok else 'FAIL'} {words}"
            )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help=f"comma-separated names; default all: {list(MODELS)}")
    parser.add_argument(
        "--quick", action="store_true", help="tiny versions of every model: a smoke test"
    )
    parser.add_argument(
        "--cache", type=Path, default=DEFAULT_CACHE, help="where the trained models are kept"
    )
    parser.add_argument(
        "--out", type=Path, help=f"default docs/benchmarks/precision; with --quick {QUICK_OUT}"
    )
    parser.add_argument("--budget", type=float, default=None, help="measurement s per model")
    parser.add_argument(
        "--chosen-only",
        action="store_true",
        help="the test split for the chosen candidate only, not every accepted one (--quick: "
        "one other, on the first model)",
    )
    parser.add_argument(
        "--model-timeout", type=float, default=3600.0, help="s one model may take in all"
    )
    parser.add_argument(
        "--verbose", action="store_true", help="optimize()'s progress lines, with reduced precision"
    )
    parser.add_argument(
        "--tuning-rounds",
        type=int,
        default=None,
        help="times optimize() with reduced precision and in fp32 alone are each timed, in "
        "turns, on ResNet50 224 (the ratio target is their medians'); default 3, 1 with --quick",
    )
    parser.add_argument("--retune", type=int, default=99, help=argparse.SUPPRESS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tuning_rounds is None:
        args.tuning_rounds = 1 if args.quick else TUNING_ROUNDS
    if args.tuning_rounds < 1:
        parser.error(f"--tuning-rounds must be at least 1, not {args.tuning_rounds}")
    budget = args.budget if args.budget is not None else 2.0 if args.quick else 20.0
    cache = args.cache.expanduser()
    if args.child:
        result = run_model(
            args.child, args.quick, cache, budget, args.retune, args.verbose, args.tuning_rounds
        )
        args.child_out.write_text(json.dumps(result, default=str), encoding="utf-8")
        return 0
    names = [n for n in args.models.split(",") if n] if args.models else list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; known: {list(MODELS)}")
    out = args.out or (QUICK_OUT if args.quick else Path("docs/benchmarks/precision"))
    results = []
    for name in names:
        log(f"{name} ({len(results) + 1} of {len(names)})")
        # How many accepted candidates besides the chosen one are tuned again alone for the
        # test split: all of them, none with --chosen-only, one in all with --quick.
        retune = 0 if args.chosen_only or (args.quick and results) else 1 if args.quick else 99
        child_args = ["--cache", str(cache), "--budget", str(budget), "--retune", str(retune)]
        child_args += ["--verbose"] * args.verbose
        child_args += ["--tuning-rounds", str(args.tuning_rounds)]
        results.append(
            run_in_child(__file__, name, child_args + ["--quick"] * args.quick, args.model_timeout)
        )
    from infertune.system.environment import collect_environment

    env = collect_environment()
    targets = check_targets(results, args.quick)
    text = "\n\n".join(
        [
            f"Accuracy: on the held-out test split; the gate: the gate split, max_drop="
            f"{MAX_DROP:g} with infertune's 95% bootstrap bound. Median ms per call (p50) at "
            "batch 1, every runtime timed in one interleaved run per model (none leaving it); "
            "vs: the by-hand "
            "runtime's p50 over infertune's. Best fp32 by hand: the fastest within 1e-3 of "
            "model(x); best int8 by hand: the fastest of ONNX Runtime quantize_static, NNCF "
            "and TFLite full int8 (each library's defaults) that passes the same gate."
            + (" --quick: tiny models, few training steps; targets not checked." * args.quick),
            f"Machine: {machine_description(env)}",
            markdown(results),
            "Every runtime by hand, ms (the int8 ones with their gate verdict):\n\n"
            + by_hand_table(results),
            "Reduced-precision candidates and failures:\n\n" + fates(results),
            "\n".join(targets),
        ]
    )
    print(text)
    write_results(out, text, env, results, targets)
    failed = any("error" in r for r in results) or any(t.startswith("FAIL") for t in targets)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
