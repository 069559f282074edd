"""TensorRT engines built from the shared ONNX export with the tensorrt package's ONNX parser.

One optimization profile covers the batch sizes in use (profiles.profile_shapes: min batch 1,
opt the sample's, max the larger of the sample's and profiles.PROFILE_MAX_BATCH); every other
dimension is the sample's. With optimize(traffic=...), each padded bucket gets an engine of
its own whose profile fixes those dimensions at the bucket's bound (Profile.at_shapes,
`EngineAtShapes`), and the traffic's lengths are measured through such engines. Each
serialized engine is kept on disk under settings.engine_cache_dir(), named by
profiles.engine_cache_key (model, precision, profile, TensorRT version, GPU), and reused by
the next optimize() or load() of the same model on the same GPU: a bucket's engine, built
while its length was measured, is read back from there.

TensorRT 10 and 11 build differently (`build_settings`, a plain function of the major
version and precision): TensorRT 11 has only strongly typed networks (no BuilderFlag.FP16,
BF16, INT8, nor EXPLICIT_BATCH), so `tensorrt-fp16` builds there from a float16 ONNX graph
(export/onnx_fp16.py: weights and arithmetic in float16, inputs and outputs kept float32), and on
TensorRT 10 from the float32 graph with the FP16 builder flag. Either way it is a
reduced-precision candidate, verified like any other. fp32 means fp32 on both: TF32
(TensorRT's default for float32 matrix products on Ampere and later) is cleared.

Device memory and copies go through cuda-python's CUDA runtime bindings (`cuda.bindings.runtime`,
`cuda.cudart` in older releases; every call returns (error, value...)), as TensorRT's own
Python samples do: one stream, device buffers that grow to the largest call seen, inputs
copied host -> device, execute_async_v3, outputs copied device -> host into fresh numpy
arrays, then a stream synchronize: the call returns only when the outputs are on the host.
An output whose shape depends on the data (a -1 TensorRT cannot resolve from the input
shapes, e.g. NonZero) cannot be allocated before the run: the candidate fails with that
reason (at prepare, for the sample's shapes).

NOT RUN ON GPU HARDWARE YET. Checked here: `build_settings` and the fp16 graph (run by ONNX
Runtime on the CPU), and the TensorRT and cuda-python names it calls against the installed
bindings where they import (tests/backends/test_gpu.py, docs/gpu.md). Without a GPU, tensorrt or
cuda-python it is `unavailable` with the reason.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import ClosedError
from ...export.onnx import (
    read_onnx,
    write_onnx,
)
from ...export.registry import (
    export_onnx,
    shared,
)
from ...system.gpu import (
    TENSORRT_EXTRA,
    cuda_runtime_module,
    gpu_facts,
    reason_unavailable,
    tensorrt_major,
)
from ...system.settings import engine_cache_dir
from ..base import (
    Backend,
    Target,
)
from .profiles import (
    Profile,
    default_batch_sizes,
    engine_cache_key,
    exact_shapes_of,
    profile_shapes,
)

__all__ = [
    "BuildSettings",
    "EngineAtShapes",
    "EngineCall",
    "TensorRtEngine",
    "TensorRtEngineFp16",
    "build_settings",
]


@dataclass(frozen=True)
class BuildSettings:
    """How one TensorRT major version builds one precision: the ONNX graph it parses
    ("fp32" or "fp16"), the NetworkDefinitionCreationFlag and BuilderFlag names to set and
    to clear (names, so that a test can check them against the installed bindings)."""

    graph: str
    network_flags: tuple[str, ...]
    set_flags: tuple[str, ...]
    clear_flags: tuple[str, ...]


def build_settings(major: int, precision: str) -> BuildSettings:
    """The settings for TensorRT `major` (10, 11, ...) and `precision` ("fp32" or "fp16").

    TensorRT 10: explicit batch is the only mode (flags 0); fp16 is the FP16 builder flag on
    the float32 graph (weak typing: TensorRT picks fp16 kernels where it likes). TensorRT 11
    and later: networks are always strongly typed and the precision flags are gone, so fp16
    is a float16 graph. TF32 is cleared everywhere: float32 layers stay float32.
    """
    if precision not in ("fp32", "fp16"):
        raise ValueError(f"TensorRT candidates build fp32 or fp16. Received: {precision!r}.")
    if major < 10:
        raise ValueError(f"TensorRT {major} is not supported; TensorRT 10 or later is needed.")
    if major == 10:
        flags = ("FP16",) if precision == "fp16" else ()
        return BuildSettings("fp32", (), flags, ("TF32",))
    return BuildSettings(precision, (), (), ("TF32",))


def _cudart():
    module = cuda_runtime_module()
    if module is None:
        raise RuntimeError(f"cuda-python is not installed ({TENSORRT_EXTRA})")
    return importlib.import_module(module)


def _checked(cudart, result):
    """cuda-python returns (error, *values): raise on an error, else the value(s)."""
    error, *values = result
    if error != cudart.cudaError_t.cudaSuccess:
        raise RuntimeError(f"CUDA runtime error: {error!r}")
    return values[0] if len(values) == 1 else tuple(values)


def host_shape(name: str, shape) -> tuple[int, ...]:
    """The shape to allocate output `name` with, from the context's get_tensor_shape: a -1
    left once every input shape is set depends on the data itself, which TensorRT knows only
    after the run; such an output needs an output allocator this candidate does not have."""
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise RuntimeError(
            f"output {name} has a data-dependent shape {dims} (-1 after every input shape is "
            f"set: the values decide it, as with NonZero); the tensorrt candidate allocates "
            f"outputs before the run and does not support it (onnxruntime-tensorrt does)"
        )
    return dims


class TensorRtEngine(Backend):
    """A TensorRT engine for the ONNX export, one execution context, one CUDA stream; and for
    optimize(traffic=...), an engine per bucket (`shaped_runner`)."""

    name = "tensorrt"
    conversions = ("onnx",)
    relative_cost = 30.0  # an engine build takes minutes
    requires = "tensorrt"
    runtime_packages = ("tensorrt", "cuda-python")
    rehearse_in_child = True  # the child builds the engine into the cache; this process loads it
    builds_per_shape = True
    bucket_memory_factor = 1.0  # a bucket's engine holds the weights on the GPU again

    def __init__(self):
        self._main: EngineCall | None = None
        self._bucket_engines: list[EngineAtShapes] = []

    def available(self) -> str | None:
        return reason_unavailable("tensorrt", gpu_facts())

    def convert(self, target: Target) -> None:
        # Known before the rehearsal in the child, which runs the checks of these shapes only.
        self.exact_shapes, self.exact_reason = exact_shapes_of(target.signature)
        self._exported = export_onnx(target)
        if self._exported.directory is not None:  # parsed from bytes here: no external data
            raise RuntimeError(
                "the model's weights are ONNX external data (past protobuf's 2 GB), which this "
                "candidate's parser (from bytes) does not read yet; onnxruntime-tensorrt does"
            )

    def prepare(self, target: Target) -> None:
        import tensorrt as trt

        self.convert(target)
        exported = self._exported
        self.build = build_settings(tensorrt_major(trt.__version__), self.precision)
        self._model_bytes = exported.model_bytes
        if self.build.graph == "fp16":
            self._model_bytes = shared(target, "onnx-fp16").model_bytes
        self._profile = profile_shapes(
            target.signature, default_batch_sizes(target.signature), exported.input_names
        )
        self._trt = trt
        self._logger = trt.Logger(trt.Logger.ERROR)
        self._runtime = trt.Runtime(self._logger)  # must outlive the engines
        self._cudart = _cudart()
        self._main = self.engine_call(self._profile)
        self.engine_path, self.engine_from_cache = self._main.path, self._main.from_cache
        self._main.check_outputs(target.signature.sample_shapes)

    def engine_call(self, profile: Profile) -> EngineCall:
        """The engine for `profile`, from the engine cache or built (and cached), ready to
        call."""
        trt = self._trt
        gpu = gpu_facts().gpu_name or "unknown GPU"
        key = engine_cache_key(self._model_bytes, self.precision, profile, trt.__version__, gpu)
        path = engine_cache_dir() / f"{key}.engine"
        engine, from_cache = self._load_or_build(path, profile)
        return EngineCall(trt, engine, profile, self._exported, self._cudart, path, from_cache)

    def _load_or_build(self, path: Path, profile: Profile):
        """The cached engine at `path` if it deserializes, else a new one, written there."""
        if path.exists():
            engine = self._runtime.deserialize_cuda_engine(path.read_bytes())
            if engine is not None:  # None: built by another TensorRT, or damaged: build anew
                return engine, True
        data = _build_engine(self._trt, self._logger, self._model_bytes, profile, self.build)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial_path = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        partial_path.write_bytes(data)
        os.replace(partial_path, path)  # atomic: a reader never sees half an engine
        engine = self._runtime.deserialize_cuda_engine(data)
        if engine is None:
            raise RuntimeError("TensorRT could not load the engine it just built")
        return engine, False

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        main = self._main
        if main is None:  # close() released it
            raise ClosedError(f"the {self.name} backend was closed: its engine is released")
        return main.run(inputs)

    def shaped_runner(self) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
        """A bucket's engine of its own, its profile fixed at the bucket's shapes apart from
        the batch (Profile.at_shapes), built or read from the engine cache at its first call:
        the engine's profile fixes every dimension but the batch at the sample's, so the
        bucket's length needs an engine of its own."""
        runner = EngineAtShapes(self)
        self._bucket_engines.append(runner)
        return runner

    def close(self) -> None:
        """Free every engine's device buffers and stream, each under its call lock: a call
        in flight ends first, and a call after this is refused."""
        for runner in list(self._bucket_engines):
            runner.close()
        main, self._main = self._main, None
        if main is not None:
            main.close()
        self._runtime = None

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


