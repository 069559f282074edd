"""What keeping layers in float32 costs a quantized candidate: its p50 quantized throughout and
with the first 1, 2, ... layers of infertune's ranking kept in float32, timed interleaved.

A quantized candidate that fails the gate is searched (pipeline/precision.py) only where,
quantized throughout, it is at most SEARCH_FASTER times as slow as the fastest candidate
verified; each layer kept in float32 slows it, and by how much decides whether a candidate a
little faster throughout can stay faster once it keeps some. Per model of the precision
benchmark (trained, from its cache: run benchmarks/precision.py once first), the layers are
ranked as the search ranks them (pipeline/precision.py `ranking_inputs`,
backends/onnxruntime/quantize.py
`layer_errors`), each candidate is prepared as optimize() prepares it (the same backends,
calibrated on the benchmark's 128 calibration samples) throughout and with the first
`--kept` layers kept, and every variant is timed interleaved at batch 1 on the sample
(infertune.pipeline.timing.measure_interleaved; `--rounds` repetitions). Reported: each variant's
p50 and its ratio to the same candidate throughout.

From the repository's root:

    python -m benchmarks.studies.kept_layers --models resnet50-224,bert-encoder --kept 2 --rounds 2
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from benchmarks import bench_models
from benchmarks.bench_models import ranked_layers, target_of

CANDIDATES = ("openvino-cpu-int8", "litert-int8", "onnxruntime-cpu-int8-static")


def one_model(name: str, kept: int, rounds: int, budget: float, cache: Path) -> None:
    from infertune.backends.registry import BACKENDS
    from infertune.pipeline.timing import measure_interleaved

    model, data = bench_models.cached_model(name, cache)
    calibration = data.x("calibration")
    sample = [calibration[:1]]
    target = target_of(model, calibration[:1])
    target.calibration = [[calibration]]
    layers = ranked_layers(target)[:kept]
    print(f"{name}: the first {kept} layers ranked: {', '.join(layers)}")
    prepared = {}
    for candidate in CANDIDATES:
        throughout = BACKENDS[candidate]()
        variants = [throughout] + [
            throughout.variant(keep=tuple(layers[:k])) for k in range(1, kept + 1)
        ]
        for k, backend in enumerate(variants):
            start = time.perf_counter()
            try:
                backend.prepare(target)
                backend.run(sample)
            except Exception as exc:  # a candidate that cannot run here is said and left out
                print(f"  {candidate} with {k} kept: failed ({type(exc).__name__}: {exc})")
                break
            prepared[(candidate, k)] = backend
            print(f"  {candidate} with {k} kept: prepared in {time.perf_counter() - start:.1f} s")
    for round_ in range(rounds):
        measured = measure_interleaved(
            {key: (lambda b=b: b.run(sample)) for key, b in prepared.items()},
            budget_s=budget,
            min_rounds=5,
        )
        p50 = {key: s.p50 for key, s in measured.stats.items() if s.p50 is not None}
        for candidate in CANDIDATES:
            base = p50.get((candidate, 0))
            if base is None:
                continue
            steps = [
                f"{k} kept {p50[(candidate, k)]:.3g} ms ({p50[(candidate, k)] / base:.2f}x)"
                for k in range(1, kept + 1)
                if (candidate, k) in p50
            ]
            print(
                f"  round {round_ + 1}, {candidate}: throughout {base:.3g} ms; {'; '.join(steps)}"
            )
    for backend in prepared.values():
        backend.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="resnet50-224,bert-encoder")
    parser.add_argument("--kept", type=int, default=2, help="layers kept, at most")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved timings")
    parser.add_argument("--budget", type=float, default=10.0, help="s per timing")
    parser.add_argument("--cache", type=Path, default=bench_models.DEFAULT_CACHE.expanduser())
    args = parser.parse_args()
    for name in args.models.split(","):
        one_model(name, args.kept, args.rounds, args.budget, args.cache)


if __name__ == "__main__":
    main()
