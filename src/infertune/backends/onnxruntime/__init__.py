"""ONNX Runtime: the CPU sessions and their int8 variants (cpu.py), the CUDA and TensorRT
execution providers (cuda.py), the int8 quantization of the ONNX export (quantize.py)."""
