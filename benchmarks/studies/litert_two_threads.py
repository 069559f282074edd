"""LiteRT on two threads, timed right after other runtimes ran in the same process: why the
small CNN's choice between `litert` and `litert:threads=1` wavers.

On the demo's small CNN (13 us a call on LiteRT's two threads), infertune's own candidates
`litert`, `litert:threads=1`, `onnxruntime-cpu` and `openvino-cpu` are prepared in one
process. Each trial then times `litert` against `litert:threads=1` alone, in interleaved
rounds for 1 s (as optimize()'s head-to-head does), after 0.5 s of interleaved rounds of a
group of candidates (as optimize()'s main measurement; the ONNX Runtime session with its
50 ms cooldown). Groups: none ("alone"), the two LiteRT candidates with `onnxruntime-cpu`
("ort") or with `openvino-cpu` ("ov"). Printed: each trial's p50 of the two, in us.

From the repository's root:

    python -m benchmarks.studies.litert_two_threads [--trials 8]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import harness
from infertune.backends.registry import BACKENDS
from infertune.demo import demo_model
from infertune.model.inputs import build_signature
from infertune.model.source import load_model
from infertune.model.target import Target
from infertune.pipeline.timing import measure_interleaved

NAMES = ("litert", "litert:threads=1", "onnxruntime-cpu", "openvino-cpu")
GROUPS = {
    "alone": (),
    "ort": ("litert", "litert:threads=1", "onnxruntime-cpu"),
    "ov": ("litert", "litert:threads=1", "openvino-cpu"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8)
    args = parser.parse_args()
    print(harness.machine_description())
    model, x = demo_model("small-cnn")
    source = load_model(model)
    signature, flat = build_signature(x, source.declared_inputs, source.default_float)
    reference, structure = source.call_flat(signature, flat)
    target = Target(source, signature, structure, [r.dtype for r in reference])
    backends = {}
    for name in NAMES:
        backend = BACKENDS[name]()
        backend.name = name
        backend.prepare(target)
        for _ in range(20):
            backend.run(flat)
        backends[name] = backend

    def runners(names):
        return {name: (lambda run=backends[name].run: run(flat)) for name in names}

    print("\n| before each trial | `litert` p50 us, `litert:threads=1` p50 us, per trial |")
    print("|---|---|")
    for label, group in GROUPS.items():
        trials = []
        for _ in range(args.trials):
            if group:
                cooldown = {name: backends[name].cooldown_s for name in group}
                measure_interleaved(runners(group), budget_s=0.5, cooldown_s=cooldown)
            measured = measure_interleaved(
                runners(NAMES[:2]), budget_s=1.0, min_rounds=8, stable_rel=0.0, race=False,
                per_call_estimate_s={"litert": 13e-6, "litert:threads=1": 15e-6},
            )  # fmt: skip
            stats = measured.stats
            trials.append(f"{1e3 * stats['litert'].p50:.1f}/{1e3 * stats[NAMES[1]].p50:.1f}")
        print(f"| {label} | {', '.join(trials)} |")


if __name__ == "__main__":
    main()
