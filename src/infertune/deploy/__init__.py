"""What happens after tuning, at scale: a saved result served by Ray Data, Ray Serve and
Triton's Python backend.

    served.py         ServedModel: a saved result behind named tensors (shared by all three)
    protocol.py       the Open Inference Protocol v2 (KServe v2, Triton's HTTP API): JSON and
                      binary tensors in, the same out, as plain functions of bytes; its
                      routing and metadata, on wire.py (datatypes, errors), limits.py (body,
                      decoded and batch sizes), decoding.py (requests), encoding.py
                      (responses) and statistics.py (per-model counters)
    triton.py         the export to a Triton model repository
    ray_data.py       Predictor, the callable class for Dataset.map_batches
    ray_serve.py      the Ray Serve deployment and `infertune serve`
    triton_python.py  TritonPythonModel, which the exported model.py imports

Deploy code imports the saved result (result/), never the pipeline's stages. Public import
paths: `infertune.ray` (Predictor, deployment) and `Optimized.export_triton(...,
backend="python")`. Nothing here imports Ray at `import infertune`.
"""
