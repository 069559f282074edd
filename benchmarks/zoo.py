"""The model zoo: infertune on keras.applications families and on models of variable shape.

Image models (random weights, nothing to download, small resolutions: on 2 shared cores 9 of
the 17 models took 24 minutes, the whole zoo about an hour) and models whose non-batch
dimensions vary: a text model (Embedding + Conv1D) and a GRU over a variable length, a
transformer encoder taking a dict {token ids, padding mask} over a variable length, a CNN
with free height and width.

For each model, in a child process of its own (a crash or a hang costs that model only, and
its memory goes back to the OS afterwards):

* `infertune.optimize(model, x)`, timed, and every candidate's fate from its report;
* the callable's output error against `model(x)` (relative norm) at batch 1 (the sample),
  batch 4, and for the variable models at two other lengths or image sizes;
* the runtimes written by hand with default settings (harness.by_hand_builders): tf.function,
  tf.function with XLA, ONNX Runtime on a tf2onnx export, OpenVINO f32, LiteRT; a runtime
  that fails on the model is recorded with its reason, the run goes on;
* those that ran, and infertune's callable, timed in one interleaved run
  (harness.against_by_hand).

Targets (exit code 1 if one fails): no exact (fp32) candidate rejected as `mismatch`; the
callable within rtol=1e-3 of `model(x)` at every checked batch size, length and size;
infertune within 5% of the fastest exact by-hand runtime on every model, and faster than it
on most (checked from three models up).

    python benchmarks/zoo.py [--models resnet50,gru-varlen | --quick] [--out DIR]

Results: docs/benchmarks/zoo/<date>/ (--out; with --quick a temporary folder).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import harness
import numpy as np
from harness import EXACT_RTOL, flat_outputs, reason

BENCHMARK = "zoo"
CHECK_BATCH = 4  # the other batch size the callable is checked at (the sample's is 1)
TOO_SLOW = 1.05  # infertune may be at most 5% slower than the fastest exact by-hand runtime


# -- inputs ------------------------------------------------------------------------------------
def images(rng: np.random.Generator, batch: int, size) -> np.ndarray:
    """Image-like values in 0..255, `size` a side or (height, width). The same for every
    family: EfficientNet, ConvNeXt and MobileNetV3 preprocess inside the model; the others
    (ResNet, VGG, NASNet...) get larger activations than after their preprocess_input, the
    harder case for verification (where element-wise checks rejected exact runtimes)."""
    height, width = (size, size) if isinstance(size, int) else size
    return rng.uniform(0, 255, (batch, height, width, 3)).astype(np.float32)


VOCAB = 2000


def token_ids(rng: np.random.Generator, batch: int, length: int) -> np.ndarray:
    return rng.integers(0, VOCAB, (batch, length)).astype(np.int32)


GRU_FEATURES = 32


def features(rng: np.random.Generator, batch: int, length: int) -> np.ndarray:
    return rng.standard_normal((batch, length, GRU_FEATURES)).astype(np.float32)


def padded_tokens(rng: np.random.Generator, batch: int, length: int) -> dict[str, np.ndarray]:
    """Token ids and padding mask: each sequence holds 1..length tokens, ids 0 past its end."""
    valid = rng.integers(1, length + 1, batch)
    valid[0] = max(1, (3 * length) // 4)  # the sample's first row: a quarter is padding
    mask = (np.arange(length)[None, :] < valid[:, None]).astype(np.int32)
    ids = rng.integers(1, VOCAB, (batch, length)).astype(np.int32) * mask
    return {"token_ids": ids, "padding_mask": mask}


# -- models ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ZooModel:
    """A model of the zoo: how to build it and draw its inputs at a batch size and a size."""

    family: str
    build: Callable[[], Any]
    draw: Callable[[np.random.Generator, int, Any], Any]  # (rng, batch, size) -> model input
    size: Any  # the sample's image side, (height, width) or sequence length
    other_sizes: tuple = ()  # sizes the callable is also checked at (free dimensions only)
    varies: str = "size"  # what other_sizes are, in the results: "length" or "size"
    quick: bool = False  # part of --quick: small models and every model of variable shape


def application(name: str, side: int, **kwargs) -> Callable[[], Any]:
    """keras.applications.<name> with random weights at side x side, logits out (with random
    weights a softmax is uniform to float precision, and any output would match it)."""

    def build():
        import keras

        return getattr(keras.applications, name)(
            weights=None, input_shape=(side, side, 3), classifier_activation=None, **kwargs
        )

    return build


def regnetx_002():
    """RegNetX-200MF, as Keras 2's keras.applications.regnet built it (Keras 3 dropped the
    RegNet family): a stem, four stages of X blocks (grouped 3x3 convolutions, group width
    8) of depths 1, 1, 4, 7 and widths 24, 56, 152, 368, pooling and logits."""
    import keras
    from keras import layers

    def conv_bn(x, filters, kernel, strides=1, groups=1, relu=True):
        x = layers.Conv2D(filters, kernel, strides, "same", groups=groups, use_bias=False)(x)
        x = layers.BatchNormalization(momentum=0.9, epsilon=1e-5)(x)
        return layers.ReLU()(x) if relu else x

    inputs = keras.Input((64, 64, 3))
    x = conv_bn(layers.Rescaling(1 / 255)(inputs), 32, 3, strides=2)
    for depth, width in zip((1, 1, 4, 7), (24, 56, 152, 368)):
        for block in range(depth):
            strides = 2 if block == 0 else 1
            skip = x if block else conv_bn(x, width, 1, strides, relu=False)
            y = conv_bn(x, width, 1)
            y = conv_bn(y, width, 3, strides, groups=width // 8)
            y = conv_bn(y, width, 1, relu=False)
            x = layers.ReLU()(y + skip)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(1000)(x), name="regnetx002")


def text_conv1d():
    """Token ids of any length -> Embedding 64 -> two Conv1D 128 -> max over time -> 5 logits."""
    import keras
    from keras import layers

    tokens = keras.Input((None,), dtype="int32", name="token_ids")
    x = layers.Embedding(VOCAB, 64)(tokens)
    x = layers.Conv1D(128, 5, padding="same", activation="relu")(x)
    x = layers.Conv1D(128, 5, padding="same", activation="relu")(x)
    x = layers.GlobalMaxPooling1D()(x)
    return keras.Model(tokens, layers.Dense(5)(x), name="text_conv1d")


def gru_varlen():
    """A sequence of 32 features of any length -> GRU 128 -> 10 outputs."""
    import keras
    from keras import layers

    sequence = keras.Input((None, GRU_FEATURES))
    return keras.Model(sequence, layers.Dense(10)(layers.GRU(128)(sequence)), name="gru_varlen")


def transformer_varlen(dim: int = 128, heads: int = 4, blocks: int = 2, max_length: int = 512):
    """A BERT-like encoder: dict inputs {token_ids, padding_mask} of any length, learned
    positions, `blocks` encoder blocks with the padding mask on attention, masked mean
    pooling, 3 logits."""
    import keras
    from keras import layers, ops

    class PositionEmbedding(layers.Layer):
        """Learned positions 0..length-1 for a sequence of any length up to max_length."""

        def build(self, input_shape):
            self.table = self.add_weight(shape=(max_length, dim), initializer="glorot_uniform")

        def call(self, x):
            return ops.take(self.table, ops.arange(ops.shape(x)[1]), axis=0)[None]

    ids = keras.Input((None,), dtype="int32", name="token_ids")
    mask = keras.Input((None,), dtype="int32", name="padding_mask")
    x = layers.Embedding(VOCAB, dim)(ids) + PositionEmbedding()(ids)
    attention_mask = ops.cast(mask, "bool")[:, None, :]
    for _ in range(blocks):
        attended = layers.MultiHeadAttention(heads, dim // heads)(
            x, x, attention_mask=attention_mask
        )
        x = layers.LayerNormalization()(x + attended)
        hidden = layers.Dense(4 * dim, activation="gelu")(x)
        x = layers.LayerNormalization()(x + layers.Dense(dim)(hidden))
    weights = ops.cast(mask, "float32")[:, :, None]
    pooled = ops.sum(x * weights, axis=1) / ops.maximum(ops.sum(weights, axis=1), 1.0)
    return keras.Model(
        {"token_ids": ids, "padding_mask": mask}, layers.Dense(3)(pooled), name="transformer"
    )


def cnn_free_size():
    """Images of any height and width: three strided Conv-BN-ReLU, a depthwise-separable
    block, global average pooling, 10 logits."""
    import keras
    from keras import layers

    inputs = keras.Input((None, None, 3))
    x = layers.Rescaling(1 / 255)(inputs)
    for filters in (32, 64, 128):
        x = layers.Conv2D(filters, 3, strides=2, padding="same", use_bias=False)(x)
        x = layers.ReLU()(layers.BatchNormalization()(x))
    x = layers.SeparableConv2D(128, 3, padding="same", activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(10)(x), name="cnn_free_size")


def app(family: str, name: str, side: int, quick: bool = False) -> ZooModel:
    return ZooModel(family, application(name, side), images, side, quick=quick)


MODELS: dict[str, ZooModel] = {
    "resnet50": app("ResNet", "ResNet50", 64),
    "resnet50v2": app("ResNetV2", "ResNet50V2", 64),
    "mobilenetv2": app("MobileNetV2", "MobileNetV2", 96),
    "mobilenetv3small": app("MobileNetV3", "MobileNetV3Small", 96, quick=True),
    "efficientnetb0": app("EfficientNet", "EfficientNetB0", 64),
    "efficientnetv2b0": app("EfficientNetV2", "EfficientNetV2B0", 64),
    "densenet121": app("DenseNet", "DenseNet121", 64),
    "convnexttiny": app("ConvNeXt", "ConvNeXtTiny", 64),
    "xception": app("Xception", "Xception", 71),  # 71: its smallest input
    "inceptionv3": app("Inception", "InceptionV3", 75),  # 75: its smallest
    "nasnetmobile": app("NASNet", "NASNetMobile", 96),
    "vgg16": app("VGG", "VGG16", 64),
    "regnetx002": ZooModel("RegNet", regnetx_002, images, 64, quick=True),  # rescales inside
    "text-conv1d": ZooModel(
        "Embedding+Conv1D, variable length",
        text_conv1d,
        token_ids,
        64,
        (16, 256),
        "length",
        quick=True,
    ),
    "gru-varlen": ZooModel(
        "GRU, variable length", gru_varlen, features, 40, (8, 100), "length", quick=True
    ),
    "transformer-varlen": ZooModel(
        "transformer encoder, dict inputs, variable length",
        transformer_varlen,
        padded_tokens,
        64,
        (16, 200),
        "length",
        quick=True,
    ),
    "cnn-free-hw": ZooModel(
        "CNN, free height and width", cnn_free_size, images, 64, ((48, 80), (128, 96)), quick=True
    ),
}


# -- one model, in a child process -------------------------------------------------------------
def callable_errors(opt, model, spec: ZooModel, rng: np.random.Generator) -> dict[str, float | str]:
    """The callable's relative error against model(x) at batch 1, batch 4 and the other
    sizes; a call that raises is recorded as "failed: reason"."""
    checks = {
        "batch 1": spec.draw(rng, 1, spec.size),
        f"batch {CHECK_BATCH}": spec.draw(rng, CHECK_BATCH, spec.size),
    }
    for size in spec.other_sizes:
        label = "x".join(map(str, size)) if isinstance(size, tuple) else str(size)
        checks[f"{spec.varies} {label}"] = spec.draw(rng, 1, size)
    errors = {}
    for label, x in checks.items():
        try:
            errors[label] = harness.relative_error(flat_outputs(opt(x)), flat_outputs(model(x)))
        except Exception as exc:  # the callable refusing a size is a result too
            errors[label] = f"failed: {reason(exc)}"
    return errors


def run_model(name: str, budget_s: float) -> dict:
    import keras

    import infertune

    spec = MODELS[name]
    keras.utils.set_random_seed(0)
    model = spec.build()
    rng = np.random.default_rng(0)
    sample = spec.draw(rng, 1, spec.size)
    harness.log("zoo", f"{name}: optimize()")
    start = time.perf_counter()
    opt = infertune.optimize(model, sample, verbose=False)
    optimize_s = time.perf_counter() - start
    report = opt.report
    candidates = [
        {
            "name": c.name,
            "status": c.status,
            "precision": c.precision,
            "reason": c.reason,
            "p50_ms": c.p50,
            "max_rel_err": c.max_rel_err,
            "prepare_s": c.prepare_s,
        }
        for c in report.candidates
    ]
    harness.log("zoo", f"{name}: checking opt(x) at other batch sizes and sizes")
    errors_opt = callable_errors(opt, model, spec, rng)
    reference = flat_outputs(model(sample))
    timed = harness.against_by_hand(name, "zoo", model, sample, reference, opt, budget_s)
    return {
        "model": name,
        "family": spec.family,
        "input": harness.describe_input(sample),
        "optimize_s": optimize_s,
        "selected": opt.backend,
        "selection_reason": report.selection_reason,
        "general_backend": report.general_backend,
        "candidates": candidates,
        "exact_mismatch": {
            c["name"]: c["reason"]
            for c in candidates
            if c["precision"] == "fp32" and c["status"] == "mismatch"
        },
        "callable_rel_err": errors_opt,
        **timed,
        "report": report.to_dict(),
    }


# -- report ------------------------------------------------------------------------------------
def worst_callable_error(r: dict) -> str:
    values = list(r["callable_rel_err"].values())
    if any(isinstance(v, str) for v in values):
        return "failed"
    return f"{max(values):.0e}"


def chosen(r: dict) -> str:
    """infertune's choice; "(exact-shape path)" where it serves the sample's shapes only and
    another candidate every other shape."""
    general = r.get("general_backend")
    return r["selected"] + (" (exact-shape path)" if general and general != r["selected"] else "")


def markdown(results: list[dict]) -> dict:
    return harness.runtime_table(
        results,
        ["opt(x) err", "exact candidates rejected"],
        chosen,
        lambda r: [worst_callable_error(r), ", ".join(r["exact_mismatch"]) or "none"],
    )


def fates(results: list[dict]) -> list[str]:
    """Every candidate's fate, and why each by-hand runtime or candidate failed."""
    lines = []
    for r in results:
        if "error" in r:
            lines.append(f"- **{r['model']}**: {r['error']}")
            continue
        lines += harness.fate_lines(f"**{r['model']}** ({r['family']})", r["candidates"])
        for label, why in r["raw_failed"].items():
            lines.append(f"  - by hand, {label} failed: {why}")
        errors = ", ".join(
            f"{label} {v if isinstance(v, str) else f'{v:.1e}'}"
            for label, v in r["callable_rel_err"].items()
        )
        lines.append(f"  - opt(x) relative error against model(x): {errors}")
    return lines