class EngineCall:
    """One engine, one execution context, one CUDA stream and device buffers that grow to the
    largest call seen: calls within its profile, one at a time (a lock)."""

    def __init__(self, trt, engine, profile: Profile, exported, cudart, path: Path, from_cache):
        context = engine.create_execution_context()
        if context is None:
            raise RuntimeError("TensorRT could not create an execution context (GPU memory?)")
        self.path, self.from_cache, self.profile = path, from_cache, profile
        self._engine, self._context, self._cudart = engine, context, cudart
        self._inputs = [
            (name, np.dtype(trt.nptype(engine.get_tensor_dtype(name))))
            for name in exported.input_names
        ]
        self._outputs = [
            (name, np.dtype(trt.nptype(engine.get_tensor_dtype(name))))
            for name in exported.output_names
        ]
        self._buffers: dict[str, tuple[int, int]] = {}  # name -> (device pointer, bytes)
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._lock = threading.Lock()
        self._stream = _checked(cudart, cudart.cudaStreamCreate())

    def check_outputs(self, shapes) -> None:
        """Set the input shapes: a data-dependent output fails here, not at a call."""
        with self._lock:
            self._set_input_shapes(shapes)
            for name, _ in self._outputs:
                host_shape(name, self._context.get_tensor_shape(name))

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

    def _set_input_shapes(self, shapes) -> None:
        """Tell the context the shapes of this call's inputs, where they changed."""
        for (name, _), shape in zip(self._inputs, shapes):
            shape = tuple(int(d) for d in shape)
            if self._shapes.get(name) != shape:
                if not self.profile.covers(name, shape):
                    raise ValueError(_outside(self.profile, name, shape))
                if not self._context.set_input_shape(name, shape):
                    raise RuntimeError(f"TensorRT refused shape {shape} for {name}")
                self._shapes[name] = shape

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        cudart, stream = self._cudart, self._stream
        to_device = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        to_host = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        with self._lock:
            if self._context is None:  # close() freed the buffers: nothing here may touch them
                raise ClosedError("the TensorRT engine was closed: it is released")
            hosts = [np.ascontiguousarray(x, dtype=d) for (_, d), x in zip(self._inputs, inputs)]
            self._set_input_shapes([x.shape for x in hosts])  # hosts stay alive until the sync
            for (name, _), x in zip(self._inputs, hosts):
                pointer = self._device(name, x.nbytes)
                _checked(
                    cudart,
                    cudart.cudaMemcpyAsync(pointer, x.ctypes.data, x.nbytes, to_device, stream),
                )
            outputs = []
            for name, dtype in self._outputs:
                host = np.empty(host_shape(name, self._context.get_tensor_shape(name)), dtype)
                outputs.append((self._device(name, host.nbytes), host))
            if not self._context.execute_async_v3(int(stream)):  # TensorRT takes the handle
                raise RuntimeError("TensorRT execute_async_v3 failed")
            for pointer, host in outputs:
                _checked(
                    cudart,
                    cudart.cudaMemcpyAsync(host.ctypes.data, pointer, host.nbytes, to_host, stream),
                )
            _checked(cudart, cudart.cudaStreamSynchronize(stream))  # outputs are on the host
            return [host for _, host in outputs]

    def close(self) -> None:
        """Free the device buffers, the stream and the context under the call lock."""
        with self._lock:
            cudart = self._cudart
            for pointer, _ in self._buffers.values():
                cudart.cudaFree(pointer)
            if self._stream is not None:
                cudart.cudaStreamDestroy(self._stream)
            self._buffers, self._stream = {}, None
            self._context = self._engine = None


