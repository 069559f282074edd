"""Memory estimates across sizes: a machine record learned on small and mid-sized models must
not shut a large model's candidates out.

From the repository's root:

    python -m benchmarks.studies.memory_record [--models resnet50,resnet101,xception]
                                               [--side 96] [--large recommender] [--quick]
                                               [--json FILE]

1. A fresh machine record (INFERTUNE_MACHINE_FILE in a temporary directory) is built by
   tuning keras.applications models of 64-256 MB of weights (random weights, small images,
   ONNX Runtime only: what records an ONNX export's peak), each in a child process, as a
   user's day of tuning mid-sized models would.
2. What the record holds for the ONNX export, and what it predicts for benchmarks/large.py's
   2.46 GB embedding model: the rule before 2026-11-26 (one factor, the mean of the learned
   copies of the weights) and today's (pipeline/memory.py: per-byte copies only from models
   of 256 MB or more, a fixed cost from the smaller ones).
3. benchmarks/large.py's large model tuned with that record (`large.py --no-by-hand`, its
   result folder a temporary one): the statuses of its ONNX Runtime and OpenVINO
   candidates, and their peaks.

`--quick` builds the record from two small models and tunes large.py's quick model: a smoke
test of the script, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import harness

MODELS = ("resnet50", "resnet101", "xception")
_APPLICATIONS = {  # --models' names, and --quick's two (a child process reads them here)
    "resnet50": "ResNet50",
    "resnet101": "ResNet101",
    "xception": "Xception",
    "mobilenetv2": "MobileNetV2",
    "densenet121": "DenseNet121",
}


def tune_one(name: str, side: int) -> dict:
    """In a child: optimize() one keras.applications model with ONNX Runtime only."""
    import keras
    import numpy as np

    import infertune

    build = getattr(keras.applications, _APPLICATIONS.get(name, name))
    model = build(weights=None, input_shape=(side, side, 3), include_top=False, pooling="avg")
    sample = np.random.default_rng(0).random((1, side, side, 3), dtype=np.float32)
    opt = infertune.optimize(model, sample, backends=["onnxruntime-cpu"], verbose=False)
    memory = opt.report.memory or {}
    return {"model": name, "weights_bytes": memory.get("weights_bytes")}


def estimates(record: Path, weights: int) -> dict:
    """What the record predicts for the ONNX export of a model of `weights` bytes."""
    from infertune.pipeline.machine import MachineRecord
    from infertune.pipeline.memory import LEARN_PER_BYTE_MIN_BYTES, conversion_bytes
    from infertune.system.environment import (
        collect_environment,
        fingerprint,
    )

    os.environ["INFERTUNE_MACHINE_FILE"] = str(record)
    machine = MachineRecord(fingerprint(collect_environment()))
    runs = machine.memory_runs("onnx")
    factors = [peak / w for w, peak in runs]
    old = (sum(factors) / len(factors)) * weights if factors else None
    new, how = conversion_bytes("onnx", machine, weights)
    return {
        "runs": runs,
        "per_byte_from": LEARN_PER_BYTE_MIN_BYTES,
        "old_rule_gb": None if old is None else old / 1e9,
        "new_rule_gb": new / 1e9,
        "new_rule": how,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--side", type=int, default=96, help="image side of the small models")
    parser.add_argument("--large", default="recommender", help="benchmarks/large.py's model")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        harness.write_child_result(args.child_out, tune_one(args.child, args.side))
        return
    models = ["mobilenetv2", "densenet121"] if args.quick else args.models.split(",")
    with tempfile.TemporaryDirectory(prefix="infertune-memory-record-") as tmp:
        record = Path(tmp) / "machine.json"
        env = {**os.environ, "INFERTUNE_MACHINE_FILE": str(record), "TF_CPP_MIN_LOG_LEVEL": "2"}
        tuned = []
        for name in models:
            log = Path(tmp) / f"{name}.log"
            done = harness.run_in_child(__file__, name, ["--side", str(args.side)], env=env,
                                        log_file=log)  # fmt: skip
            if "error" in done:
                print(f"{name}: failed: {done['error'][-500:]}", file=sys.stderr)
                continue
            tuned.append(done)
            print(f"tuned {name}: {tuned[-1]['weights_bytes'] / 1e6:.0f} MB of weights")
        large_weights = 600_000 * 1024 * 4 if not args.quick else 60_000 * 64 * 4
        found = estimates(record, large_weights)
        print(f"record: {found['runs']}")
        old = found["old_rule_gb"]
        print(
            f"ONNX export of the {large_weights / 1e9:.2f} GB model: "
            f"{'-' if old is None else f'{old:.1f}'} GB by one learned factor, "
            f"{found['new_rule_gb']:.1f} GB by fixed + per-byte ({found['new_rule']})"
        )
        out = Path(tmp) / "large"
        command = [
            sys.executable, str(harness.BENCHMARKS / "large.py"), "--models", args.large,
            "--no-by-hand", "--out", str(out), *(["--quick"] if args.quick else []),
        ]  # fmt: skip
        subprocess.run(command, env=env, check=True)
        large = json.loads((out / "results.json").read_text())["rows"]
        found["large"] = large
        statuses = {}
        for result in large:
            for c in result.get("candidates", []):
                if c["name"] in ("onnxruntime-cpu", "openvino-cpu"):
                    statuses[c["name"]] = (c["status"], (c.get("reason") or "")[:200])
        for name, (status, reason) in statuses.items():
            print(f"{args.large}: {name}: {status} {reason}")
        found["statuses"] = statuses
        found["tuned"] = tuned
    if args.json:
        args.json.write_text(json.dumps(found, indent=1, default=str))


if __name__ == "__main__":
    main()