def check_targets(results: list[dict]) -> list[dict]:
    target = harness.target
    checks: list[dict] = []
    for r in results:
        name = r["model"]
        if "error" in r:
            checks.append(target(f"{name}: runs", "no error", None, False, f"{name}: {r['error']}"))
            continue
        rejected = ", ".join(r["exact_mismatch"]) or "none"
        checks.append(
            target(
                f"{name}: exact candidates rejected as mismatch",
                "none",
                len(r["exact_mismatch"]),
                not r["exact_mismatch"],
                f"{name}: exact candidates rejected as mismatch: {rejected}",
            )
        )
        errors = r["callable_rel_err"]
        numbers = [v for v in errors.values() if not isinstance(v, str)]
        ok = len(numbers) == len(errors) and max(numbers) <= EXACT_RTOL
        worst = worst_callable_error(r)
        checks.append(
            target(
                f"{name}: opt(x)'s largest relative error against model(x)",
                f"<= {EXACT_RTOL:g}",
                max(numbers) if len(numbers) == len(errors) else None,
                ok,
                f"{name}: opt(x) vs model(x) at {list(errors)}: worst {worst} (<= {EXACT_RTOL:g})",
            )
        )
        ratio, best = r["vs_best_exact_raw"], r["best_exact_raw"]
        title = f"{name}: speed against the fastest exact by-hand runtime"
        wanted = f">= {1 / TOO_SLOW:.2f}x"
        if ratio is None:
            checks.append(
                target(
                    title, wanted, None, False,
                    f"{name}: no exact by-hand runtime (or infertune) was timed",
                )
            )  # fmt: skip
        else:
            checks.append(
                target(
                    title,
                    wanted,
                    ratio,
                    ratio >= 1 / TOO_SLOW,
                    f"{name}: {ratio:.2f}x the fastest exact by-hand runtime {best} "
                    f"(>= {1 / TOO_SLOW:.2f}: within 5%)",
                )
            )
    ratios = {r["model"]: r.get("vs_best_exact_raw") for r in results}
    if len(ratios) >= 3:
        faster = [name for name, ratio in ratios.items() if ratio is not None and ratio > 1.0]
        checks.append(
            target(
                "models faster than the fastest exact by-hand runtime",
                f"> {len(ratios) // 2} of {len(ratios)}",
                len(faster),
                2 * len(faster) > len(ratios),
                f"faster than the fastest exact by-hand runtime on {len(faster)} of "
                f"{len(ratios)} models {faster} (most)",
            )
        )
    return checks


