"""The GPU check: packages made on a CPU machine, tuned on a GPU host without TensorFlow.

Two steps (docs/gpu.md gives the whole command):

    python benchmarks/gpu_check.py prepare --out gpu-check     # CPU machine, with TensorFlow
    python3 benchmarks/gpu_check.py run --packages gpu-check/packages --out gpu-summary
                                                               # GPU host, no TensorFlow

`run` needs benchmarks/harness.py beside this file (it imports numpy and the standard
library only, and infertune where it writes the results).

`prepare` writes infertune's wheel and seven packages (infertune.package), each under 50 MB
so that each crosses an air gap in one transfer: the demo's small CNN (batch 1), MobileNetV2
at 224 (random weights, batch-normalization statistics from one batch; batch 1 and 32), the
demo's transformer encoder, the same encoder tuned at batch sizes 1, 8 and 32 (other shapes
on the GPU: the CUDA graph serves the sample's alone), the precision benchmark's digits CNN
(trained and cached by bench_models.py) packaged with precision=("fp32", "int8"), its
calibration and gate data (ONNX Runtime's static int8 is then quantized on the GPU host,
LiteRT's int8 conversions come in the package), and the same benchmark's MobileNetV2-style
shapes classifier (trained, 64x64) with precision=("fp32", "fp16") and its gate, at batch 1
and 32; a text encoder of free length (the demo's `text_encoder`, width 256, 4 blocks; token
ids and a padding mask) packaged with `traffic=` (300 requests, lengths log-normal with median
40, up to 256), so that the GPU host plans its buckets (a CUDA graph per bucket, TensorRT an
engine per bucket) and times the plan against the best candidate at exact shapes; the others
but the int8 one allow fp16 too (judged by the agreement rule: no labelled data). Then it
says how to bring onnxruntime-gpu's wheel (about 255 MB) in parts of at most 60 MB.

`run`, on the GPU host (Python 3.12, the NVIDIA driver, CUDA 13 and cuDNN as Python packages,
no TensorFlow, no package index): tunes each package with the GPU candidates and the CPU ones
that are installed, and writes a result folder (--out, default
docs/benchmarks/gpu-check/<date>/: results.json, results.md, README.md; results.json's
`host` and `packages` are the summary): per package and candidate its status and reason, the
provider it really ran on (ONNX Runtime's `session.get_providers()`: a CUDA candidate that
fell back to the CPU is `failed`, saying so), its error against the model's stored outputs,
p50/p99 latency (every timed call ends with its outputs on the host), for a
reduced-precision one its metric, drop and bound on the package's gate data, and the chosen
one; for the package with traffic, the plan (each bucket's lengths, candidate and padding),
its time on held-out requests against the best candidate at exact shapes, and the result
saved and loaded again: `load()` warms every call path (each bucket's CUDA graphs or
TensorRT engine made there), so a request at each bucket's bound, timed three times, should
cost at its first call what it costs at the next. It imports no TensorFlow (checked: it
refuses to write results where TensorFlow was imported).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import harness

BENCHMARK = "gpu-check"
ROOT = harness.ROOT
GPU_CANDIDATES = (
    "onnxruntime-cuda", "onnxruntime-cuda:graph", "onnxruntime-cuda-fp16",
    "onnxruntime-cuda-fp16:graph", "onnxruntime-tensorrt", "onnxruntime-tensorrt-fp16",
    "tensorrt", "tensorrt-fp16",
)  # fmt: skip
CPU_CANDIDATES = ("onnxruntime-cpu", "openvino-cpu", "litert")
INT8_CANDIDATES = (  # for a package whose options name int8 (OpenVINO's needs NNCF there)
    "onnxruntime-cpu-int8", "onnxruntime-cpu-int8-static", "openvino-cpu-int8", "litert-int8",
    "litert-dynamic-int8",
)  # fmt: skip
INT8_MODEL = "digits-cnn"  # the precision benchmark's (bench_models.py), trained and cached
FP16_MODEL = "shapes-mobilenetv2"  # the same benchmark's, packaged with fp16 and its gate
FP16_GATE_SAMPLES = 512  # of its gate split (64x64x3 images: the package stays under 50 MB)
MAX_PACKAGE_MB = 50
PART_MB = 60
BATCH_SIZES = (1, 8, 32)  # the transformer packaged a second time, tuned per batch size
TRAFFIC_MODEL = "text-encoder-traffic"  # free length, packaged with traffic=
TRAFFIC = {"count": 300, "median": 40, "longest": 256}  # demo.text_traffic's lengths


def prepare(out: Path) -> None:
    """The wheel and the packages, on a CPU machine with TensorFlow."""
    import keras
    import numpy as np

    import infertune
    from infertune.demo import demo_model, text_encoder, text_request, text_traffic

    out.mkdir(parents=True, exist_ok=True)
    wheels = out / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
        check=True,
    )
    rng = np.random.default_rng(0)
    models = {
        "small-cnn": demo_model("small-cnn"),
        "transformer": demo_model("transformer"),
        "mobilenet-v2-224": (
            live_batch_norms(
                keras.applications.MobileNetV2(weights=None, input_shape=(224, 224, 3)),
                rng.random((16, 224, 224, 3), dtype=np.float32),
            ),
            rng.random((1, 224, 224, 3), dtype=np.float32),
        ),
    }
    options = {name: {} for name in models}
    options["mobilenet-v2-224"] = {"batch_sizes": (1, 32)}  # float16's tensor cores at 32
    models["transformer-batches"] = models["transformer"]
    options["transformer-batches"] = {"batch_sizes": BATCH_SIZES}
    models[f"{INT8_MODEL}-int8"], options[f"{INT8_MODEL}-int8"] = trained_package(
        INT8_MODEL, ("fp32", "int8")
    )
    models[f"{FP16_MODEL}-fp16"], options[f"{FP16_MODEL}-fp16"] = trained_package(
        FP16_MODEL, ("fp32", "fp16"), gate_samples=FP16_GATE_SAMPLES
    )
    options[f"{FP16_MODEL}-fp16"]["batch_sizes"] = (1, 32)
    models[TRAFFIC_MODEL] = (text_encoder(width=256, blocks=4), text_request(TRAFFIC["median"]))
    options[TRAFFIC_MODEL] = {"traffic": text_traffic(seed=1, **TRAFFIC)}
    for name, (model, sample) in models.items():
        path = out / "packages" / name
        start = time.perf_counter()
        settings = {"precision": ("fp32", "fp16"), **options[name]}
        infertune.package(model, sample, path, verbose=False, **settings)
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6
        print(f"{name}: {size:.1f} MB in {time.perf_counter() - start:.0f} s")
        if size > MAX_PACKAGE_MB:
            raise SystemExit(f"{name}'s package is {size:.0f} MB, over {MAX_PACKAGE_MB} MB")
    print(
        f"\nonnxruntime-gpu for the GPU host (CUDA 13 build, cp312):\n"
        f"  pip download --no-deps --only-binary=:all: --python-version 3.12 "
        f"'onnxruntime-gpu==1.31.1' -d {wheels}\n"
        f"  split -b {PART_MB}M {wheels}/onnxruntime_gpu-*.whl {wheels}/onnxruntime_gpu.part-\n"
        f"then bring {out} across in parts of at most {PART_MB} MB (docs/gpu.md)."
    )


def trained_package(
    name: str, precision_allowed: tuple[str, ...], gate_samples: int | None = None
) -> tuple[tuple, dict]:
    """A model the precision benchmark trains (cached there), its sample and the options that
    package it with `precision_allowed`: the benchmark's calibration split where int8 is
    allowed (nothing else calibrates), and its gate (accuracy, max_drop) on the first
    `gate_samples` of the gate split (all where None)."""
    import bench_models

    import infertune

    model, data = bench_models.cached_model(name)
    gate = (data.x("gate")[:gate_samples], data.y("gate")[:gate_samples])
    options = {
        "precision": precision_allowed,
        "accuracy": infertune.Accuracy(gate, "accuracy", max_drop=bench_models.MAX_DROP),
    }
    if "int8" in precision_allowed:
        options["calibration"] = data.x("calibration")
    return (model, data.x("test")[:1].copy()), options


def live_batch_norms(model, images):
    """`model` with each BatchNormalization's moving statistics set from one batch.

    A randomly initialised MobileNetV2's activations shrink layer by layer (its logits are
    about 1e-11, its softmax exactly 1/1000 for every input), so every runtime matched its
    reference outputs with error 0 and verification checked nothing. One forward pass in
    training mode with momentum 0 gives each layer unit-scale inputs: the outputs then differ
    between inputs (softmax 2e-4 to 4e-3) and a runtime's error shows.
    """
    import keras

    norms = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]
    momenta = [layer.momentum for layer in norms]
    for layer in norms:
        layer.momentum = 0.0
    model(images, training=True)
    for layer, momentum in zip(norms, momenta):
        layer.momentum = momentum
    outputs = keras.ops.convert_to_numpy(model(images[:2]))
    if (outputs[0] == outputs[1]).all():
        raise SystemExit(f"{model.name} gives the same outputs for two inputs: nothing to verify")
    return model


def run(packages: Path) -> dict:
    """Every package tuned on this (GPU) host: the summary, {"host", "packages"}."""
    import infertune

    summary: dict = {"host": {}, "packages": {}}
    from infertune.pipeline.packaging import Package
    from infertune.system.environment import collect_environment

    environment = collect_environment()
    summary["host"] = {
        "gpus": environment.get("gpu_devices"),
        "cpu": environment.get("cpu", {}).get("model"),
        "cpu_instructions": environment.get("cpu", {}).get("precision_instructions"),
        "cores": os.cpu_count(),
        "packages": {k: v for k, v in environment.get("packages", {}).items() if v},
    }
    for path in sorted(p for p in packages.iterdir() if p.is_dir()):
        start = time.perf_counter()
        try:
            int8 = "int8" in Package.read(path).manifest["options"]["precision"]
            backends = [*GPU_CANDIDATES, *CPU_CANDIDATES, *(INT8_CANDIDATES if int8 else ())]
            opt = infertune.optimize(path, backends=backends, verbose=False)
        except Exception as exc:  # one package's failure is its entry, the others go on
            summary["packages"][path.name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        summary["packages"][path.name] = {
            "tuning_s": round(time.perf_counter() - start, 1),
            "chosen": opt.backend,
            "chosen_by_batch": opt.backends_by_batch,
            "batches": opt.report.to_dict().get("batches"),
            "traffic": opt.report.traffic,  # the plan's figures (None without traffic=)
            "after_load": _after_load_or_error(opt, path.name) if opt.report.traffic else None,
            "candidates": [
                {
                    "name": c.name,
                    "status": c.status,
                    "reason": c.reason,
                    "runs_on": c.runs_on,
                    "max_rel_err": c.max_rel_err,
                    "p50_ms": c.p50,
                    "p99_ms": c.p99,
                    **(
                        {
                            "precision": c.precision,
                            "metric": c.metric,
                            "reference_metric": c.reference_metric,
                            "metric_drop_bound": c.metric_drop_bound,
                            "quantization": c.quantization,
                        }
                        if c.precision != "fp32"
                        else {}
                    ),
                }
                for c in opt.report.candidates
            ],
        }
        opt.close()
        harness.log("gpu-check", f"{path.name}: chose {opt.backend} in "
                    f"{time.perf_counter() - start:.0f} s")  # fmt: skip
    if "tensorflow" in sys.modules and sys.modules["tensorflow"] is not None:
        raise SystemExit("TensorFlow was imported: the check must run without it")
    return summary


def after_load(opt, name: str) -> dict:
    """The result saved and loaded again (load() warms every call path), then a request at
    each bucket's bound (or the sample's length, without buckets) timed three times: load's
    seconds and each request's first call against the median of the next two, in ms."""
    import statistics
    import tempfile

    import numpy as np

    import infertune
    from infertune.model.traffic import shapes_at
    from infertune.result.calling import flat_runner

    with tempfile.TemporaryDirectory(prefix=f"gpu-check-{name}-") as directory:
        start = time.perf_counter()
        loaded = infertune.load(opt.save(Path(directory) / "saved"), verbose=False)
        load_s = time.perf_counter() - start
        choice = loaded._choice
        signature, buckets = choice.inputs, choice.buckets
        uppers = [b.upper for b in buckets.buckets] if buckets is not None else []
        run, rng, rows = flat_runner(choice), np.random.default_rng(0), []
        for upper in uppers or [None]:
            shapes = shapes_at(signature, [buckets.dim], None, [upper]) if upper else None
            x = signature.random_inputs(rng, shapes=shapes)
            times = []
            for _ in range(3):
                begin = time.perf_counter()
                run(x)
                times.append(1e3 * (time.perf_counter() - begin))
            rows.append({"length": upper or "sample", "first_ms": times[0],
                         "next_ms": statistics.median(times[1:])})  # fmt: skip
        loaded.close()
    return {"load_s": round(load_s, 2), "requests": rows}


