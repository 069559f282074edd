"""TensorRT: engines built from the ONNX export by the tensorrt package (engine.py)."""