NOTES = (
    "Median ms per call (p50) at batch 1; the by-hand runtimes and infertune's callable "
    "timed in one interleaved run per model. `(err E)`: not exact (relative error above "
    f"{EXACT_RTOL:g}); `opt(x) err`: the callable's largest relative error against model(x) "
    "at batch 1, batch 4 and the other lengths or sizes."
)


def main() -> int:
    quick = [n for n, m in MODELS.items() if m.quick]
    parser = harness.parser(
        __doc__,
        "--out",
        "--quick",
        "--json",
        child=True,
        helps={"--quick": f"the small and variable-shape models: {quick}"},
    )
    parser.add_argument("--models", help=f"comma-separated names; default all: {list(MODELS)}")
    parser.add_argument("--budget", type=float, default=10.0, help="measurement s per model")
    parser.add_argument(
        "--model-timeout", type=float, default=1200.0, help="s one model may take in all"
    )
    args = parser.parse_args()
    if args.child:
        harness.write_child_result(args.child_out, run_model(args.child, args.budget))
        return 0
    if args.models and args.quick:
        parser.error("give --models or --quick, not both")
    names = quick if args.quick else harness.names_from(args.models, MODELS, parser)
    results = []
    for name in names:
        harness.log("zoo", f"{name} ({len(results) + 1} of {len(names)})")
        budget = ["--budget", str(args.budget)]
        results.append(harness.run_in_child(__file__, name, budget, args.model_timeout))
    targets = check_targets(results)
    data = harness.results(
        BENCHMARK,
        about=harness.about(__doc__),
        notes=NOTES,
        rows=results,
        tables=[markdown(results)],
        targets=targets,
        headline={
            f"{r['model']}: vs fastest exact by hand": r["vs_best_exact_raw"]
            for r in results
            if r.get("vs_best_exact_raw") is not None
        },
        sections=[{"title": "Every candidate's fate", "lines": fates(results)}],
    )
    harness.publish(data, args.out, args.json, args.quick)
    return harness.exit_code(targets)


if __name__ == "__main__":
    sys.exit(main())
