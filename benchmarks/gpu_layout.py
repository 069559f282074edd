"""ONNX Runtime's CUDA provider by hand on one ONNX model: float32 and float16 with the
provider's options infertune's candidates use (`use_tf32=0`), and float16 with each of the
options that change how convolutions run (`prefer_nhwc=1`: channels-last; the cuDNN algorithm
search; its workspace): p50 at batch 1 and 32 through IO binding (inputs copied to the GPU
per call, outputs copied back: the sync), and how many cuDNN frontend error lines each
session printed. Each setting in a child process of its own, so that its stderr is its own.

On a GPU host with onnxruntime-gpu (no TensorFlow needed), for the model of a package made by
`benchmarks/gpu_check.py prepare`:

    python3 benchmarks/gpu_layout.py gpu-check/packages/mobilenet-v2-224/onnx/model.onnx

The input is taken as (batch, 224, 224, 3) float32 (the MobileNetV2 224 package's); it prints
one line per setting (docs/gpu.md, "The fifth and sixth passes").
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np

CALLS, WARMUP = 60, 10
# Each setting: the precision of the graph and the CUDA provider's options beyond use_tf32=0.
SETTINGS = {
    "fp32": ("fp32", {}),
    "fp32 nhwc": ("fp32", {"prefer_nhwc": "1"}),
    "fp16": ("fp16", {}),
    "fp16 nhwc": ("fp16", {"prefer_nhwc": "1"}),
    "fp16 heuristic search": ("fp16", {"cudnn_conv_algo_search": "HEURISTIC"}),
    "fp16 default algorithm": ("fp16", {"cudnn_conv_algo_search": "DEFAULT"}),
    "fp16 small workspace": ("fp16", {"cudnn_conv_use_max_workspace": "0"}),
}


def one(model_path: str, setting: str) -> dict:
    """p50 ms at batch 1 and 32 of one session setting."""
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
    session = ort.InferenceSession(
        model.SerializeToString(), session_options, providers=[("CUDAExecutionProvider", options)]
    )
    name, output = session.get_inputs()[0].name, session.get_outputs()[0].name
    result: dict = {"providers": session.get_providers()}
    for batch in (1, 32):
        x = np.random.default_rng(0).random((batch, 224, 224, 3), dtype=np.float32)
        binding = session.io_binding()
        times = []
        for _ in range(CALLS):
            start = time.perf_counter()
            binding.bind_cpu_input(name, x)
            binding.bind_output(output, "cuda")
            session.run_with_iobinding(binding)
            binding.copy_outputs_to_cpu()
            times.append(time.perf_counter() - start)
        result[f"p50_ms_b{batch}"] = round(1000 * float(np.median(times[WARMUP:])), 3)
    return result


def main() -> None:
    model_path = sys.argv[1]
    if len(sys.argv) > 2:  # the child: one setting
        print("RESULT", json.dumps(one(model_path, sys.argv[2])))
        return
    for setting in SETTINGS:
        child = subprocess.run(
            [sys.executable, __file__, model_path, setting], capture_output=True, text=True
        )
        errors = child.stderr.count("cudnn_frontend")
        lines = [line for line in child.stdout.splitlines() if line.startswith("RESULT")]
        found = lines[0][len("RESULT ") :] if lines else child.stderr[-400:]
        print(f"{setting}: cudnn errors {errors} {found}", flush=True)


if __name__ == "__main__":
    main()
