"""ONNX Runtime on attention models' exports, with and without the export's exact passes
(infertune/export/onnx_passes.py): transposes through an axis of size 1, masks broadcast
before a select.

For each model, the export by hand (tf2onnx's from_function, as a user writes it), the same
graph with the transposes rewritten, and with both passes, are run by ONNX Runtime's CPU
session with its default options, at each length timed interleaved (each session's blocks
followed by ONNX Runtime's cool-down), their outputs compared bit for bit; OpenVINO (f32) runs
the export and the graph with both passes in the same rounds. `transpose` is the
one operator alone: (1, 288, 1, 4, 64) to (1, 4, 1, 64, 288). Targets: with both passes, p50
at most 1.02x the export's at every length (never slower beyond noise) and at most 0.97x
over the lengths (the geometric mean) on the attention models; the outputs equal.

    python benchmarks/onnx_passes.py [--models transpose,audio,text-encoder]
                                     [--budget 4] [--out DIR] [--quick]

Models: benchmarks/bench_models.py's masked audio encoder (3 Conv1D, 2 attention blocks of
width 256, 4 heads) and masked text encoder (4 blocks of width 768, 12 heads), batch 1, at
lengths from their traffic in benchmarks/shapes.py (audio: median 300 frames; text: queries
and documents). Results: docs/benchmarks/onnx-passes/<date>/ (--out).
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

BENCHMARK = "onnx-passes"
MODELS = ("transpose", "audio", "text-encoder")
LENGTHS = {"transpose": (288,), "audio": (40, 150, 300, 600), "text-encoder": (16, 40, 200, 400)}
EACH = 1.02  # with both passes, p50 at most this much the export's, at every length
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

    from infertune.export.onnx_passes import speed_up, squeeze_unit_transposes

    model_bytes, request = exports(name, quick)
    transposed, rewritten = onnx.load_from_string(model_bytes), onnx.load_from_string(model_bytes)
    squeeze_unit_transposes(transposed)
    count = speed_up(rewritten)
    graphs = {
        "export": model_bytes,
        "transposes": transposed.SerializeToString(),
        "both": rewritten.SerializeToString(),
    }
    cooldown = dict.fromkeys(graphs, harness.onnxruntime_cooldown_s())
    openvino = {"openvino export": graphs["export"], "openvino both": graphs["both"]}
    rows = []
    for length in LENGTHS[name][:2] if quick else LENGTHS[name]:
        sample = request(length)
        runners = {label: harness.onnxruntime_session(b, sample) for label, b in graphs.items()}
        if name != "transpose":  # OpenVINO reads the same export
            for label, graph in openvino.items():
                runners[label] = harness.openvino_compiled(graph, sample, "f32")
        outputs = {label: harness.flat_outputs(run()) for label, run in runners.items()}
        equal = all(
            np.array_equal(a, b)
            for label in ("transposes", "both")
            for a, b in zip(outputs["export"], outputs[label], strict=True)
        ) and all(
            np.array_equal(a, b)
            for a, b in zip(
                outputs.get("openvino export", []), outputs.get("openvino both", []), strict=True
            )
        )
        measured = harness.measure_runners(
            runners, budget_s=budget_s, cooldown_s=cooldown, min_rounds=10, race=False
        )
        p50 = {label: stats.p50 for label, stats in measured.stats.items()}
        ratio = p50["both"] / p50["export"]
        openvino_ratio = p50.get("openvino both", 0.0) / p50.get("openvino export", 1.0)
        harness.log(name, f"length {length}: {ratio:.3f}x, OpenVINO {openvino_ratio:.3f}x")
        rows.append(
            {"model": name, "length": length, "rewritten": count, "equal": equal,
             "export_p50_ms": p50["export"], "transposes_p50_ms": p50["transposes"],
             "both_p50_ms": p50["both"], "ratio": ratio,
             "openvino_p50_ms": {k: v for k, v in p50.items() if k.startswith("openvino")},
             "openvino_ratio": openvino_ratio or None}
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
            cells.append([name, "failed", result["error"][:200], "", "", "", "", "", ""])
            targets.append(harness.target(f"{name}: both passes", "<= 1.02x", None, False))
            continue
        ratios = [row["ratio"] for row in result["rows"]]
        overall = math.exp(sum(map(math.log, ratios)) / len(ratios))
        for row in result["rows"]:
            rows.append(row)
            rewritten = row["rewritten"]
            cells.append(
                [name, str(row["length"]),
                 f"{rewritten.get('transposes', 0)}, {rewritten.get('masks', 0)}",
                 harness.milliseconds(row["export_p50_ms"]),
                 harness.milliseconds(row["transposes_p50_ms"]),
                 harness.milliseconds(row["both_p50_ms"]), f"{row['ratio']:.3f}x",
                 f"{row['openvino_ratio']:.3f}x" if row["openvino_ratio"] else "-",
                 "yes" if row["equal"] else "NO"]
            )  # fmt: skip
        met = None if args.quick else max(ratios) <= EACH
        targets.append(
            harness.target(
                f"{name}: both passes at most 1.02x the export at every length", "<= 1.02x",
                max(ratios), met,
                f"{name}: with both passes, p50 {min(ratios):.3f}x-{max(ratios):.3f}x the "
                f"export's over lengths {', '.join(str(r['length']) for r in result['rows'])}",
            )
        )  # fmt: skip
        if name != "transpose":
            met = None if args.quick else overall <= OVERALL
            targets.append(
                harness.target(
                    f"{name}: both passes at most 0.97x the export over the lengths",
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
        ["model", "length", "rewritten: transposes, masks", "export p50 ms",
         "transposes p50 ms", "both p50 ms", "both / export", "OpenVINO f32: both / export",
         "outputs equal"],
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
