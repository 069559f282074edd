"""TensorRT engines built from the shared ONNX export with the tensorrt package's ONNX parser.

One optimization profile covers the batch sizes in use (gpu.profile_shapes: min batch 1, opt
the sample's, max the larger of the sample's and gpu.PROFILE_MAX_BATCH). The serialized
engine is kept on disk under gpu.engine_cache_dir(), named by gpu.engine_cache_key (model,
precision, profile, TensorRT version, GPU), and reused by the next optimize() or load() of
the same model on the same GPU. `tensorrt-fp16` lets TensorRT pick fp16 kernels (reduced
precision: verified like any other candidate).

Device memory and copies go through cuda-python's CUDA runtime bindings (`cuda.bindings.runtime`,
`cuda.cudart` in older releases), as TensorRT 10's own Python samples do: one stream, device
buffers that grow to the largest call seen, inputs copied host -> device, execute_async_v3,
outputs copied device -> host into fresh numpy arrays, then a stream synchronize: the call
returns only when the outputs are on the host.

NOT RUN ON GPU HARDWARE YET: written from the TensorRT 10 Python API documentation. Without a
GPU, tensorrt or cuda-python it is `unavailable` with the reason (see docs/gpu.md).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np

from ..export.onnx import export_onnx, read_onnx, write_onnx
from ..gpu import (
    Profile,
    default_batch_sizes,
    engine_cache_dir,
    engine_cache_key,
    gpu_facts,
    profile_shapes,
    reason_unavailable,
)
from .base import Backend, Target

__all__ = ["TensorRtEngine", "TensorRtEngineFp16"]


def _cudart():
    try:
        from cuda.bindings import runtime as cudart  # cuda-python >= 12.6
    except ImportError:
        from cuda import cudart  # older cuda-python
    return cudart


def _checked(cudart, result):
    """cuda-python returns (error, *values): raise on an error, else the value(s)."""
    error, *values = result
    if error != cudart.cudaError_t.cudaSuccess:
        raise RuntimeError(f"CUDA runtime error: {error}")
    return values[0] if len(values) == 1 else tuple(values)


class TensorRtEngine(Backend):
    """A TensorRT engine for the ONNX export, one execution context, one CUDA stream."""

    name = "tensorrt"
    conversions = ("onnx",)
    relative_cost = 30.0  # an engine build takes minutes
    requires = "tensorrt"
    runtime_packages = ("tensorrt", "cuda-python")
    rehearse_in_child = True  # the child builds the engine into the cache; this process loads it

    def __init__(self):
        self._buffers: dict[str, tuple[int, int]] = {}  # name -> (device pointer, bytes)
        self._stream = None

    def available(self) -> str | None:
        return reason_unavailable("tensorrt", gpu_facts())

    def convert(self, target: Target) -> None:
        self._exported = export_onnx(target)

    def prepare(self, target: Target) -> None:
        import tensorrt as trt

        self.convert(target)
        exported = self._exported
        self._profile = profile_shapes(
            target.signature, default_batch_sizes(target.signature), exported.input_names
        )
        gpu = gpu_facts().gpu_name or "unknown GPU"
        key = engine_cache_key(
            exported.model_bytes, self.precision, self._profile, trt.__version__, gpu
        )
        self.engine_path = engine_cache_dir() / f"{key}.engine"
        self._logger = trt.Logger(trt.Logger.ERROR)
        self._runtime = trt.Runtime(self._logger)  # must outlive the engine
        self._engine, self.engine_from_cache = self._load_or_build(trt, exported.model_bytes)
        self._context = self._engine.create_execution_context()
        if self._context is None:
            raise RuntimeError("TensorRT could not create an execution context (GPU memory?)")
        self._inputs = [
            (name, np.dtype(trt.nptype(self._engine.get_tensor_dtype(name))))
            for name in exported.input_names
        ]
        self._outputs = [
            (name, np.dtype(trt.nptype(self._engine.get_tensor_dtype(name))))
            for name in exported.output_names
        ]
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._lock = threading.Lock()  # one context and one set of buffers: one call at a time
        self._cudart = _cudart()
        self._stream = _checked(self._cudart, self._cudart.cudaStreamCreate())

    def _load_or_build(self, trt, model_bytes: bytes):
        """The cached engine if it deserializes, else a new one, written to the cache."""
        if self.engine_path.exists():
            engine = self._runtime.deserialize_cuda_engine(self.engine_path.read_bytes())
            if engine is not None:  # None: built by another TensorRT, or damaged: build anew
                return engine, True
        data = _build_engine(trt, self._logger, model_bytes, self._profile, self.precision)
        self.engine_path.parent.mkdir(parents=True, exist_ok=True)
        partial_path = self.engine_path.with_name(f"{self.engine_path.name}.{os.getpid()}.tmp")
        partial_path.write_bytes(data)
        os.replace(partial_path, self.engine_path)  # atomic: a reader never sees half an engine
        engine = self._runtime.deserialize_cuda_engine(data)
        if engine is None:
            raise RuntimeError("TensorRT could not load the engine it just built")
        return engine, False

    def _device(self, name: str, nbytes: int) -> int:
        """The device buffer of tensor `name`, grown to `nbytes` (and rebound) where needed."""
        pointer, size = self._buffers.get(name, (0, 0))
        if nbytes > size:
            cudart = self._cudart
            if pointer:
                _checked(cudart, cudart.cudaFree(pointer))
            size = max(nbytes, 1)
            pointer = int(_checked(cudart, cudart.cudaMalloc(size)))
            self._buffers[name] = (pointer, size)
            self._context.set_tensor_address(name, pointer)
        return pointer

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        cudart, stream = self._cudart, self._stream
        to_device = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        to_host = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        with self._lock:
            hosts = []
            for (name, dtype), x in zip(self._inputs, inputs):
                x = np.ascontiguousarray(x, dtype=dtype)
                hosts.append(x)  # alive until the stream is synchronized
                if self._shapes.get(name) != x.shape:
                    if not self._profile.covers(name, x.shape):
                        raise ValueError(_outside(self._profile, name, x.shape))
                    if not self._context.set_input_shape(name, x.shape):
                        raise RuntimeError(f"TensorRT refused shape {x.shape} for {name}")
                    self._shapes[name] = x.shape
                pointer = self._device(name, x.nbytes)
                _checked(
                    cudart,
                    cudart.cudaMemcpyAsync(pointer, x.ctypes.data, x.nbytes, to_device, stream),
                )
            outputs = []
            for name, dtype in self._outputs:
                host = np.empty(tuple(self._context.get_tensor_shape(name)), dtype)
                outputs.append((self._device(name, host.nbytes), host))
            if not self._context.execute_async_v3(stream):
                raise RuntimeError("TensorRT execute_async_v3 failed")
            for pointer, host in outputs:
                _checked(
                    cudart,
                    cudart.cudaMemcpyAsync(host.ctypes.data, pointer, host.nbytes, to_host, stream),
                )
            _checked(cudart, cudart.cudaStreamSynchronize(stream))  # outputs are on the host
            return [host for _, host in outputs]

    def close(self) -> None:
        cudart = getattr(self, "_cudart", None)
        if cudart is not None:
            for pointer, _ in self._buffers.values():
                cudart.cudaFree(pointer)
            if self._stream is not None:
                cudart.cudaStreamDestroy(self._stream)
        self._buffers, self._stream = {}, None
        self._context = self._engine = self._runtime = None

    def save_artifact(self, directory: Path) -> dict:
        """model.onnx: the engine itself is specific to the GPU and TensorRT version, so it is
        rebuilt (or found in the engine cache) where the result is loaded."""
        exported = self._exported
        return {**write_onnx(directory, exported.model_bytes, exported), "engine": "rebuilt"}

    @classmethod
    def load_artifact(cls, directory: Path, settings: dict, target: Target) -> Backend:
        target.preload("onnx", read_onnx(directory, settings))
        backend = cls()
        backend.prepare(target)
        return backend


class TensorRtEngineFp16(TensorRtEngine):
    """The same engine with TensorRT's FP16 builder flag: fp16 kernels where TensorRT picks them."""

    name = "tensorrt-fp16"
    precision = "fp16"
    rehearse_in_child = True


def _build_engine(trt, logger, model_bytes: bytes, profile: Profile, precision: str) -> bytes:
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # explicit batch: the only mode in TensorRT 10
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(model_bytes):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT's ONNX parser rejected the model: {errors}")
    config = builder.create_builder_config()
    if precision == "fp16":
        config.set_flag(trt.BuilderFlag.FP16)
    optimization_profile = builder.create_optimization_profile()
    for name, low, opt, high in profile.shapes:
        optimization_profile.set_shape(name, low, opt, high)
    config.add_optimization_profile(optimization_profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError("TensorRT could not build an engine for the model")
    return bytes(serialized)


def _outside(profile: Profile, name: str, shape: tuple[int, ...]) -> str:
    for input_name, low, _, high in profile.shapes:
        if input_name == name:
            return (
                f"input {name} of shape {shape} is outside the TensorRT engine's profile "
                f"(min {low}, max {high}); optimize() with a sample of the largest batch "
                f"to cover it"
            )
    return f"input {name} is not in the TensorRT engine's profile"
