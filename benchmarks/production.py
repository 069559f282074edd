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
largest element); the runtimes written by hand with their defaults (harness.py: tf.function,
tf.function with XLA, ONNX Runtime on a tf2onnx export, OpenVINO f32 from that export,
LiteRT), each where it converts, its failure recorded otherwise; and those that ran timed
with infertune's callable in one interleaved run.

Targets (exit code 1 if one fails): every model runs through optimize(); infertune within 5%
of the fastest exact by-hand runtime on each (exact: within 1e-3 of `model(x)`, relative
norm); faster than `tf.function(model)` on each model where a converter (ONNX Runtime,
OpenVINO, LiteRT, XLA) ran it by hand, within 1e-3 of `model(x)` or not.

    python benchmarks/production.py [--models recommender,audio | --quick] [--out DIR]

Results: docs/benchmarks/production/<date>/ (--out; with --quick a temporary folder). The
models are bench_models.py's (PRODUCTION_MODELS).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import bench_models
import harness
import numpy as np
from bench_models import FULL, QUICK, ProductionModel, Sizes
from harness import EXACT_RTOL, flat_outputs, reason

BENCHMARK = "production"
MODELS = bench_models.PRODUCTION_MODELS
CONVERTERS = ("tf.function+XLA", "onnxruntime", "openvino-f32", "litert")
TOO_SLOW = 1.05  # infertune may be at most 5% slower than the fastest exact by-hand runtime
SAMPLE_BATCH = 1  # a service's single request
CHECK_BATCH = 8  # the other batch size the callable is checked at


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
                "rel": harness.relative_error(outs, refs),
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
    result: dict[str, Any] = {
        "model": name,
        "kind": spec.kind,
        "input": harness.describe_input(sample),
    }
    harness.log("production", f"{name}: optimize()")
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
    result.update(
        harness.against_by_hand(name, "production", model, sample, reference, opt, budget_s)
    )
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


def markdown(results: list[dict]) -> dict:
    def tail(r: dict) -> list[str]:
        ratio = r["vs_tf_function"]
        return ["-" if ratio is None else f"{ratio:.2f}x", worst_error(r)]

    return harness.runtime_table(
        results,
        ["vs tf.function", "opt(x) err"],
        lambda r: "refused" if "optimize_failed" in r else r["selected"],
        tail,
    )


def fates(results: list[dict]) -> list[str]:
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
            lines += harness.fate_lines(f"**{r['model']}** ({r['kind']})", r["candidates"])
            errors = ", ".join(
                f"{label} {v}"
                if isinstance(v, str)
                else f"{label} {v['rel']:.1e} (largest element {v['max_abs']:.1e})"
                for label, v in r["callable_err"].items()
            )
            lines.append(f"  - opt(x) error against model(x), relative norm: {errors}")
        for label, why in r["raw_failed"].items():
            lines.append(f"  - by hand, {label} failed: {why}")
    return lines


def check_targets(results: list[dict]) -> list[dict]:
    target = harness.target
    checks: list[dict] = []
    for r in results:
        name = r["model"]
        if "error" in r:
            checks.append(target(f"{name}: runs", "no error", None, False, f"{name}: {r['error']}"))
            continue
        if "optimize_failed" in r:
            checks.append(
                target(
                    f"{name}: runs through optimize()", "runs", None, False,
                    f"{name}: optimize() refused it: {r['optimize_failed']}",
                )
            )  # fmt: skip
            continue
        checks.append(
            target(f"{name}: runs through optimize()", "runs", r["selected"], True,
                   f"{name}: runs ({r['selected']})")
        )  # fmt: skip
        ratio, best = r["vs_best_exact_raw"], r["best_exact_raw"]
        title = f"{name}: speed against the fastest exact by-hand runtime"
        wanted = f">= {1 / TOO_SLOW:.2f}x"
        if ratio is None and r["p50_ms"].get("infertune") is not None:
            errors = ", ".join(f"{k} {v:.0e}" for k, v in r["raw_rel_err"].items())
            checks.append(
                target(
                    title, wanted, None, False,
                    f"{name}: no by-hand runtime matches model(x) within {EXACT_RTOL:g} "
                    f"(relative error: {errors or 'none ran'})",
                )
            )  # fmt: skip
        elif ratio is None:
            checks.append(
                target(title, wanted, None, False, f"{name}: infertune's callable was not timed")
            )
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
        converted = r["converted_by_hand"]
        if converted and r["vs_tf_function"] is not None:
            checks.append(
                target(
                    f"{name}: speed against tf.function(model)",
                    "> 1x",
                    r["vs_tf_function"],
                    r["vs_tf_function"] > 1.0,
                    f"{name}: {r['vs_tf_function']:.2f}x tf.function(model) "
                    f"(> 1: converters ran it by hand, exact or not: {', '.join(converted)})",
                )
            )
    return checks


def main() -> int:
    parser = harness.parser(
        __doc__,
        "--out",
        "--quick",
        "--json",
        child=True,
        helps={"--quick": "tiny sizes and 2 s of measuring per model: a smoke run, not numbers"},
    )
    parser.add_argument("--models", help=f"comma-separated names; default all: {list(MODELS)}")
    parser.add_argument(
        "--budget", type=float, default=None, help="measurement s per model (10; --quick: 2)"
    )
    parser.add_argument(
        "--model-timeout", type=float, default=1200.0, help="s one model may take in all"
    )
    args = parser.parse_args()
    budget = args.budget if args.budget is not None else (2.0 if args.quick else 10.0)
    if args.child:
        harness.write_child_result(args.child_out, run_model(args.child, args.quick, budget))
        return 0
    names = harness.names_from(args.models, MODELS, parser)
    results = []
    for name in names:
        harness.log("production", f"{name} ({len(results) + 1} of {len(names)})")
        child_args = ["--budget", str(budget)] + (["--quick"] if args.quick else [])
        results.append(harness.run_in_child(__file__, name, child_args, args.model_timeout))
    targets = check_targets(results)
    notes = (
        f"Median ms per call (p50) at batch {SAMPLE_BATCH}"
        + (" (--quick: tiny sizes, not numbers to keep)" if args.quick else "")
        + "; the by-hand runtimes and infertune's callable timed in one interleaved run "
        f"per model. `(err E)`: not exact (relative error above {EXACT_RTOL:g}); "
        f"`opt(x) err`: the callable's largest relative error against model(x) at batch "
        f"{SAMPLE_BATCH} and {CHECK_BATCH}."
    )
    data = harness.results(
        BENCHMARK,
        about=harness.about(__doc__),
        notes=notes,
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