class EngineAtShapes:
    """A bucket's engine: at the first call, the backend's profile fixed at that call's
    shapes apart from the batch (Profile.at_shapes), built or read from the engine cache;
    every later call of the bucket (its bound, any batch in the profile) runs it."""

    def __init__(self, backend: TensorRtEngine):
        self._backend = backend
        self._call: EngineCall | None = None
        self._closed = False
        self._lock = threading.Lock()

    def __call__(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        call = self._call
        if call is None:
            call = self._open([x.shape for x in inputs])
        return call.run(inputs)

    def _open(self, shapes) -> EngineCall:
        backend = self._backend
        with self._lock:
            if self._call is None:
                if self._closed or backend._main is None:
                    raise ClosedError(f"the {backend.name} bucket's engine was closed")
                self._call = backend.engine_call(backend._profile.at_shapes(shapes))
            return self._call

    def close(self) -> None:
        """Release the bucket's engine (a plan that lost its timing gives it back)."""
        with self._lock:
            call, self._call, self._closed = self._call, None, True
        if call is not None:
            call.close()
        if self in self._backend._bucket_engines:
            self._backend._bucket_engines.remove(self)


class TensorRtEngineFp16(TensorRtEngine):
    """The same in fp16: the FP16 builder flag on TensorRT 10, a float16 graph on 11."""

    name = "tensorrt-fp16"
    precision = "fp16"
    precision_note = (
        "TensorRT 10: FP16 builder flag on the float32 graph; TensorRT 11: a float16 ONNX "
        "graph (onnxruntime.transformers.float16, inputs and outputs float32)"
    )
    rehearse_in_child = True


def _build_engine(trt, logger, model_bytes: bytes, profile: Profile, build: BuildSettings) -> bytes:
    builder = trt.Builder(logger)
    flags = 0
    for flag in build.network_flags:
        flags |= 1 << int(getattr(trt.NetworkDefinitionCreationFlag, flag))
    network = builder.create_network(flags)  # explicit batch: the only mode since TensorRT 10
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(model_bytes):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT's ONNX parser rejected the model: {errors}")
    config = builder.create_builder_config()
    for flag in build.set_flags:
        config.set_flag(getattr(trt.BuilderFlag, flag))
    for flag in build.clear_flags:
        config.clear_flag(getattr(trt.BuilderFlag, flag))
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
