"""LiteRT on two threads has a slow state: why the small CNN's choice between `litert` and
`litert:threads=1` wavers.

On the demo's small CNN (13 us a call on LiteRT's two threads), infertune's `litert` and
`litert:threads=1` are prepared in a process where no other runtime is, then timed in turn
in windows of 0.2 s each (the median call of each window), 0.1 s apart, for --seconds.
Printed: how many windows found `litert` slow (over 18 us a call), when the first was, and
`litert:threads=1`'s range, in the same windows.

From the repository's root:

    python -m benchmarks.studies.litert_two_threads [--seconds 60]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

from benchmarks import harness
from infertune.backends.registry import BACKENDS
from infertune.demo import demo_model
from infertune.model.inputs import build_signature
from infertune.model.source import load_model
from infertune.model.target import Target

NAMES = ("litert", "litert:threads=1")
WINDOW_S = 0.2
SLOW_US = 18.0


def window_p50_us(run, flat) -> float:
    times, start = [], time.perf_counter()
    while time.perf_counter() - start < WINDOW_S:
        begin = time.perf_counter()
        run(flat)
        times.append(time.perf_counter() - begin)
    return 1e6 * float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    print(harness.machine_description())
    model, x = demo_model("small-cnn")
    source = load_model(model)
    signature, flat = build_signature(x, source.declared_inputs, source.default_float)
    reference, structure = source.call_flat(signature, flat)
    target = Target(source, signature, structure, [r.dtype for r in reference])
    runs = {}
    for name in NAMES:
        backend = BACKENDS[name]()
        backend.name = name
        backend.prepare(target)
        runs[name] = backend.run
    windows, end = [], time.perf_counter() + args.seconds
    while time.perf_counter() < end:
        windows.append(tuple(window_p50_us(runs[name], flat) for name in NAMES))
        time.sleep(0.1)
    slow = [i for i, (two, _) in enumerate(windows) if two > SLOW_US]
    fast_two = [two for two, _ in windows if two <= SLOW_US]
    one = [single for _, single in windows]
    print(f"\n| windows | `litert` slow (> {SLOW_US:g} us) | first slow | `litert` fast / slow, "
          f"us | `litert:threads=1`, us |")  # fmt: skip
    print("|---|---|---|---|---|")
    slow_us = f"{np.median([windows[i][0] for i in slow]):.1f}" if slow else "-"
    fast_us = f"{np.median(fast_two):.1f}" if fast_two else "-"
    first = f"window {slow[0] + 1}" if slow else "-"
    print(f"| {len(windows)} | {len(slow)} | {first} | {fast_us} / {slow_us} | "
          f"{min(one):.1f}-{max(one):.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
