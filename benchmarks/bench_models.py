"""The benchmarks' models and data; a library, not a script.

What more than one script uses:

* the precision benchmark's models (benchmarks/precision.py), trained on a real task and
  cached as .keras files (`cached_model(name)`, `PRECISION_MODELS`), with their tasks split
  four ways (training, calibration, gate, test: `Data`), and what the precision studies
  share about them (`target_of`, `ranked_layers`, `openvino_outputs`); gpu_check.py
  packages two of them;
* the production benchmark's models (benchmarks/production.py): the kinds of Keras models
  services run, at full size or --quick's (`PRODUCTION_MODELS`, `FULL`, `QUICK`), which the
  dict-input study times too;
* the shapes benchmark's models (benchmarks/shapes.py), whose requests come in many lengths
  or batch sizes, and the distributions their requests are drawn from
  (`SHAPES_DISTRIBUTIONS`): a text encoder and an audio model that take their padding
  masks, keras-hub's BertBackbone, a text encoder padding is not exact for, MobileNetV2 at
  many batch sizes.

A model only one script builds is built there. Imported as `bench_models` by the scripts
beside it and as `benchmarks.bench_models` by the studies; TensorFlow, Keras and the
runtimes are imported inside the functions that need them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

if __package__:  # benchmarks.bench_models, imported by a study
    from . import harness
else:  # bench_models, imported by a script beside it
    import harness

DEFAULT_CACHE = Path("~/.cache/infertune-bench/precision")  # the trained precision models
CALIBRATION = 128  # samples in calibration= (infertune's quantizers take 32-128 of them)
CHUNK = 32  # the batch the models are run at on whole splits (training, metrics)
MAX_DROP = 0.01  # the precision benchmark's gate: at most one point of accuracy lost


def log(message: str) -> None:
    harness.log("precision", message)


# -- the precision benchmark's tasks --------------------------------------------------------------
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


# -- the precision benchmark's models -------------------------------------------------------------
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
    """A model of the precision benchmark: its task, its inputs, how it is built and trained."""

    what: str
    task: Callable[[bool], Splits]
    inputs: Callable[[bool], Callable[[np.ndarray], np.ndarray]]  # quick -> raw -> inputs
    build: Callable[[Data, bool], Any]
    stated: float  # the fp32 accuracy on the test split it must reach (full run)
    vs_fp32: float | None = None  # speed target against the best fp32 by hand, VNNI CPU
    time_fp32_alone: bool = False  # optimize() in fp32 alone too (precision.py's OPTIMIZE_RATIO)
    version: int = 1  # of its model, data or training: the cache is keyed by it; bump on change


def side(quick: bool) -> int:
    return 32 if quick else 224


PRECISION_MODELS: dict[str, Spec] = {
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

    path = cache / f"{name}{'-quick' if quick else ''}-v{PRECISION_MODELS[name].version}.keras"
    if path.exists():
        log(f"{name}: trained model from the cache, {path}")
        return keras.models.load_model(path), {"cached": True, "path": str(path)}
    log(f"{name}: training (cached afterwards in {path})")
    keras.utils.set_random_seed(0)
    start = time.perf_counter()
    model = PRECISION_MODELS[name].build(data, quick)
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
    spec = PRECISION_MODELS[name]
    data = Data(spec.task(False), spec.inputs(False))
    model, _ = trained_model(name, data, False, cache.expanduser())
    return model, data


def accuracy_of(predictions: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(np.argmax(predictions, axis=-1) == labels))


# -- what the precision studies share about these models ------------------------------------------
def target_of(model, sample):
    """The Target optimize(model, sample) builds: what every conversion starts from."""
    from infertune.model.inputs import build_signature
    from infertune.model.source import load_model
    from infertune.model.target import Target

    source = load_model(model)
    signature, flat = build_signature(sample, source.declared_inputs, source.default_float)
    reference, structure = source.call_flat(signature, flat)
    return Target(source, signature, structure, [r.dtype for r in reference])


def ranked_layers(target) -> list[str]:
    """The layers (name scopes) in the order infertune's search keeps them in float32
    (pipeline/precision.py `ranking_inputs`, backends/onnxruntime/quantize.py `layer_errors`)."""
    from infertune.pipeline.precision import ranking_inputs
    from infertune.precision.layers import layer_errors

    errors = layer_errors(*ranking_inputs(target))
    return sorted(errors, key=lambda scope: -errors[scope])


def openvino_outputs(compiled, data: Data, split: str) -> np.ndarray:
    """A compiled OpenVINO model's first output on a whole split, in batches of CHUNK."""
    xs = data.x(split)
    return np.concatenate([compiled(xs[i : i + CHUNK])[0] for i in range(0, len(xs), CHUNK)])