def _after_load_or_error(opt, name: str) -> dict:
    try:
        return after_load(opt, name)
    except Exception as exc:  # the package's tuning stands; this part says what failed
        return {"error": f"{type(exc).__name__}: {exc}"}


def _number(value, form: str) -> str:
    return "-" if value is None else format(value, form)


def table(summary: dict) -> dict:
    """Every package's candidates: status, where it ran, p50/p99, error, reduced precision."""
    rows = []
    for name, entry in summary["packages"].items():
        if "error" in entry:
            rows.append([name, "", "", "failed", entry["error"][:300]])
            continue
        for c in entry["candidates"]:
            metric = ""
            if c.get("metric") is not None:
                metric = f"{c['metric']:.4f} ({_number(c.get('reference_metric'), '.4f')})"
            rows.append(
                [
                    name,
                    entry["chosen"],
                    c["name"],
                    c["status"],
                    ", ".join(c["runs_on"] or []) if isinstance(c["runs_on"], list)
                    else c["runs_on"] or "",
                    _number(c["p50_ms"], ".3g"),
                    _number(c["p99_ms"], ".3g"),
                    _number(c["max_rel_err"], ".1e"),
                    metric,
                ]
            )  # fmt: skip
    head = [
        "package", "chosen", "candidate", "status", "runs on", "p50 ms", "p99 ms", "error",
        "metric (the model's)",
    ]  # fmt: skip
    return harness.table(head, rows)


