"""TensorRT: engines built from the ONNX export by the tensorrt package (engine.py), the
optimization profile and engine cache key planned as values (profiles.py, which ONNX Runtime's
TensorRT execution provider uses too).

No imports here: a backend module imports the conversion registry (export/registry.py), which
imports the runtimes' conversion modules."""
