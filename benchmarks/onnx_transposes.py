"""ONNX Runtime on an attention model's export, with and without the export's rewrite of
transposes through an axis of size 1 (infertune/export/onnx_transposes.py).

tf2onnx's export of Keras attention transposes 5-D tensors with an axis of size 1, which ONNX
Runtime's CPU Transpose takes its slow general path for. For each model, the export by hand
(tf2onnx's from_function, as a user writes it) and the same graph with the rewrite are run by
ONNX Runtime's CPU session with its default options, at each length timed interleaved (each
session's blocks followed by ONNX Runtime's cool-down), their outputs compared bit for bit.
`transpose` is the one operator alone: (1, 288, 1, 4, 64) to (1, 4, 1, 64, 288).
Targets: the rewritten graph's p50 at most 1.02x the export's at every length (never
slower beyond noise) and at most 0.97x over the lengths (the geometric mean), on the
attention models; the outputs equal.

    python benchmarks/onnx_transposes.py [--models transpose,audio,text-encoder]
                                         [--budget 4] [--out DIR] [--quick]

Models: benchmarks/bench_models.py's masked audio encoder (3 Conv1D, 2 attention blocks of
width 256) and masked text encoder (4 blocks of width 768, 12 heads), batch 1, at lengths
from their traffic in benchmarks/shapes.py (audio: median 300 frames; text: queries and
documents). Results: docs/benchmarks/onnx_transposes/<date>/ (--out).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import harness
import numpy as np

BENCHMARK = "onnx_transposes"
MODELS = ("transpose", "audio", "text-encoder")
LENGTHS = {"transpose": (288,), "audio": (40, 150, 300, 600), "text-encoder": (16, 40, 200, 400)}
EACH = 1.02  # the rewritten graph's p50 at most this much the export's, at every length
OVERALL = 0.97  # ... and over the lengths (geometric mean), on the attention models


def exports(name: str, quick: bool) -> tuple[bytes, Callable[[int], Any]]:
    """The model's ONNX export by hand and its request at a length."""
    import bench_models
    from onnx import TensorProto, helper

    if name == "transpose":
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "length", 1, 4, 64])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 1, 64, "length"])
        node = helper.make_node("Transpose", ["x"], ["y"], perm=[0, 3, 2, 4, 1])
        graph = helper.make_graph([node], "transpose", [x], [y])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        rng = np.random.default_rng(0)
        return model.SerializeToString(), lambda length: rng.standard_normal(
            (1, length, 1, 4, 64)
        ).astype(np.float32)  # fmt: skip
    rng = np.random.default_rng(0)
    if name == "audio":
        keras_model = bench_models.masked_audio_encoder(quick)
        request = lambda length: bench_models.frame_request(rng, length, quick)  # noqa: E731
    else:
        keras_model = bench_models.masked_text_encoder(quick)
        request = lambda length: bench_models.token_request(rng, length, quick)  # noqa: E731
    return harness.onnx_bytes(keras_model, request(LENGTHS[name][0])), request


def child(name: str, budget_s: float, quick: bool) -> dict:
    """Both graphs of one model timed at each length, interleaved."""
    import onnx

    from infertune.export.onnx_transposes import squeeze_unit_transposes

    model_bytes, request = exports(name, quick)
    rewritten = onnx.load_from_string(model_bytes)
    count = squeeze_unit_transposes(rewritten)
    graphs = {"export": model_bytes, "rewritten": rewritten.SerializeToString()}
    cooldown = dict.fromkeys(graphs, harness.onnxruntime_cooldown_s())
    rows = []
    for length in LENGTHS[name][:2] if quick else LENGTHS[name]:
        sample = request(length)
        runners = {label: harness.onnxruntime_session(b, sample) for label, b in graphs.items()}
        outputs = {label: harness.flat_outputs(run()) for label, run in runners.items()}
        equal = all(
            np.array_equal(a, b)
            for a, b in zip(outputs["export"], outputs["rewritten"], strict=True)
        )
        measured = harness.measure_runners(
            runners, budget_s=budget_s, cooldown_s=cooldown, min_rounds=10, race=False
        )
        p50 = {label: stats.p50 for label, stats in measured.stats.items()}
        ratio = p50["rewritten"] / p50["export"]
        harness.log(name, f"length {length}: {ratio:.3f}x ({p50})")
        rows.append(
            {"model": name, "length": length, "rewritten_transposes": count, "equal": equal,
             "export_p50_ms": p50["export"], "rewritten_p50_ms": p50["rewritten"],
             "ratio": ratio}
        )  # fmt: skip
    return {"model": name, "rows": rows}


def main() -> int:
    made = harness.parser(__doc__, "--out", "--quick", child=True)
    made.add_argument("--models", help=f"comma-separated, of {', '.join(MODELS)}")
    made.add_argument("--budget", type=float, default=4.0, help="seconds of timing a length")
    args = made.parse_args()
    if args.child:
        result = child(args.child, args.budget, args.quick)
        harness.write_child_result(args.child_out, result)
        return 0
    budget = 1.0 if args.quick else args.budget
    rows, cells, targets = [], [], []
    for name in harness.names_from(args.models, MODELS, made):
        extra = ["--budget", str(budget)] + (["--quick"] if args.quick else [])
        result = harness.run_in_child(__file__, name, extra)
        if "error" in result:
            cells.append([name, "failed", result["error"][:200], "", "", "", ""])
            targets.append(harness.target(f"{name}: rewritten", "<= 1.02x", None, False))
            continue
        ratios = [row["ratio"] for row in result["rows"]]
        overall = math.exp(sum(map(math.log, ratios)) / len(ratios))
        for row in result["rows"]:
            rows.append(row)
            cells.append(
                [name, str(row["length"]), str(row["rewritten_transposes"]),
                 harness.milliseconds(row["export_p50_ms"]),
                 harness.milliseconds(row["rewritten_p50_ms"]), f"{row['ratio']:.3f}x",
                 "yes" if row["equal"] else "NO"]
            )  # fmt: skip
        met = None if args.quick else max(ratios) <= EACH
        targets.append(
            harness.target(
                f"{name}: rewritten at most 1.02x the export at every length", "<= 1.02x",
                max(ratios), met,
                f"{name}: the rewritten graph's p50 {min(ratios):.3f}x-{max(ratios):.3f}x the "
                f"export's over lengths {', '.join(str(r['length']) for r in result['rows'])}",
            )
        )  # fmt: skip
        if name != "transpose":
            met = None if args.quick else overall <= OVERALL
            targets.append(
                harness.target(
                    f"{name}: rewritten at most 0.97x the export over the lengths",
                    "<= 0.97x", overall, met,
                    f"{name}: geometric mean over the lengths {overall:.3f}x",
                )
            )  # fmt: skip
        equal = all(row["equal"] for row in result["rows"])
        targets.append(
            harness.target(
                f"{name}: outputs equal bit for bit", "equal", equal, equal,
                f"{name}: {'every' if equal else 'NOT every'} output equal at every length",
            )
        )  # fmt: skip
    table = harness.table(
        ["model", "length", "transposes rewritten", "export p50 ms", "rewritten p50 ms",
         "ratio", "outputs equal"],
        cells,
        title="ONNX Runtime CPU, default session options, batch 1, timed interleaved",
    )  # fmt: skip
    data = harness.results(
        BENCHMARK, rows=rows, tables=[table], targets=targets,
        headline={t["name"]: t["value"] for t in targets}, about=harness.about(__doc__),
    )  # fmt: skip
    harness.publish(data, args.out, quick=args.quick)
    return harness.exit_code(targets)


if __name__ == "__main__":
    sys.exit(main())
