"""What isolation costs: optimize() time with isolation="process", "thread" and "off".

From the repository's root:

    python -m benchmarks.studies.isolation [--model small-cnn] [--repeats 3] [--json FILE]

One process, the model built once; the modes alternate (off, thread, process, off, ...) so
that drift of a shared machine hits them alike. Reports the median optimize() time of each mode
and its ratio to "off". The measurement budget is fixed (time_budget_s is not used), so the
difference is the isolation: threads per stage, the child process's start, the files it reads
and its second compile of each native candidate.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MODES = ("off", "thread", "process")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="small-cnn")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the result here as JSON")
    args = parser.parse_args()

    import infertune
    from infertune.demo import demo_model

    model, x = demo_model(args.model)
    infertune.optimize(model, x, isolation="off", verbose=False)  # imports, peak measurement
    seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
    chosen: dict[str, list[str]] = {mode: [] for mode in MODES}
    for _ in range(args.repeats):
        for mode in MODES:
            start = time.perf_counter()
            opt = infertune.optimize(model, x, isolation=mode, verbose=False)
            seconds[mode].append(time.perf_counter() - start)
            chosen[mode].append(opt.backend)
    off = statistics.median(seconds["off"])
    result = {
        mode: {
            "median_s": statistics.median(seconds[mode]),
            "ratio_to_off": statistics.median(seconds[mode]) / off,
            "runs_s": seconds[mode],
            "chosen": chosen[mode],
        }
        for mode in MODES
    }
    print(f"optimize() on {args.model}, median of {args.repeats} runs each, modes alternating:")
    for mode, r in result.items():
        print(f"  isolation={mode!r:10s} {r['median_s']:6.2f} s  {r['ratio_to_off']:.2f}x off")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(
                {"model": args.model, "repeats": args.repeats, "modes": result}, out, indent=2
            )


if __name__ == "__main__":
    main()