# -- the production benchmark's models ------------------------------------------------------------
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


def uint8_images(rng: np.random.Generator, batch: int, sizes: Sizes) -> np.ndarray:
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


def vocabulary_ids(rng: np.random.Generator, batch: int, sizes: Sizes) -> np.ndarray:
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


PRODUCTION_MODELS: dict[str, ProductionModel] = {
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
        "uint8 image: Resizing, Rescaling, CNN (reference: traced)", image, uint8_images, "traced"
    ),
    "fnet": ProductionModel(
        "token ids: Fourier mixing (FFT2D), feed-forward", fnet, vocabulary_ids
    ),
}


# -- the shapes benchmark's models and traffic -----------------------------------------------------
# benchmarks/shapes.py: models whose requests come in many shapes (a text's length, an audio
# clip's frames, a batch's size), each at full size and at --quick's, and the distributions
# their requests are drawn from.
TEXT_VOCABULARY = 30_522  # BERT's WordPiece vocabulary
MEL_FEATURES = 80  # the audio model's features per frame (log-mel bins)


@dataclass(frozen=True)
class LogNormal:
    """Sizes drawn log-normal (most near the median, a long tail), rounded and clipped to
    [low, high]: the lengths of real queries, documents or clips."""

    median: float
    sigma: float
    low: int
    high: int

    def draw(self, rng: np.random.Generator, count: int) -> np.ndarray:
        drawn = np.round(rng.lognormal(np.log(self.median), self.sigma, count))
        return np.clip(drawn, self.low, self.high).astype(int)

    def words(self) -> str:
        return f"log-normal, median {self.median:g}, sigma {self.sigma:g}, {self.low}..{self.high}"


@dataclass(frozen=True)
class LogUniform:
    """Sizes drawn log-uniform over [low, high] (as many of 1-2 as of 16-32): a batch size."""

    low: int
    high: int

    @property
    def median(self) -> int:
        return int(round(np.sqrt(self.low * (self.high + 1))))

    def draw(self, rng: np.random.Generator, count: int) -> np.ndarray:
        drawn = np.floor(np.exp(rng.uniform(np.log(self.low), np.log(self.high + 1), count)))
        return np.clip(drawn, self.low, self.high).astype(int)

    def words(self) -> str:
        return f"log-uniform, {self.low}..{self.high}"


# The length distributions (full run, --quick). --quick's stay short and clear of the tiny
# models' widths.
SHAPES_DISTRIBUTIONS: dict[str, tuple[LogNormal | LogUniform, LogNormal | LogUniform]] = {
    "queries": (LogNormal(40, 0.7, 4, 256), LogNormal(12, 0.6, 3, 64)),
    "documents": (LogNormal(200, 0.5, 16, 512), LogNormal(40, 0.5, 8, 128)),
    "frames": (LogNormal(300, 0.5, 20, 1000), LogNormal(40, 0.5, 8, 128)),
    "batches": (LogUniform(1, 32), LogUniform(1, 8)),
}


