"""Start-up and tuning-cache benchmark: the numbers docs/deploy.md quotes.

python benchmarks/startup.py [--model small-cnn] [--repeats 5] [--backends A,B] [--json FILE]

1. Deploy start-up, each in a fresh process: `import infertune` + `infertune.load(dir)` of a
   saved ONNX Runtime result + the first call, against `import keras` +
   `keras.models.load_model(file)` + the first `model(x)`. Times inside the process
   (perf_counter from the first import) and the process's whole wall time (interpreter start
   included). The deploy process also reports whether TensorFlow was imported.
2. Tuning cache: optimize(model, x, cache=DIR) in a fresh process with an empty cache (a full
   tuning run, every candidate or --backends), then again in fresh processes (cache hits).
   Timed around the optimize() call only: TensorFlow's import and building the model are
   excluded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

DEPLOY = """
import time
start = time.perf_counter()
import sys, json
import numpy as np
import infertune
imported = time.perf_counter()
opt = infertune.load({saved!r})
loaded = time.perf_counter()
opt(np.random.default_rng(0).random({shape!r}, dtype=np.float32))
called = time.perf_counter()
print(json.dumps({{"import_s": imported - start, "load_s": loaded - imported,
                  "first_call_s": called - loaded, "backend": opt.backend,
                  "tensorflow_imported": "tensorflow" in sys.modules}}))
"""

KERAS = """
import time
start = time.perf_counter()
import json
import numpy as np
import keras
imported = time.perf_counter()
model = keras.models.load_model({keras_file!r}, compile=False)
loaded = time.perf_counter()
model(np.random.default_rng(0).random({shape!r}, dtype=np.float32)).numpy()
called = time.perf_counter()
print(json.dumps({{"import_s": imported - start, "load_s": loaded - imported,
                  "first_call_s": called - loaded}}))
"""

TUNE = """
import json, time
import infertune
from infertune.demo import demo_model
model, sample = demo_model({model!r})
start = time.perf_counter()
opt = infertune.optimize(model, sample, backends={backends!r}, cache={cache!r}, verbose=False)
seconds = time.perf_counter() - start
print(json.dumps({{"optimize_s": seconds, "from_cache": opt.report.from_cache,
                  "backend": opt.backend}}))
"""


def fresh_process(code: str) -> dict:
    """Run `code` in a new interpreter; its last stdout line (JSON) plus the wall time."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"benchmark process failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_wall_s"] = wall
    return result


def median_of(runs: list[dict]) -> dict:
    keys = [k for k, v in runs[0].items() if isinstance(v, float)]
    summary = {k: statistics.median(run[k] for run in runs) for k in keys}
    summary["in_process_s"] = summary["import_s"] + summary["load_s"] + summary["first_call_s"]
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small-cnn")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--backends", help="candidates for the cache runs (default: all)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    import infertune
    from infertune.demo import demo_model

    model, sample = demo_model(args.model)
    shape = tuple(sample.shape)
    with tempfile.TemporaryDirectory(prefix="infertune-startup-") as tmp:
        tmp = Path(tmp)
        keras_file = tmp / "model.keras"
        model.save(keras_file)
        opt = infertune.optimize(model, sample, backends=["onnxruntime-cpu"], verbose=False)
        saved = opt.save(tmp / "saved")
        print(f"[startup] {args.model}: saved {opt.backend} result; fresh processes follow")

        deploy = [fresh_process(DEPLOY.format(saved=str(saved), shape=shape))]
        keras_runs = [fresh_process(KERAS.format(keras_file=str(keras_file), shape=shape))]
        for _ in range(args.repeats - 1):  # alternate, so that drift hits both alike
            deploy.append(fresh_process(DEPLOY.format(saved=str(saved), shape=shape)))
            keras_runs.append(fresh_process(KERAS.format(keras_file=str(keras_file), shape=shape)))

        backends = args.backends.split(",") if args.backends else None
        tune = TUNE.format(model=args.model, cache=str(tmp / "cache"), backends=backends)
        first = fresh_process(tune)
        hits = [fresh_process(tune) for _ in range(max(3, args.repeats // 2))]

    d, k = median_of(deploy), median_of(keras_runs)
    hit_s = statistics.median(run["optimize_s"] for run in hits)
    results = {
        "model": args.model,
        "repeats": args.repeats,
        "deploy_onnxruntime": d,
        "tensorflow_imported_by_deploy": any(run["tensorflow_imported"] for run in deploy),
        "keras_load_model": k,
        "startup_speedup_in_process": k["in_process_s"] / d["in_process_s"],
        "startup_speedup_process_wall": k["process_wall_s"] / d["process_wall_s"],
        "cache_backends": backends or "all",
        "cache_first_optimize_s": first["optimize_s"],
        "cache_first_backend": first["backend"],
        "cache_hit_optimize_s": hit_s,
        "cache_hits_all_from_cache": all(run["from_cache"] for run in hits),
        "cache_hit_share_of_first": hit_s / first["optimize_s"],
    }

    def row(label: str, r: dict) -> str:
        cells = [r["import_s"], r["load_s"], r["first_call_s"], r["in_process_s"]]
        cells.append(r["process_wall_s"])
        return f"{label:<34}" + "".join(f"{v:>12.3f}" for v in cells)

    print()
    print(f"Start-up to the first result, {args.model}, median of {args.repeats} fresh processes")
    print(f"{'':<34}{'import s':>12}{'load s':>12}{'1st call s':>12}{'total s':>12}{'wall s':>12}")
    print(row("import infertune + load (ORT)", d))
    print(row("import keras + load_model", k))
    print(
        f"infertune.load is {results['startup_speedup_in_process']:.1f}x faster in process, "
        f"{results['startup_speedup_process_wall']:.1f}x by process wall time; TensorFlow "
        f"imported by the deploy process: {results['tensorflow_imported_by_deploy']}"
    )
    print()
    print(
        f"Tuning cache, {args.model}, candidates: {args.backends or 'all'} (TensorFlow's import "
        f"and the model build excluded)"
    )
    share = 100 * results["cache_hit_share_of_first"]
    print(
        f"first optimize(): {first['optimize_s']:.2f} s ({first['backend']}); cache hit: "
        f"{hit_s:.3f} s (median of {len(hits)} fresh processes, all from cache: "
        f"{results['cache_hits_all_from_cache']}) = {share:.2f}% of the first (target under 10%)"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