def traffic_table(summary: dict) -> dict:
    """Each package tuned with traffic=: its buckets (lengths, candidate, padded or own
    length, p50 at the bound, share of the traffic), the candidate beyond them, and the plan
    timed on held-out requests against the best candidate at exact shapes."""
    from infertune.report.traffic import bucket_rows, held_out_words

    rows = []
    for name, entry in summary["packages"].items():
        traffic = entry.get("traffic")
        if not traffic:
            continue
        held = held_out_words(traffic) or "not timed"
        buckets = bucket_rows(traffic)
        if not buckets:  # every request at its own length
            rows.append([name, "all", entry["chosen"], "own length", "-", "-", held])
        for bucket in buckets:
            p50, share = _number(bucket.p50_ms, ".3g"), _number(bucket.share, ".2f")
            rows.append([name, bucket.lengths, bucket.candidate, bucket.runs_at, p50, share, held])
    head = ["package", "lengths", "candidate", "runs at", "p50 ms", "share", "held out"]
    return harness.table(head, rows, title="Buckets planned from the traffic")


def after_load_table(summary: dict) -> dict:
    """Each package tuned with traffic=, saved and loaded again: a request at each bucket's
    bound, its first call against its next ones."""
    rows = []
    for name, entry in summary["packages"].items():
        found = entry.get("after_load") or {}
        if "error" in found:
            rows.append([name, "-", "-", "-", "-", found["error"][:300]])
        for request in found.get("requests", []):
            first, later = request["first_ms"], request["next_ms"]
            rows.append([
                name, _number(found["load_s"], ".2f"), request["length"],
                _number(first, ".3g"), _number(later, ".3g"), _number(first / later, ".2f"),
            ])  # fmt: skip
    head = ["package", "load() s", "length", "1st call ms", "next ms", "1st / next"]
    return harness.table(head, rows, title="After load(): a request at each bucket's bound")


