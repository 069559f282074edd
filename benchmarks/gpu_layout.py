"""ONNX Runtime's CUDA provider by hand on one ONNX model: float32 and float16, each in the
default layout and with `prefer_nhwc=1` (channels-last convolutions), p50 at batch 1 and 32
through IO binding (inputs copied to the GPU per call, outputs copied back: the sync), and how
many cuDNN frontend error lines each session printed. Each setting in a child process of its
own, so that its stderr is its own.

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


def one(model_path: str, fp16: bool, nhwc: bool) -> dict:
    """p50 ms at batch 1 and 32 of one session setting."""
    import onnx
    import onnxruntime as ort
    from onnxruntime.transformers.float16 import convert_float_to_float16

    ort.preload_dlls()
    model = onnx.load(model_path)
    if fp16:
        model = convert_float_to_float16(model, keep_io_types=True)
    options = {"use_tf32": "0", **({"prefer_nhwc": "1"} if nhwc else {})}
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
        print("RESULT", json.dumps(one(model_path, sys.argv[2] == "fp16", sys.argv[3] == "nhwc")))
        return
    for precision in ("fp32", "fp16"):
        for layout in ("nchw", "nhwc"):
            child = subprocess.run(
                [sys.executable, __file__, model_path, precision, layout],
                capture_output=True,
                text=True,
            )
            errors = child.stderr.count("cudnn_frontend")
            lines = [line for line in child.stdout.splitlines() if line.startswith("RESULT")]
            found = lines[0][len("RESULT ") :] if lines else child.stderr[-400:]
            print(precision, layout, "cudnn errors:", errors, found, flush=True)


if __name__ == "__main__":
    main()
