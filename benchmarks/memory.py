"""Memory after optimize(): what the rejected candidates held must be released.

python benchmarks/memory.py [--model mobilenet-v2|dense-MB] [--batch 1] [--backends A,B]
                            [--per-candidate] [--out DIR] [--json FILE]

Two fresh processes, each building the demo model and calling it once before it measures its
resident memory (VmRSS): one runs optimize() over every candidate, the other optimize() with
only the candidate the first one chose. What the first process holds beyond the second is what
the rejected candidates left behind. Both also report the temporary files left by optimize().
A third process runs every candidate with the final heap trim turned off (system/resources.py) and
trims once optimize() has returned: the difference is what the trim hands back to the OS.
`--model dense-100` is three Dense layers holding 100 MB of weights: what stays behind should
not grow with the model. `--per-candidate` instead runs optimize() with one candidate at a
time, every candidate in turn, twice, in one process: what each leaves behind.

Results: docs/benchmarks/memory/<date>/ (--out).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import harness

BENCHMARK = "memory"

CHILD = """
import gc, json, os, sys, tempfile
tmp = tempfile.mkdtemp(prefix="memory-bench-")
tempfile.tempdir = tmp  # every temporary file infertune writes lands here
import numpy as np
import infertune
import infertune.system.resources
from infertune.demo import demo_model

if {no_trim!r}:  # what optimize() would hold without handing freed heap back to the OS
    infertune.system.resources._malloc_trim = lambda: None

def rss_mb():
    # resident memory: all of it, and the anonymous part (heap, not library code)
    found = {{}}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon"):
                found[key] = int(value.split()[0]) / 1024
    return found

def dense(megabytes, batch):
    # three square float32 Dense layers holding about `megabytes` of weights
    import keras
    width = int((megabytes * 2**20 / 4 / 3) ** 0.5)
    layers = [keras.layers.Dense(width) for _ in range(3)]
    model = keras.Sequential([keras.Input((width,)), *layers])
    return model, np.random.default_rng(0).random((batch or 1, width), dtype=np.float32)

name = {model!r}
if name.startswith("dense-"):
    model, x = dense(int(name.split("-")[1]), {batch!r})
else:
    model, x = demo_model(name, batch={batch!r})
model(x)
gc.collect()
before = rss_mb()
after, dropped, chosen, trimmed = [], [], [], []
for backends in {runs!r}:  # one optimize() per entry, in this one process
    opt = infertune.optimize(model, x, backends=backends, verbose=False)
    gc.collect()
    after.append(rss_mb())  # with the result alive
    if {no_trim!r}:  # what a trim at this point hands back: the trim optimize() skipped
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        trimmed.append(rss_mb())
    chosen.append(opt.backend)
    del opt
    infertune.system.resources.release_freed_memory()
    dropped.append(rss_mb())  # what the run left behind once its result is gone
left = sorted(os.listdir(tmp))
print(json.dumps({{"before_mb": before, "after_mb": after, "dropped_mb": dropped,
                  "trimmed_mb": trimmed, "chosen": chosen, "tmp_files_left": left}}))
