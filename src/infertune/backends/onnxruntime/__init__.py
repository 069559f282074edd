"""ONNX Runtime: the CPU sessions and their int8 variants (cpu.py), the CUDA and TensorRT
execution providers (cuda.py), IO binding on a GPU planned as a value (iobinding.py), the int8
quantization of the ONNX export (quantize.py).

No imports here: the conversion registry (export/registry.py) imports quantize.py, and the
backends import that registry."""