def main() -> int:
    parser = harness.parser(__doc__)
    verbs = parser.add_subparsers(dest="verb", required=True)
    make = verbs.add_parser("prepare", help="on a CPU machine with TensorFlow")
    make.add_argument("--out", type=Path, default=Path("gpu-check"))
    tune = verbs.add_parser("run", help="on the GPU host, without TensorFlow")
    tune.add_argument("--packages", type=Path, required=True)
    tune.add_argument("--out", type=Path, help=harness.SHARED_OPTIONS["--out"]["help"])
    tune.add_argument("--json", type=Path, help=harness.SHARED_OPTIONS["--json"]["help"])
    args = parser.parse_args()
    if args.verb == "prepare":
        prepare(args.out)
        return 0
    summary = run(args.packages)
    data = harness.results(
        BENCHMARK,
        about=harness.about(__doc__),
        notes="p50/p99 in ms, every timed call ending with its outputs on the host; error: "
        "the largest relative error against the outputs stored in the package.",
        rows=[{"package": name, **entry} for name, entry in summary["packages"].items()],
        tables=[table(summary), traffic_table(summary), after_load_table(summary)],
        headline={name: entry.get("chosen") for name, entry in summary["packages"].items()},
        **summary,
    )
    harness.publish(data, args.out, args.json)
    return 0  # a package that failed is its entry of the summary


if __name__ == "__main__":
    sys.exit(main())