"""


def measure(
    model: str, batch: int | None, runs: list[list[str] | None], no_trim: bool = False
) -> dict:
    """Run one child process that calls optimize(backends=r) for each r in `runs`; return
    what it measured, per run: `after_mb` with its result alive, `dropped_mb` once the result
    is dropped and freed, and `chosen`."""
    code = CHILD.format(model=model, batch=batch, runs=runs, no_trim=no_trim)
    return harness.fresh_process(code)


def compare(model: str, batch: int | None, backends: list[str] | None = None) -> dict:
    """Every candidate (or `backends`) against the chosen one alone, in two fresh processes."""
    every = measure(model, batch, [backends])
    chosen = every["chosen"][0]
    alone = measure(model, batch, [[chosen]])
    untrimmed = measure(model, batch, [backends], no_trim=True)
    result = {"model": model, "batch": batch, "chosen": chosen}
    for kind in ("VmRSS", "RssAnon"):
        grown_every = every["after_mb"][0][kind] - every["before_mb"][kind]
        grown_alone = alone["after_mb"][0][kind] - alone["before_mb"][kind]
        result[kind] = {
            "grown_every_candidate_mb": grown_every,
            "grown_chosen_alone_mb": grown_alone,
            "left_by_rejected_mb": grown_every - grown_alone,
            # In a run with the trim off: what a trim right after optimize() hands back.
            "trim_returns_mb": untrimmed["after_mb"][0][kind] - untrimmed["trimmed_mb"][0][kind],
        }
    left = every["tmp_files_left"] + alone["tmp_files_left"]
    # TensorFlow's autograph writes the source of every converted function to a temporary
    # file and deletes it at exit (atexit): TensorFlow's, not infertune's.
    result["autograph_sources"] = sum(name.startswith(AUTOGRAPH) for name in left)
    result["tmp_files_left"] = [name for name in left if not name.startswith(AUTOGRAPH)]
    return result


AUTOGRAPH = "__autograph_generated_file"


def per_candidate(model: str, batch: int | None, rounds: int = 2) -> list[dict]:
    """One process: optimize() with one candidate at a time, every candidate in turn, for
    `rounds` rounds; the anonymous memory each run left behind once its result was dropped.
    The first round shows what each runtime keeps once it has run; later rounds, whether
    anything grows with every call."""
    from infertune.backends.registry import BACKENDS

    names = [
        name
        for name, make in BACKENDS.items()
        if make().precision == "fp32" and make().available() is None  # those that run here
    ]
    measured = measure(model, batch, [[name] for name in names] * rounds)
    rows, previous = [], measured["before_mb"]["RssAnon"]
    for i, dropped in enumerate(measured["dropped_mb"]):
        rows.append(
            {
                "round": i // len(names) + 1,
                "candidate": names[i % len(names)],
                "left_mb": dropped["RssAnon"] - previous,
            }
        )
        previous = dropped["RssAnon"]
    return rows


KINDS = ("VmRSS", "RssAnon")


def compare_table(result: dict) -> dict:
    rows = [
        [
            kind,
            f"{r['grown_every_candidate_mb']:+.1f} MB",
            f"{r['grown_chosen_alone_mb']:+.1f} MB",
            f"{r['left_by_rejected_mb']:+.1f} MB",
            f"{r['trim_returns_mb']:.1f} MB",
        ]
        for kind, r in ((kind, result[kind]) for kind in KINDS)
    ]
    return harness.table(
        ["", "every candidate", "chosen alone", "left by the rejected", "the trim returns"],
        rows,
        f"{result['model']}, chosen {result['chosen']}; resident memory after optimize():",
    )


def per_candidate_table(model: str, rows: list[dict]) -> dict:
    return harness.table(
        ["round", "candidate", "left behind"],
        [[row["round"], row["candidate"], f"{row['left_mb']:+.1f} MB"] for row in rows],
        f"{model}: anonymous memory left behind by each optimize(backends=[one])",
    )


def main() -> int:
    parser = harness.parser(__doc__, "--out", "--json")
    parser.add_argument("--model", default="mobilenet-v2")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--backends", help="comma-separated candidates (default: every one)")
    parser.add_argument("--per-candidate", action="store_true",
                        help="instead: what each candidate leaves behind, one at a time, "
                        "in one process, two rounds")  # fmt: skip
    args = parser.parse_args()
    if args.per_candidate:
        rows = per_candidate(args.model, args.batch)
        data = harness.results(
            BENCHMARK,
            about=harness.about(__doc__),
            notes="--per-candidate: one process, optimize() with one candidate at a time, "
            "every candidate in turn, two rounds; the anonymous memory (RssAnon) each run left "
            "behind once its result was dropped.",
            rows=rows,
            tables=[per_candidate_table(args.model, rows)],
            model=args.model,
        )
        harness.publish(data, args.out, args.json)
        return 0
    backends = args.backends.split(",") if args.backends else None
    result = compare(args.model, args.batch, backends)
    notes = (
        f"Temporary files left: {result['tmp_files_left'] or 'none'} (besides "
        f"{result['autograph_sources']} autograph sources TensorFlow deletes at exit)."
    )
    data = harness.results(
        BENCHMARK,
        about=harness.about(__doc__),
        notes=notes,
        rows=[result],
        tables=[compare_table(result)],
        headline={
            f"{kind}: left by the rejected, MB": result[kind]["left_by_rejected_mb"]
            for kind in KINDS
        },
    )
    harness.publish(data, args.out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
