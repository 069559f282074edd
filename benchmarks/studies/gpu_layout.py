"""ONNX Runtime's CUDA provider by hand on one ONNX model: float32 and float16 with the
provider's options infertune's candidates use (`use_tf32=0`), and float16 with each of the
options that change how convolutions run (`prefer_nhwc=1`: channels-last; the cuDNN algorithm
search; its workspace): p50 at batch 1 and 32 through IO binding (inputs copied to the GPU
per call, outputs copied back: the sync), and how many cuDNN frontend error lines each
session printed. Each setting in a child process of its own, so that its output is its own.

On a GPU host with onnxruntime-gpu (no TensorFlow needed), from the repository's root, for
the model of a package made by `benchmarks/gpu_check.py prepare`:

    python3 -m benchmarks.studies.gpu_layout gpu-check/packages/mobilenet-v2-224/onnx/model.onnx

The input is taken as (batch, 224, 224, 3) float32 (the MobileNetV2 224 package's); it prints
one line per setting. docs/gpu.md quotes its output of 2026-11-27 on an H100 host
(docs/benchmarks/gpu-check/2026-11-27/layout-cudnn-errors.txt: the cuDNN error lines and the layout;
layout-convolution-options.txt: the convolution options).

`--together SETTING,SETTING,...` times the named settings in one process instead, their calls
interleaved (rounds in a rotating order, a block of calls per setting each round), at batch 1
and 32: p50 over every round, the spread of the rounds' medians, and each one's ratio to the
first setting (layout-heuristic-search.txt, 2026-11-27, the same host type: what made the float16
candidates ask for cuDNN's heuristic algorithm choice):

    python3 -m benchmarks.studies.gpu_layout model.onnx \\
        --together "fp16,fp16 heuristic search,fp32,fp32 heuristic search"
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import harness

CALLS, WARMUP = 60, 10
# Each setting: the precision of the graph and the CUDA provider's options beyond use_tf32=0.
SETTINGS = {
    "fp32": ("fp32", {}),
    "fp32 nhwc": ("fp32", {"prefer_nhwc": "1"}),
    "fp16": ("fp16", {}),
    "fp16 nhwc": ("fp16", {"prefer_nhwc": "1"}),
    "fp16 heuristic search": ("fp16", {"cudnn_conv_algo_search": "HEURISTIC"}),
    "fp32 heuristic search": ("fp32", {"cudnn_conv_algo_search": "HEURISTIC"}),
    "fp16 default algorithm": ("fp16", {"cudnn_conv_algo_search": "DEFAULT"}),
    "fp16 small workspace": ("fp16", {"cudnn_conv_use_max_workspace": "0"}),
}


def session_for(model_path: str, setting: str):
    """The CUDA session of one setting."""
    import onnx
    import onnxruntime as ort
    from onnxruntime.transformers.float16 import convert_float_to_float16

    ort.preload_dlls()
    precision, extra = SETTINGS[setting]
    model = onnx.load(model_path)
    if precision == "fp16":
        model = convert_float_to_float16(model, keep_io_types=True)
    options = {"use_tf32": "0", **extra}
    session_options = ort.SessionOptions()
    session_options.log_severity_level = 3
    return ort.InferenceSession(
        model.SerializeToString(), session_options, providers=[("CUDAExecutionProvider", options)]
    )


def timed_calls(session, x: np.ndarray, calls: int) -> list[float]:
    """Seconds of each of `calls` calls through IO binding, outputs copied to the host."""
    name, output = session.get_inputs()[0].name, session.get_outputs()[0].name
    binding = session.io_binding()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        binding.bind_cpu_input(name, x)
        binding.bind_output(output, "cuda")
        session.run_with_iobinding(binding)
        binding.copy_outputs_to_cpu()
        times.append(time.perf_counter() - start)
    return times


def one(model_path: str, setting: str) -> dict:
    """p50 ms at batch 1 and 32 of one session setting."""
    session = session_for(model_path, setting)
    result: dict = {"providers": session.get_providers()}
    for batch in (1, 32):
        x = np.random.default_rng(0).random((batch, 224, 224, 3), dtype=np.float32)
        times = timed_calls(session, x, CALLS)
        result[f"p50_ms_b{batch}"] = round(1000 * float(np.median(times[WARMUP:])), 3)
    return result


def together(model_path: str, settings: list[str], rounds: int = 10) -> None:
    """The settings timed interleaved in this process, at batch 1 and 32."""
    sessions = {setting: session_for(model_path, setting) for setting in settings}
    for setting, session in sessions.items():
        print(f"{setting}: {session.get_providers()[0]}", flush=True)
    for batch, block in ((1, 20), (32, 5)):
        x = np.random.default_rng(0).random((batch, 224, 224, 3), dtype=np.float32)
        for session in sessions.values():
            timed_calls(session, x, WARMUP)  # the algorithm search runs at a new shape
        times: dict[str, list[float]] = {s: [] for s in settings}
        medians: dict[str, list[float]] = {s: [] for s in settings}
        for round_ in range(rounds):
            shift = round_ % len(settings)
            for setting in settings[shift:] + settings[:shift]:
                block_times = timed_calls(sessions[setting], x, block)
                times[setting] += block_times
                medians[setting].append(1000 * float(np.median(block_times)))
        first = float(np.median(times[settings[0]]))
        for setting in settings:
            p50 = float(np.median(times[setting]))
            print(
                f"batch {batch} {setting}: p50 {1000 * p50:.3f} ms (rounds' medians "
                f"{min(medians[setting]):.3f}-{max(medians[setting]):.3f}), "
                f"{p50 / first:.2f}x {settings[0]}",
                flush=True,
            )


def main() -> None:
    parser = harness.parser(__doc__, child=True)
    parser.add_argument("model", help="the ONNX model (a package's onnx/model.onnx)")
    parser.add_argument(
        "--together",
        help=f"comma-separated settings timed interleaved in one process; known: {list(SETTINGS)}",
    )
    args = parser.parse_args()
    if args.child:  # one setting, its stderr its own
        harness.write_child_result(args.child_out, one(args.model, args.child))
        return
    if args.together:
        together(args.model, args.together.split(","))
        return
    for setting in SETTINGS:
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "output.txt"
            result = harness.run_in_child(__file__, setting, [args.model], log_file=log)
            errors = log.read_text(errors="replace").count("cudnn_frontend")
        found = result.get("error") or {
            k: v for k, v in result.items() if k not in ("model", "wall_s")
        }
        print(f"{setting}: cudnn errors {errors} {found}", flush=True)


if __name__ == "__main__":
    main()
