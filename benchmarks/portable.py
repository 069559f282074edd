"""Tune where it runs: a package made here with TensorFlow, tuned in a fresh virtual
environment without TensorFlow, against optimize() on the model itself.

python benchmarks/portable.py [--models small-cnn,mobilenet-v2] [--venv DIR] [--out DIR]
                              [--json FILE]

For each model (infertune.demo's), in child processes:

1. `infertune.optimize(model, x)` where TensorFlow is (its time, its choice);
2. `infertune.package(model, x, dir)` (its time, the package's size);
3. `infertune.optimize(dir)` in a virtual environment that has infertune (installed with
   --no-deps) and numpy, onnx and the CPU runtimes, but no TensorFlow or Keras: its time, its
   choice and the p50 of both choices there, the process's import time of infertune and its
   peak resident memory.

Same choice: the package's tuning chooses what optimize() chose, or one within the measured
spread of it there (both p50s given). The virtual environment is made once under --venv
(default: a temporary directory, removed after) from the project's own files and
constraints.txt.

Results: docs/benchmarks/portable/<date>/ (--out).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness

BENCHMARK = "portable"
ROOT = harness.ROOT
MODELS = ("small-cnn", "mobilenet-v2")
RUNTIMES = ("numpy", "onnx", "onnxruntime", "openvino", "ai-edge-litert", "nncf")


def with_tensorflow(name: str, package_dir: Path) -> dict:
    """In a child: optimize() on the model, then its package."""
    import infertune
    from infertune.demo import demo_model

    model, sample = demo_model(name)
    start = time.perf_counter()
    opt = infertune.optimize(model, sample, verbose=False)
    optimize_s = time.perf_counter() - start
    start = time.perf_counter()
    infertune.package(model, sample, package_dir, verbose=False)
    package_s = time.perf_counter() - start
    size = sum(f.stat().st_size for f in package_dir.rglob("*") if f.is_file())
    return {
        "optimize_s": optimize_s,
        "chosen": opt.backend,
        "p50": {c.name: c.p50 for c in opt.report.candidates if c.p50},
        "package_s": package_s,
        "package_mb": size / 1e6,
    }


def without_tensorflow(package_dir: Path) -> dict:
    """In the venv without TensorFlow: import time, tuning, peak memory."""
    import resource

    start = time.perf_counter()
    import infertune

    import_s = time.perf_counter() - start
    start = time.perf_counter()
    opt = infertune.optimize(package_dir, verbose=False)
    tune_s = time.perf_counter() - start
    return {
        "import_s": import_s,
        "tune_s": tune_s,
        "chosen": opt.backend,
        "p50": {c.name: c.p50 for c in opt.report.candidates if c.p50},
        "statuses": {c.name: c.status for c in opt.report.candidates},
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3,
        "tensorflow_imported": "tensorflow" in sys.modules,
    }


def make_venv(venv: Path) -> Path:
    """A venv with infertune (no dependencies) and the CPU runtimes, no TensorFlow."""
    python = venv / "bin" / "python"
    if python.exists():
        return python
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q", "-c", str(ROOT / "constraints.txt")]
    subprocess.run([*pip, "pip>=25", "setuptools>=77"], check=True)
    subprocess.run([*pip, "--no-deps", str(ROOT)], check=True)
    subprocess.run([*pip, *RUNTIMES], check=True)
    found = subprocess.run(
        [str(python), "-c", "import importlib.util as u; print(u.find_spec('tensorflow'))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    if found.stdout.strip() != "None":
        raise SystemExit(f"the venv {venv} has TensorFlow: not the setting measured here")
    return python


def child(python: str, role: str, name: str, package_dir: Path) -> dict:
    """The model `name`'s `role` ("with": TensorFlow's side, "without": the venv's) in a child
    process run by `python`."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    if role == "without":
        env.pop("PYTHONPATH", None)  # the venv's own infertune, not the checkout's path
    args = ["--role", role, "--package", str(package_dir)]
    log = package_dir.parent / f"{name}-{role}.log"  # the child's output, its tail on failure
    return harness.run_in_child(__file__, name, args, python=python, env=env, log_file=log)


def table(rows: list[dict]) -> dict:
    head = [
        "model", "optimize() s", "chose", "package MB", "package s", "tuned from it s (no TF)",
        "chose there", "same or within spread", "import s", "peak RSS MB",
    ]  # fmt: skip
    cells = []
    for r in rows:
        a, b = r["with"], r["without"]
        if "error" in a or "error" in b:
            cells.append([r["model"], f"error: {(a.get('error') or b.get('error'))[:80]}"])
            continue
        same = "same" if a["chosen"] == b["chosen"] else (
            f"{a['chosen']} {b['p50'].get(a['chosen'], float('nan')):.4g} ms against "
            f"{b['chosen']} {b['p50'][b['chosen']]:.4g} ms there"
        )  # fmt: skip
        cells.append(
            [
                r["model"],
                f"{a['optimize_s']:.1f}",
                a["chosen"],
                f"{a['package_mb']:.1f}",
                f"{a['package_s']:.1f}",
                f"{b['tune_s']:.1f}",
                b["chosen"],
                same,
                f"{b['import_s']:.2f}",
                f"{b['peak_rss_mb']:.0f}",
            ]
        )
    return harness.table(head, cells)


def main() -> int:
    parser = harness.parser(__doc__, "--out", "--json", child=True)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--venv", type=Path, help="the TensorFlow-free venv (made if missing)")
    parser.add_argument("--role", choices=("with", "without"), help=argparse.SUPPRESS)
    parser.add_argument("--package", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.role == "with":
            result = with_tensorflow(args.child, args.package)
        else:
            result = without_tensorflow(args.package)
        harness.write_child_result(args.child_out, result)
        return 0
    with tempfile.TemporaryDirectory(prefix="infertune-portable-") as tmp:
        venv = args.venv or Path(tmp) / "venv"
        start = time.perf_counter()
        python = make_venv(venv)
        harness.log(
            "portable", f"TensorFlow-free venv ready in {time.perf_counter() - start:.0f} s: {venv}"
        )
        rows = []
        for name in args.models.split(","):
            package_dir = Path(tmp) / f"{name}.package"
            row = {"model": name, "with": child(sys.executable, "with", name, package_dir)}
            row["without"] = child(str(python), "without", name, package_dir)
            rows.append(row)
    data = harness.results(
        BENCHMARK,
        about=harness.about(__doc__),
        notes="optimize() on the model where TensorFlow is, against optimize() on its package "
        "in a virtual environment without TensorFlow; both p50s given where the choices differ.",
        rows=rows,
        tables=[table(rows)],
        headline={
            f"{r['model']}: same choice": r["with"].get("chosen") == r["without"].get("chosen")
            for r in rows
        },
    )
    harness.publish(data, args.out, args.json)
    return 0  # a child's failure is its row of the table


if __name__ == "__main__":
    sys.exit(main())
