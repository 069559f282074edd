"""What happens after tuning, at scale: a saved result served by Ray Data, Ray Serve and
Triton's Python backend.

    served.py         ServedModel: a saved result behind named tensors (shared by all three)
    protocol.py       the Open Inference Protocol v2 (KServe v2, Triton's HTTP API): JSON and
                      binary tensors in, the same out, as plain functions of bytes
    ray_data.py       Predictor, the callable class for Dataset.map_batches
    ray_serve.py      the Ray Serve deployment and `infertune serve`
    triton_python.py  TritonPythonModel, which the exported model.py imports

Deploy code imports the pipeline (load, the saved manifest), never the reverse. Public import
paths: `infertune.ray` (Predictor, deployment) and `Optimized.export_triton(...,
backend="python")`. Nothing here imports Ray at `import infertune`.
"""
