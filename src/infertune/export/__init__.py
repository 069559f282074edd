"""Conversions of the model to other formats, shared by the backends that run them: the table
of shared conversions (registry.py); the ONNX export (onnx.py) with its freezing
(onnx_freeze.py), its weights as external data past 2 GB (onnx_external.py), tf2onnx's errors
translated (onnx_errors.py), the conversions tf2onnx lacks (tf2onnx_ops.py), the export in
float16 (onnx_fp16.py); the exact rewrites of ops a converter rejects (rewrites.py, the Fourier
ones in rewrites_fourier.py, on the graph of rewrites_graph.py); one patch of a library at a
time (patching.py). A conversion that one runtime alone runs lives in its folder in backends/
(backends/litert/convert.py)."""
