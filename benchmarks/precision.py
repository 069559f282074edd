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

Per model, in a child process of its own (harness.run_in_child):

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
* float32 by hand (harness.py): tf.function, XLA, ONNX Runtime, OpenVINO f32, LiteRT, each
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

Results: docs/benchmarks/precision/<date>/ (--out; with --quick a temporary folder), written
by harness.write_results. The models and their tasks are bench_models.py's.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("NNCF_CI", "1")  # NNCF reads it at import: no telemetry

import bench_models
import harness
import numpy as np
from bench_models import CHUNK, DEFAULT_CACHE, MAX_DROP, Data, Spec, accuracy_of, log

BENCHMARK = "precision"
MODELS = bench_models.PRECISION_MODELS
PRECISIONS = ("fp32", "bf16", "int8")
HELD_OUT_SLACK = 0.005  # an accepted candidate's drop on the test split: max_drop + 0.5 points
TOO_SLOW = 1.05  # infertune may be at most 5% slower than the best int8 by hand that passes
OPTIMIZE_RATIO = 2.5  # optimize() with reduced precision against fp32 alone (ResNet50 224)
# Each timed this many times, in turns: one pair's ratio moved 2.19-2.72x in three such runs
TUNING_ROUNDS = 3
FP32_RUNTIMES = harness.RAW_RUNTIMES
INT8_RUNTIMES = harness.INT8_RUNTIMES


# -- by hand ---------------------------------------------------------------------------------------
def predict_each(runner: Callable[[], Any], buffer: np.ndarray, x: np.ndarray) -> np.ndarray:
    """A by-hand runner's outputs on every row of `x` at batch 1: the runner reads `buffer`
    (its sample) at each call, so each row is copied into it; the sample is put back."""
    sample = buffer.copy()
    outputs = []
    for i in range(len(x)):
        buffer[...] = x[i : i + 1]
        outputs.append(harness.first_output(runner()))
    buffer[...] = sample
    return np.concatenate(outputs)


def by_hand_runtimes(model, buffer: np.ndarray, calibration: np.ndarray) -> tuple[dict, dict]:
    """Every runtime by hand that could be built, on `buffer`: ({label: runner},
    {label: {"kind", "build_s", "failed"?}}); one that fails is recorded, the run goes on."""
    builders, _ = harness.by_hand_builders(
        model, buffer, [*FP32_RUNTIMES, *INT8_RUNTIMES], calibration=calibration
    )
    runners, failed, build_s = harness.build_runners(builders, "precision")
    info = {
        label: {"kind": "int8" if label in INT8_RUNTIMES else "fp32", "build_s": build_s[label]}
        for label in builders
    }
    for label, why in failed.items():
        info[label]["failed"] = why
    return runners, info


# -- one model, in a child process -------------------------------------------------------------
def predict_opt(opt, x: np.ndarray) -> np.ndarray:
    return np.concatenate(
        [harness.first_output(opt(x[i : i + CHUNK])) for i in range(0, len(x), CHUNK)]
    )


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
        harness.warm_up_optimize(PRECISIONS, MAX_DROP)
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
                info[label]["rel_err"] = harness.relative_error(
                    harness.first_output(runners[label]()), expected
                )
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
            info[label]["failed"] = f"first call: {harness.reason(exc)}"
            del runners[label]


