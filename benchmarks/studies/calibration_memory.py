"""Calibration data given as one array against the same data in batches of 32: memory and time.

From the repository's root:

    python -m benchmarks.studies.calibration_memory [--samples 256] [--side 224] [--json FILE]

Two fresh processes tune MobileNetV2 (keras.applications, random weights) at batch 1 with
`precision=("fp32", "int8")`, no `accuracy=` (so the agreement rule runs the model and the
candidates on every calibration input), candidates onnxruntime-cpu and its static int8: one
gives `calibration=` as one array of --samples images, the other as a list of arrays of 32
rows. Each reports the report's peak memory, its own peak resident memory and optimize()'s
time. infertune cuts calibration batches to 32 rows, so the two should match; before it did,
one array was one call of the model and of each candidate at batch --samples.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import harness

FORMS = ("one array", "batches of 32")


def child(form: str, samples: int, side: int) -> dict:
    """In a fresh process: optimize() with the calibration data in `form`."""
    import resource
    import time

    import keras
    import numpy as np

    import infertune

    rng = np.random.default_rng(0)
    model = keras.applications.MobileNetV2(weights=None, input_shape=(side, side, 3))
    sample = rng.random((1, side, side, 3), dtype=np.float32)
    model(sample)
    images = rng.random((samples, side, side, 3), dtype=np.float32)
    batches = [images[i : i + 32] for i in range(0, samples, 32)]
    calibration = images if form == FORMS[0] else batches
    start = time.perf_counter()
    opt = infertune.optimize(
        model, sample, precision=("fp32", "int8"), calibration=calibration,
        backends=["onnxruntime-cpu", "onnxruntime-cpu-int8-static"], verbose=False,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    peak = opt.report.to_dict()["memory"]["peak_bytes"]
    opt.close()
    return {
        "form": form,
        "optimize_s": round(seconds, 1),
        "report_peak_gb": round(peak / 1e9, 2),
        "max_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--side", type=int, default=224)
    parser.add_argument("--json", help="write the result here as JSON")
    parser.add_argument("--child", choices=FORMS, help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        harness.write_child_result(args.child_out, child(args.child, args.samples, args.side))
        return
    rows = []
    for form in FORMS:
        sizes = ["--samples", str(args.samples), "--side", str(args.side)]
        with tempfile.TemporaryDirectory() as tmp:  # the child's output, its tail on failure
            rows.append(harness.run_in_child(__file__, form, sizes, log_file=Path(tmp) / "log"))
        if "error" in rows[-1]:
            raise SystemExit(f"{form}: {rows[-1]['error']}")
        print(rows[-1], flush=True)
    ratio = rows[0]["max_rss_gb"] / rows[1]["max_rss_gb"]
    print(f"peak resident memory, one array / batches of 32: {ratio:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "memory_ratio": ratio, "samples": args.samples}, f, indent=1)


if __name__ == "__main__":
    main()