def _masked_blocks(x, keys, width: int, heads: int, ff: int, blocks: int):
    """`blocks` post-norm encoder blocks, every attention given the key mask `keys` (batch,
    1, length): attention, feed-forward with tanh GELU (which tf2onnx exports)."""
    from keras import layers, ops

    for _ in range(blocks):
        attended = layers.MultiHeadAttention(heads, width // heads)(x, x, attention_mask=keys)
        x = layers.LayerNormalization(epsilon=1e-12)(layers.Add()([x, attended]))
        hidden = ops.gelu(layers.Dense(ff)(x), approximate=True)
        x = layers.LayerNormalization(epsilon=1e-12)(layers.Add()([x, layers.Dense(width)(hidden)]))
    return x


def _masked_mean(x, mask):
    """The mean over the positions the mask (batch, length) marks real."""
    from keras import ops

    weights = ops.expand_dims(ops.cast(mask, "float32"), -1)
    return ops.sum(x * weights, axis=1) / ops.maximum(ops.sum(weights, axis=1), 1.0)


def masked_text_encoder(quick: bool):
    """A BERT-sized text encoder that takes its padding mask as keras-hub models do (the
    structure of tests/traffic_models.py `masked_encoder`): `token_ids` and `padding_mask`,
    both (batch, length) int32 of any length; token embedding (BERT's vocabulary) plus a
    learned position embedding over positions up to the longest document, indexed by
    ops.arange(length); 4 blocks of width 768, 12 heads, feed-forward 3072, every attention
    given the mask (keys masked). Outputs the sequence (batch, length, 768) and its masked
    mean (batch, 768). --quick: width 32, 2 heads, feed-forward 64, 2 blocks, vocabulary 1000."""
    import keras
    from keras import layers, ops

    vocabulary, width, heads, ff, blocks = text_encoder_sizes(quick)
    positions = SHAPES_DISTRIBUTIONS["documents"][int(quick)].high

    class PositionEmbedding(layers.Layer):
        """A learned embedding of each position, ops.arange(length) indexing its table."""

        def build(self, input_shape):
            self.table = self.add_weight(
                shape=(positions, width), initializer="random_normal", name="positions"
            )

        def call(self, ids):
            index = ops.arange(ops.shape(ids)[1])
            return ops.expand_dims(ops.take(self.table, index, axis=0), 0)

    keras.utils.set_random_seed(0)
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    mask = keras.Input((None,), dtype="int32", name="padding_mask")
    x = layers.Add()([layers.Embedding(vocabulary, width)(ids), PositionEmbedding()(ids)])
    x = layers.LayerNormalization(epsilon=1e-12)(x)
    keys = ops.expand_dims(ops.cast(mask, "bool"), 1)  # (batch, 1, length): keys masked
    x = _masked_blocks(x, keys, width, heads, ff, blocks)
    outputs = {"sequence": x, "pooled": _masked_mean(x, mask)}
    return keras.Model({"token_ids": ids, "padding_mask": mask}, outputs, name="encoder")


def text_encoder_sizes(quick: bool) -> tuple[int, int, int, int, int]:
    """The BERT-sized text encoders' vocabulary, width, heads, feed-forward width and blocks
    (masked_text_encoder's and keras_hub_bert's); --quick's tiny ones."""
    return (1000, 32, 2, 64, 2) if quick else (TEXT_VOCABULARY, 768, 12, 3072, 4)


def text_vocabulary(quick: bool) -> int:
    return text_encoder_sizes(quick)[0]


def token_request(rng: np.random.Generator, length: int, quick: bool, mask: bool = True):
    """One request of `length` tokens (ids 1.. of the vocabulary, every position real): a
    dict with its padding mask, or the ids alone (`mask` False)."""
    ids = rng.integers(1, text_vocabulary(quick), (1, length)).astype(np.int32)
    if not mask:
        return ids
    return {"token_ids": ids, "padding_mask": np.ones((1, length), np.int32)}


def keras_hub_bert(quick: bool):
    """keras-hub's BertBackbone, the class BERT presets load into, with random weights (the
    presets come from a model hub): `token_ids`, `segment_ids` and `padding_mask`, (batch,
    length) int32 each, the mask given to every attention layer; 4 layers of width 768, 12
    heads, feed-forward 3072, BERT's vocabulary, positions up to the longest document.
    Outputs `sequence_output` (batch, length, 768) and `pooled_output`, the first token's
    through a dense layer (batch, 768). --quick: width 32, 2 heads, feed-forward 64, 2
    layers, vocabulary 1000."""
    import keras
    import keras_hub

    vocabulary, width, heads, ff, blocks = text_encoder_sizes(quick)
    keras.utils.set_random_seed(0)
    return keras_hub.models.BertBackbone(
        vocabulary_size=vocabulary, num_layers=blocks, num_heads=heads, hidden_dim=width,
        intermediate_dim=ff,
        max_sequence_length=SHAPES_DISTRIBUTIONS["documents"][int(quick)].high,
    )  # fmt: skip


def segment_pair_request(rng: np.random.Generator, length: int, quick: bool):
    """One request for `keras_hub_bert`: `length` token ids as BERT's preprocessor packs a
    pair of segments (the first half segment 0, the rest segment 1), every position real."""
    segments = np.zeros((1, length), np.int32)
    segments[:, length // 2 :] = 1
    return {
        "token_ids": rng.integers(1, text_vocabulary(quick), (1, length)).astype(np.int32),
        "segment_ids": segments,
        "padding_mask": np.ones((1, length), np.int32),
    }


def masked_audio_encoder(quick: bool):
    """A model over a variable number of frames: `features` (batch, frames, 80) float32 and
    `frame_mask` (batch, frames) int32; three Conv1D layers (padding="same", ReLU), each
    followed by multiplying by the mask (padded frames stay zero, so padding is exact), then
    2 blocks of width 256 (4 heads, feed-forward 512) whose attention is given the mask, and
    the masked mean (batch, 256). --quick: width 32, 2 heads, 1 block."""
    import keras
    from keras import layers, ops

    width, heads, ff, blocks = (32, 2, 64, 1) if quick else (256, 4, 512, 2)
    keras.utils.set_random_seed(0)
    features = keras.Input((None, MEL_FEATURES), dtype="float32", name="features")
    mask = keras.Input((None,), dtype="int32", name="frame_mask")
    frames = ops.expand_dims(ops.cast(mask, "float32"), -1)
    x = features
    for filters in (width // 2, width, width):
        x = layers.Conv1D(filters, 5, padding="same", activation="relu")(x) * frames
    keys = ops.expand_dims(ops.cast(mask, "bool"), 1)
    x = _masked_blocks(x, keys, width, heads, ff, blocks)
    return keras.Model({"features": features, "frame_mask": mask}, _masked_mean(x, mask),
                       name="audio")  # fmt: skip


def frame_request(rng: np.random.Generator, frames: int, quick: bool):
    """One clip of `frames` frames of features (standard normal), every frame real."""
    features = rng.standard_normal((1, frames, MEL_FEATURES)).astype(np.float32)
    return {"features": features, "frame_mask": np.ones((1, frames), np.int32)}


def lossy_text_encoder(quick: bool):
    """A model padding is not exact for: token ids only, Embedding(mask_zero=True),
    residuals written `x + a` (Keras 3 drops the implicit mask after the first block, so
    padded positions reach the attention and the pooling), width 256, 4 heads, 4 blocks,
    GlobalAveragePooling1D. --quick: width 32, 2 heads, 2 blocks."""
    import keras
    from keras import layers

    width, heads, blocks = (32, 2, 2) if quick else (256, 4, 4)
    keras.utils.set_random_seed(0)
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    x = layers.Embedding(text_vocabulary(quick), width, mask_zero=True)(ids)
    for _ in range(blocks):
        x = x + layers.MultiHeadAttention(heads, width // heads)(x, x)
        x = layers.LayerNormalization()(x)
    return keras.Model(ids, layers.GlobalAveragePooling1D()(x), name="lossy")


def batch_mobilenet_v2(quick: bool):
    """keras.applications.MobileNetV2 at 96x96 (weights=None): a fixed-shape model whose
    requests differ only in their batch size. --quick: 32x32, alpha 0.35."""
    import keras

    keras.utils.set_random_seed(0)
    side, alpha = (32, 0.35) if quick else (96, 1.0)
    return keras.applications.MobileNetV2(input_shape=(side, side, 3), alpha=alpha, weights=None)


def image_requests(rng: np.random.Generator, sizes, quick: bool) -> list[np.ndarray]:
    """Requests of `sizes[i]` images each, in [-1, 1] at the batch model's side: views of one
    pool drawn from `rng` (no copy per request)."""
    side = 32 if quick else 96
    pool = rng.uniform(-1, 1, (int(max(sizes)), side, side, 3)).astype(np.float32)
    return [pool[: int(n)] for n in sizes]