def against_by_hand(opt, model, sample, data: Data, reference_gate, budget_s: float) -> dict:
    """The runtimes by hand built, checked and judged, then timed with `opt(sample)` in one
    interleaved run: by_hand, p50_ms, stats, the best fp32 and the best passing int8 by
    hand, and infertune's speed against each (their p50 over its)."""
    buffer = sample.copy()
    runners, info = by_hand_runtimes(model, buffer, data.x("calibration"))
    judge_by_hand(runners, info, buffer, model, data, reference_gate)
    cooldown = {
        label: harness.onnxruntime_cooldown_s() for label in runners if "onnxruntime" in label
    }
    runners["infertune"] = lambda: opt(sample)
    cooldown["infertune"] = max(b.cooldown_s for b in opt.backends)
    log(f"  measuring {len(runners)} runners, interleaved")
    # race=False: the float32 runtimes, 2-5x behind int8, would leave the rounds after two
    # single calls, and the ratio against the best of them rest on a p50 of two calls.
    measured = harness.measure_runners(runners, budget_s=budget_s, cooldown_s=cooldown, race=False)
    for label, why in measured.errors.items():
        if label in info:
            info[label]["failed"] = f"measurement: {why}"
    p50 = {label: stats.p50 for label, stats in measured.stats.items()}
    exact = {
        label: p50[label]
        for label in FP32_RUNTIMES
        if label in p50 and info[label].get("rel_err", 1.0) <= harness.EXACT_RTOL
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
            accepted[c["name"]] = {"error": harness.reason(exc)}
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
    model, training = bench_models.trained_model(name, data, quick, cache)
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
        "input": harness.describe_input(sample),
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
    return f"{label} {harness.milliseconds(r['p50_ms'][label])}", f"{r[versus]:.2f}x"


COLUMNS = (
    "model", "CPU int8/bf16 instructions", "fp32 accuracy", "infertune chose",
    "its accuracy (drop)", "optimize() s", "infertune ms", "best fp32 by hand, ms", "vs fp32",
    "best int8 by hand passing the gate, ms", "vs int8", "targets",
)  # fmt: skip


def main_table(results: list[dict]) -> dict:
    rows = []
    for r in results:
        if "error" in r:
            rows.append([r["model"], "", "", r["error"]])
            continue
        fp32, vs_fp32 = ratio_cell(r, "best_fp32", "vs_best_fp32")
        int8, vs_int8 = ratio_cell(r, "best_int8", "vs_best_int8")
        optimize = f"{r['optimize_s']:.0f}"
        if r["optimize_fp32_s"]:
            optimize += f" ({r['optimize_s'] / r['optimize_fp32_s']:.2f}x fp32 alone)"
        ours = r["p50_ms"].get("infertune")
        rows.append(
            [
                r["model"],
                ", ".join(r["instructions"]) or "none",
                f"{r['fp32_test_metric']:.4f}",
                f"{r['selected']} ({r['selected_precision']})",
                f"{r['test_metric']:.4f} ({points(r['test_drop'])})",
                optimize,
                "-" if ours is None else harness.milliseconds(ours),
                fp32,
                vs_fp32,
                int8,
                vs_int8,
                r["verdict"],
            ]
        )
    return harness.table(COLUMNS, rows)


def by_hand_cell(r: dict, label: str) -> str:
    info = r["by_hand"].get(label, {})
    if "failed" in info:
        return "failed"
    value = r["p50_ms"].get(label)
    cell = "-" if value is None else harness.milliseconds(value)
    if "gate" in info:
        gate = info["gate"]
        verdict = "passes" if gate["passed"] else "fails"
        cell += f" ({verdict}: {gate['metric']:.4f}, drop {points(gate['drop'])})"
    elif info.get("rel_err", 0.0) > harness.EXACT_RTOL:
        cell += f" (err {info['rel_err']:.0e})"
    return cell


def by_hand_table(results: list[dict]) -> dict:
    columns = [*FP32_RUNTIMES, *INT8_RUNTIMES, "infertune"]
    rows = []
    for r in results:
        if "error" in r:
            continue
        cells = [by_hand_cell(r, label) for label in columns[:-1]]
        ours = r["p50_ms"].get("infertune")
        cells.append("-" if ours is None else harness.milliseconds(ours))
        rows.append([r["model"], *cells])
    return harness.table(
        ["model", *columns],
        rows,
        "Every runtime by hand, ms (the int8 ones with their gate verdict):",
    )


def fates(results: list[dict]) -> list[str]:
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
    return lines


def check_model(r: dict) -> list[dict]:
    """One model's targets (harness.target: met True or False)."""
    from infertune.system.environment import BF16_FLAGS, INT8_DOT_FLAGS

    name = r["model"]
    if "error" in r:
        return [harness.target(f"{name}: runs", "no error", None, False, f"{name}: {r['error']}")]
    spec = MODELS[name]
    checks = [
        harness.target(
            f"{name}: fp32 accuracy on the test split",
            f">= {spec.stated:.2f}",
            r["fp32_test_metric"],
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
            harness.target(
                f"{name}: speed against the best fp32 by hand",
                f">= {spec.vs_fp32}x",
                ratio,
                ratio is not None and ratio >= spec.vs_fp32,
                f"{name}: {'-' if ratio is None else f'{ratio:.2f}'}x the best fp32 by hand "
                f"{r['best_fp32']} (>= {spec.vs_fp32}x on a CPU with VNNI)",
            )
        )
    if r["best_int8"] is None:
        checks.append(
            harness.target(
                f"{name}: speed against the best int8 by hand passing the gate",
                f">= {1 / TOO_SLOW:.2f}x",
                None,
                True,
                f"{name}: no int8 by hand passes the gate",
            )
        )
    else:
        ratio = r["vs_best_int8"]
        checks.append(
            harness.target(
                f"{name}: speed against the best int8 by hand passing the gate",
                f">= {1 / TOO_SLOW:.2f}x",
                ratio,
                ratio is not None and ratio >= 1 / TOO_SLOW,
                f"{name}: {'-' if ratio is None else f'{ratio:.2f}'}x the best int8 by hand "
                f"passing the gate, {r['best_int8']} (>= {1 / TOO_SLOW:.2f})",
            )
        )
    for candidate, held in r["accepted_held_out"].items():
        title = f"{name}: {candidate}'s drop on the test split"
        bound = f"<= {points(MAX_DROP + HELD_OUT_SLACK)}"
        if "error" in held:
            checks.append(
                harness.target(
                    title, bound, None, False, f"{name}: {candidate} on the test split: "
                    f"{held['error']}"
                )
            )  # fmt: skip
            continue
        checks.append(
            harness.target(
                title,
                bound,
                held["test_drop"],
                held["test_drop"] <= MAX_DROP + HELD_OUT_SLACK + 1e-9,
                f"{name}: {candidate} accepted, its drop on the test split "
                f"{points(held['test_drop'])} ({bound})",
            )
        )
    if not vnni and not bf16 and r["selected_precision"] != "fp32":
        ours, theirs = r["selected_ms_in_report"], r["fastest_fp32_candidate_ms"]
        checks.append(
            harness.target(
                f"{name}: the choice against the fastest fp32 candidate (no VNNI or bf16)",
                "not slower",
                None if ours is None or not theirs else ours / theirs,
                theirs is None or (ours is not None and ours <= theirs),
                f"{name}: no VNNI or bf16 units: {r['selected']} {ours} ms against the fastest "
                f"fp32 candidate {r['fastest_fp32_candidate']} {theirs} ms (not slower)",
            )
        )
    if r["optimize_fp32_s"]:
        ratio = r["optimize_s"] / r["optimize_fp32_s"]
        checks.append(
            harness.target(
                f"{name}: optimize() with reduced precision against fp32 alone",
                f"<= {OPTIMIZE_RATIO}x",
                ratio,
                ratio <= OPTIMIZE_RATIO,
                f"{name}: optimize() with precision={PRECISIONS} {r['optimize_s']:.1f} s, in fp32 "
                f"alone {r['optimize_fp32_s']:.1f} s: {ratio:.2f}x (<= {OPTIMIZE_RATIO}x)"
                + rounds_note(r),
            )
        )
    return checks


def check_targets(results: list[dict], quick: bool) -> list[dict]:
    """Every model's targets (under --quick not checked, met None: tiny models); each result
    gets its `verdict` cell for the table."""
    found = []
    for r in results:
        checks = check_model(r)
        missed = [t["detail"].split(": ", 1)[1] for t in checks if t["met"] is False]
        r["verdict"] = "met" if not missed else "missed: " + "; ".join(missed)
        if quick and "error" not in r:
            r["verdict"] = "(quick: not checked)"
            checks = [{**t, "met": None} for t in checks]
        found += checks
    return found


NOTES = (
    "Accuracy: on the held-out test split; the gate: the gate split, max_drop={max_drop:g} "
    "with infertune's 95% bootstrap bound. Median ms per call (p50) at batch 1, every runtime "
    "timed in one interleaved run per model (none leaving it); vs: the by-hand runtime's p50 "
    "over infertune's. Best fp32 by hand: the fastest within 1e-3 of model(x); best int8 by "
    "hand: the fastest of ONNX Runtime quantize_static, NNCF and TFLite full int8 (each "
    "library's defaults) that passes the same gate."
)


def main() -> int:
    parser = harness.parser(
        __doc__,
        "--out",
        "--quick",
        "--json",
        child=True,
        helps={"--quick": "tiny versions of every model: a smoke test"},
    )
    parser.add_argument("--models", help=f"comma-separated names; default all: {list(MODELS)}")
    parser.add_argument(
        "--cache", type=Path, default=DEFAULT_CACHE, help="where the trained models are kept"
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
        harness.write_child_result(args.child_out, result)
        return 0
    names = harness.names_from(args.models, MODELS, parser)
    results = []
    for name in names:
        log(f"{name} ({len(results) + 1} of {len(names)})")
        # How many accepted candidates besides the chosen one are tuned again alone for the
        # test split: all of them, none with --chosen-only, one in all with --quick.
        retune = 0 if args.chosen_only or (args.quick and results) else 1 if args.quick else 99
        child_args = ["--cache", str(cache), "--budget", str(budget), "--retune", str(retune)]
        child_args += ["--verbose"] * args.verbose
        child_args += ["--tuning-rounds", str(args.tuning_rounds)]
        child_args += ["--quick"] * args.quick
        results.append(harness.run_in_child(__file__, name, child_args, args.model_timeout))
    targets = check_targets(results, args.quick)
    data = harness.results(
        BENCHMARK,
        about=harness.about(__doc__),
        notes=NOTES.format(max_drop=MAX_DROP)
        + (" --quick: tiny models, few training steps; targets not checked." * args.quick),
        rows=results,
        tables=[main_table(results), by_hand_table(results)],
        targets=targets,
        headline={
            f"{r['model']}: vs best fp32 by hand": r["vs_best_fp32"]
            for r in results
            if "error" not in r and r.get("vs_best_fp32") is not None
        },
        sections=[{"title": "Reduced-precision candidates and failures", "lines": fates(results)}],
    )
    harness.publish(data, args.out, args.json, args.quick)
    return harness.exit_code(targets, failed=any("error" in r for r in results))


if __name__ == "__main__":
    sys.exit(main())
