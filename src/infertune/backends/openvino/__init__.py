"""OpenVINO: the CPU plugin in f32, bf16 and int8 (cpu.py), NNCF's int8 quantization of the
ONNX export (quantize.py).

No imports here: the conversion registry (export/registry.py) imports quantize.py, and the
backends import that registry."""
