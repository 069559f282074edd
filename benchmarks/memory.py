"""Memory after optimize(): what the rejected candidates held must be released.

python benchmarks/memory.py [--model mobilenet-v2] [--batch 1] [--json FILE]

Two fresh processes, each building the demo model and calling it once before it measures its
resident memory (VmRSS): one runs optimize() over every candidate, the other optimize() with
only the candidate the first one chose. What the first process holds beyond the second is what
the rejected candidates left behind. Both also report the temporary files left by optimize().
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

CHILD = """
import gc, json, os, sys, tempfile
tmp = tempfile.mkdtemp(prefix="memory-bench-")
tempfile.tempdir = tmp  # every temporary file infertune writes lands here
import numpy as np
import infertune
from infertune.demo import demo_model

def rss_mb():
    # resident memory: all of it, and the anonymous part (heap, not library code)
    found = {{}}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon"):
                found[key] = int(value.split()[0]) / 1024
    return found

model, x = demo_model({model!r}, batch={batch!r})
model(x)
gc.collect()
before = rss_mb()
opt = infertune.optimize(model, x, backends={backends!r}, verbose=False)
gc.collect()
after = rss_mb()
left = sorted(os.listdir(tmp))
print(json.dumps({{"before_mb": before, "after_mb": after, "chosen": opt.backend,
                  "tmp_files_left": left}}))
"""


def measure(model: str, batch: int | None, backends: list[str] | None) -> dict:
    """Run one child process; return what it measured."""
    code = textwrap.dedent(CHILD.format(model=model, batch=batch, backends=backends))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the measuring process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(model: str, batch: int | None, backends: list[str] | None = None) -> dict:
    """Every candidate (or `backends`) against the chosen one alone, in two fresh processes."""
    every = measure(model, batch, backends)
    alone = measure(model, batch, [every["chosen"]])
    result = {"model": model, "batch": batch, "chosen": every["chosen"]}
    for kind in ("VmRSS", "RssAnon"):
        grown_every = every["after_mb"][kind] - every["before_mb"][kind]
        grown_alone = alone["after_mb"][kind] - alone["before_mb"][kind]
        result[kind] = {
            "grown_every_candidate_mb": grown_every,
            "grown_chosen_alone_mb": grown_alone,
            "left_by_rejected_mb": grown_every - grown_alone,
        }
    left = every["tmp_files_left"] + alone["tmp_files_left"]
    # TensorFlow's autograph writes the source of every converted function to a temporary
    # file and deletes it at exit (atexit): TensorFlow's, not infertune's.
    result["autograph_sources"] = sum(name.startswith(AUTOGRAPH) for name in left)
    result["tmp_files_left"] = [name for name in left if not name.startswith(AUTOGRAPH)]
    return result


AUTOGRAPH = "__autograph_generated_file"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="mobilenet-v2")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--backends", help="comma-separated candidates (default: every one)")
    parser.add_argument("--json", help="write the result here as JSON")
    args = parser.parse_args()
    backends = args.backends.split(",") if args.backends else None
    result = compare(args.model, args.batch, backends)
    print(f"{result['model']}, chosen {result['chosen']}; resident memory after optimize():")
    print("              every candidate  chosen alone  left by the rejected")
    for kind in ("VmRSS", "RssAnon"):
        r = result[kind]
        print(
            f"  {kind:8s}  {r['grown_every_candidate_mb']:+12.1f} MB  "
            f"{r['grown_chosen_alone_mb']:+9.1f} MB  {r['left_by_rejected_mb']:+13.1f} MB"
        )
    print(
        f"temporary files left: {result['tmp_files_left'] or 'none'} (besides "
        f"{result['autograph_sources']} autograph sources TensorFlow deletes at exit)"
    )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)


if __name__ == "__main__":
    main()
