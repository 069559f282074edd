"""ONNX Runtime on an NVIDIA GPU: the CUDA and the TensorRT execution providers.

All of them run the shared ONNX export (export/onnx.py) and are called through IO binding:
each input is copied to the GPU once per call, outputs are bound on the GPU and copied to the
host explicitly, and that copy is the synchronization point every timed call ends with.

- `onnxruntime-cuda`: the CUDA execution provider, ONNX Runtime's default CUDA options.
- `onnxruntime-cuda:graph`: the same with `enable_cuda_graph`: the first run at the sample's
  shapes is captured as a CUDA graph and every later call at exactly those shapes replays it
  from fixed device buffers (one launch instead of one per kernel). Calls at other shapes go
  through a plain CUDA session. A model ONNX Runtime cannot capture (nodes on the CPU) fails.
- `onnxruntime-cuda-fp16` (and `:graph`): the same on the export in float16 (weights and
  arithmetic; inputs and outputs float32, export/onnx_fp16.py), where the GPU's tensor cores
  run it, cuDNN's convolution algorithms chosen by its heuristics: reduced precision, judged
  by the gate (precision/gate.py) like bf16 and int8.
- `onnxruntime-tensorrt`, `onnxruntime-tensorrt-fp16`: the TensorRT execution provider (the
  CUDA one behind it for the nodes TensorRT does not take), an explicit optimization profile
  (backends/tensorrt/profiles.py `profile_shapes`), engines and timing caches on disk, fp16
  as a reduced-precision candidate that must pass verification like any other.

Before the first session, the CUDA and cuDNN libraries of onnxruntime-gpu's [cuda,cudnn] wheels
are loaded (`onnxruntime.preload_dlls()`, gpu_libraries.preload_cuda), and for the TensorRT
provider the TensorRT libraries it links (libnvinfer.so.10 for onnxruntime-gpu 1.31) from
TensorRT's wheel (gpu_libraries.preload_tensorrt): neither is on the system's library path.
A provider that cannot be created makes ONNX Runtime fall back to the CPU with only a printed
notice; a session whose first provider is not the one asked for is a failure here, and its
error carries what loading the libraries reported.

fp32 means fp32: TF32 (10-bit mantissa products, the CUDA provider's default on Ampere and
later) is turned off for `onnxruntime-cuda` (`use_tf32=0`).

The run paths are tested with `device = "cpu"` on the CPU provider (tests/backends/test_gpu.py): IO
binding, the CUDA-graph call with its fixed OrtValue buffers, the float16 graph. The CUDA
candidates, float32 and float16, have run on an H100; the TensorRT ones have not run on GPU
hardware yet. Without a GPU every one of them is `unavailable` (see docs/gpu.md).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import ClassVar

import numpy as np

from ...errors import ClosedError
from ...export.onnx import OnnxExport
from ...export.onnx_fp16 import FLOAT16_TEXT
from ...export.registry import shared
from ...system.gpu import (
    CUDA_EP,
    TENSORRT_EP,
    gpu_facts,
    import_error,
    reason_unavailable,
)
from ...system.gpu_libraries import (
    find_library,
    installed_by,
    ort_tensorrt_links,
    preload_cuda,
    preload_tensorrt,
)
from ...system.settings import engine_cache_dir
from ..base import Target
from ..tensorrt.profiles import (
    Profile,
    default_batch_sizes,
    engine_cache_key,
    exact_shapes_of,
    profile_shapes,
)
from .cpu import (
    OnnxRuntimeCpu,
    OrtSettings,
)
from .iobinding import (
    IoBindingPlan,
    iobinding_plan,
)

__all__ = [
    "OnnxRuntimeCuda",
    "OnnxRuntimeCudaFp16",
    "OnnxRuntimeTensorrt",
    "OnnxRuntimeTensorrtFp16",
    "cuda_variants",
]

# The first GPU (CUDA_VISIBLE_DEVICES picks another): where the IO binding's buffers live. The
# providers' options leave `device_id` out, 0 being their default: given, ONNX Runtime >= 1.26
# first looks for a plugin execution provider of that device, finds none for the built-in CUDA
# one, and warns "No registered plugin EP device found" at every session (seen on an H100).
DEVICE_ID = 0


class OnnxRuntimeCuda(OnnxRuntimeCpu):
    """An InferenceSession on the CUDA execution provider, called through IO binding."""

    name = "onnxruntime-cuda"
    kind = "onnxruntime-cuda"  # what system/gpu.py reason_unavailable() decides for
    provider = CUDA_EP
    requires = "gpu"
    runtime_packages = ("onnxruntime-gpu",)
    rehearse_in_child = True
    # Where IO binding puts outputs and the CUDA graph its buffers (ONNX Runtime's device
    # name). The tests set "cpu", with the CPU provider, to run these call paths here.
    device = "cuda"

    def __init__(self, settings: OrtSettings | None = None, cuda_graph: bool = False):
        super().__init__(settings)
        self.cuda_graph = cuda_graph
        self.name = type(self).name + (":graph" if cuda_graph else "") + self.settings.suffix()
        self._preload_notes: tuple[str, ...] = ()
        # A bucket's CUDA graphs are captured in a session of their own, which holds the
        # weights on the GPU again (Backend.bucket_memory_factor).
        self.bucket_memory_factor = 1.0 if cuda_graph else 0.0
        self._bucket_graphs: list[_GraphsAtShapes] = []

    def available(self) -> str | None:
        facts = gpu_facts()
        if facts.gpus and facts.ort_providers is None and facts.onnxruntime:
            # With a GPU, ONNX Runtime's own providers decide: import it (once) to read them.
            error = import_error("onnxruntime")
            if error is not None:
                return f"onnxruntime does not import ({error})"
            facts = gpu_facts()
        return reason_unavailable(self.kind, facts)

    def provider_options(self, target: Target, model_bytes: bytes) -> list:
        """The `providers=` list of the session (a provider name and its options each)."""
        return [(CUDA_EP, {"use_tf32": "0"})]

    def graph_provider_options(self, providers: list) -> list:
        """The same providers with CUDA-graph capture turned on in the first."""
        name, options = providers[0]
        return [(name, {**options, "enable_cuda_graph": "1"}), *providers[1:]]

    def preload_libraries(self) -> tuple[str, ...]:
        """Load the native libraries the provider links before its first session; returns
        what loading reported (kept for the error of a session that falls back)."""
        return preload_cuda()

    def prepare(self, target: Target) -> None:
        self.convert(target)
        model, exported = self._saved
        model_bytes = model.session_model()  # bytes, or a path past 2 GB
        self._plan = iobinding_plan(
            target.signature, exported.input_names, exported.output_names, self.cuda_graph
        )
        if self.cuda_graph and not self._plan.cuda_graph:
            raise RuntimeError(f"no CUDA graph for this model: {self._plan.why_no_graph}")
        self._preload_notes = self.preload_libraries()
        providers = self.provider_options(target, model_bytes)
        self._session = self._new_session(model_bytes, providers)
        self._input_names = list(self._plan.input_names)
        self._output_names = list(self._plan.output_names)
        self._local = threading.local()
        self._graph = None
        self._graph_source = (model_bytes, self.graph_provider_options(providers))
        if self._plan.cuda_graph:
            self._graph = _CudaGraphCall(
                self._new_session(*self._graph_source), self._plan, self._session, self.device
            )

    def _new_session(self, model_bytes: bytes, providers: list):
        try:
            return super()._new_session(model_bytes, providers)
        except RuntimeError as exc:  # a fallback to the CPU, or a provider that failed
            hints = list(self._preload_notes)
            if self.device == "cuda" and find_library("libcuda.so.1") is None:
                hints.append("the NVIDIA driver's libcuda.so.1 is not on the library path")
            if not hints:
                raise
            raise RuntimeError(f"{exc}; {'; '.join(hints)}") from exc

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        graph = self._graph
        if graph is not None and self._plan.uses_graph([x.shape for x in inputs]):
            return graph.run(inputs)
        binding = getattr(self._local, "binding", None)
        if binding is None:  # one binding per thread: concurrent calls must not share one
            binding = self._local.binding = self._new_binding()
        return self.bound_run(self._session, binding, inputs)

    def bound_run(self, session, binding, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """One call of `session` through `binding` (this thread's): inputs copied to the
        device, outputs allocated there by ONNX Runtime and copied back to the host."""
        for name, x in zip(self._input_names, inputs):
            binding.bind_cpu_input(name, np.ascontiguousarray(x))  # copied to the device
        for name in self._output_names:
            binding.bind_output(name, self.device, DEVICE_ID)  # allocated there by ONNX Runtime
        session.run_with_iobinding(binding)
        return binding.copy_outputs_to_cpu()  # device -> host: the synchronization point

    def shaped_runner(self) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
        """The :graph variant: CUDA graphs of its own for a bucket's calls (the sample's one
        serves only the sample's shapes), each captured at the first call of its shapes, at
        most GRAPHS_PER_BUCKET (one per batch size the bucket meets); other calls go to the
        plain session. Without CUDA graphs: run()."""
        if not self._plan.cuda_graph:
            return self.run
        graphs = _GraphsAtShapes(self)
        self._bucket_graphs.append(graphs)
        return graphs

    def _new_binding(self):
        """An IOBinding of the session, for a thread's first call (close() forgets them all:
        a call after it comes here, and is refused)."""
        session = self._session
        if session is None:
            raise ClosedError(f"the {self.name} backend was closed: its session is released")
        return session.io_binding()

    def close(self) -> None:
        """Release both sessions: the plain one (super), the CUDA graph's, and every
        thread's binding, which holds the plain one."""
        super().close()
        self._graph = None
        self._bucket_graphs = []
        self._local = threading.local()

    def save_artifact(self, directory: Path) -> dict:
        return {**super().save_artifact(directory), "cuda_graph": self.cuda_graph}

    @classmethod
    def _from_settings(cls, settings: dict) -> OnnxRuntimeCuda:
        return cls(OrtSettings(**settings["session"]), cuda_graph=settings.get("cuda_graph", False))


class OnnxRuntimeCudaFp16(OnnxRuntimeCuda):
    """The CUDA session on the export in float16 ("onnx-fp16"): half the weights' bytes and
    the tensor cores' float16 products, inputs and outputs still float32. Reduced precision:
    tried where precision= allows "fp16", judged by the gate, not by rtol/atol."""

    name = "onnxruntime-cuda-fp16"
    precision = "fp16"
    precision_note: ClassVar[str] = FLOAT16_TEXT
    conversions = ("onnx", "onnx-fp16")
    memory_factor = 0.5  # float16 weights
    rehearse_in_child = True  # the saved model.onnx is the float16 one: it loads as it ran

    def model_export(self, target: Target) -> OnnxExport:
        return shared(target, "onnx-fp16")

    def provider_options(self, target: Target, model_bytes: bytes) -> list:
        """cuDNN's heuristic choice of convolution algorithms instead of the provider's
        exhaustive search, which picks slower float16 ones: MobileNetV2 224 at batch 32 on an
        H100, 5.35-5.96 ms against 6.32-7.05 (0.84-0.85x in three interleaved passes), at
        batch 1 the same; float32 gains nothing from it (benchmarks/studies/gpu_layout.py
        --together; docs/gpu.md)."""
        (name, options), *rest = super().provider_options(target, model_bytes)
        return [(name, {**options, "cudnn_conv_algo_search": "HEURISTIC"}), *rest]

    @classmethod
    def _preload(cls, target: Target, exported: OnnxExport) -> None:
        # The saved model.onnx is the float16 graph: it is the fp16 conversion (its input and
        # output names are the export's).
        target.preload("onnx", exported)
        target.preload("onnx-fp16", exported)


class _CudaGraphCall:
    """Calls at exactly the sample's shapes, replayed from a captured CUDA graph.

    A CUDA graph replays fixed device addresses: inputs and outputs live in OrtValues on the
    GPU allocated once and bound once; a call copies its inputs into them (update_inplace),
    replays, and copies the outputs back to the host. One call at a time (a lock): the
    buffers are shared.
    """

    def __init__(self, session, plan: IoBindingPlan, plain_session, device: str = "cuda"):
        import onnxruntime

        zeros = [np.zeros(s, d) for s, d in zip(plan.input_shapes, plan.input_dtypes)]
        # The output shapes and dtypes at the sample's shapes, from the plain session.
        shaped = plain_session.run(list(plan.output_names), dict(zip(plan.input_names, zeros)))
        ortvalue = onnxruntime.OrtValue
        self._inputs = [ortvalue.ortvalue_from_numpy(z, device, DEVICE_ID) for z in zeros]
        self._outputs = [
            ortvalue.ortvalue_from_shape_and_type(o.shape, o.dtype, device, DEVICE_ID)
            for o in shaped
        ]
        binding = session.io_binding()
        for name, value in zip(plan.input_names, self._inputs):
            binding.bind_ortvalue_input(name, value)
        for name, value in zip(plan.output_names, self._outputs):
            binding.bind_ortvalue_output(name, value)
        self._session, self._binding, self._device = session, binding, device
        self._lock = threading.Lock()
        session.run_with_iobinding(binding)  # ONNX Runtime captures the graph on this run

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        with self._lock:
            for value, x in zip(self._inputs, inputs):
                value.update_inplace(np.ascontiguousarray(x))  # host -> the captured buffer
            self._session.run_with_iobinding(self._binding)
            outputs = [value.numpy() for value in self._outputs]  # device -> host: the sync
            # On the "cpu" device (the tests) numpy() is a view of the bound buffer, which
            # the next call overwrites: a copy, as the GPU's device -> host copy is.
            return outputs if self._device != "cpu" else [o.copy() for o in outputs]


# A bucket's CUDA graphs: one per shape it meets (its bound at each batch size), at most.
GRAPHS_PER_BUCKET = 4


class _GraphsAtShapes:
    """A bucket's CUDA graphs, by input shapes, each in a session of its own (a graph
    replays one set of device buffers), captured at the first call of its shapes."""

    def __init__(self, backend: OnnxRuntimeCuda):
        self._backend = backend
        self._graphs: dict[tuple, _CudaGraphCall] = {}
        self._lock = threading.Lock()

    def __call__(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        shapes = tuple(x.shape for x in inputs)
        graph = self._graphs.get(shapes)
        if graph is None:
            graph = self._capture(shapes)
            if graph is None:
                return self._backend.run(inputs)
        return graph.run(inputs)

    def _capture(self, shapes: tuple) -> _CudaGraphCall | None:
        backend = self._backend
        with self._lock:
            if shapes in self._graphs:
                return self._graphs[shapes]
            if len(self._graphs) >= GRAPHS_PER_BUCKET:
                return None
            plan = dataclasses.replace(backend._plan, input_shapes=shapes)
            session = backend._new_session(*backend._graph_source)
            graph = _CudaGraphCall(session, plan, backend._session, backend.device)
            self._graphs[shapes] = graph
            return graph

    def close(self) -> None:
        """Release the graphs' sessions (a plan that lost its timing gives them back)."""
        self._graphs = {}
        if self in self._backend._bucket_graphs:
            self._backend._bucket_graphs.remove(self)


class OnnxRuntimeTensorrt(OnnxRuntimeCuda):
    """ONNX Runtime's TensorRT execution provider, with the CUDA one for what TensorRT leaves.

    Engines are built for one optimization profile (backends/tensorrt/profiles.py: min batch
    1, opt the sample's, max from `default_batch_sizes`) and kept in a cache directory per
    model, precision, profile, TensorRT version and GPU (`engine_cache_key`), with TensorRT's
    timing cache beside them: a second optimize() of the same model loads the engine instead
    of building it. With optimize(traffic=...), each padded bucket has a session of its own
    whose profile fixes the other dimensions at the bucket's bound (`shaped_runner`).
    """

    name = "onnxruntime-tensorrt"
    kind = "onnxruntime-tensorrt"
    provider = TENSORRT_EP
    requires = "tensorrt"
    runtime_packages = ("onnxruntime-gpu", "tensorrt")
    rehearse_in_child = True  # the child builds the engine into the cache; this process loads it
    fp16 = False

    builds_per_shape = True

    def __init__(self, settings: OrtSettings | None = None):
        super().__init__(settings, cuda_graph=False)
        self.bucket_memory_factor = 1.0  # a bucket's session holds the weights on the GPU
        self._bucket_sessions: list[_SessionAtShapes] = []

    def convert(self, target: Target) -> None:
        # Known before the rehearsal in the child, which runs the checks of these shapes only.
        self.exact_shapes, self.exact_reason = exact_shapes_of(target.signature)
        super().convert(target)

    def preload_libraries(self) -> tuple[str, ...]:
        """The CUDA libraries, then the TensorRT ones the provider links, from TensorRT's wheel."""
        notes = preload_cuda()
        preload_tensorrt(ort_tensorrt_links())  # raises, naming what is missing
        return notes

    def provider_options(self, target: Target, model_bytes: bytes) -> list:
        _, exported = self._saved
        self._profile = profile_shapes(
            target.signature, default_batch_sizes(target.signature), exported.input_names
        )
        self._model_bytes = model_bytes
        return self.profile_providers(self._profile, model_bytes)

    def profile_providers(self, profile: Profile, model_bytes: bytes) -> list:
        """The providers of a session whose TensorRT engines are built for `profile`."""
        gpu = gpu_facts().gpu_name or "unknown GPU"
        key = engine_cache_key(model_bytes, self.precision, profile, _runtime_versions(), gpu)
        cache = engine_cache_dir() / "onnxruntime" / key
        cache.mkdir(parents=True, exist_ok=True)
        options = {
            "trt_engine_cache_enable": True,
            "trt_engine_cache_path": str(cache),
            "trt_timing_cache_enable": True,
            "trt_timing_cache_path": str(cache),
            "trt_fp16_enable": self.fp16,
            **profile.ort_options(),
        }
        return [(TENSORRT_EP, options), (CUDA_EP, {})]

    def shaped_runner(self) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
        """A bucket's session of its own, its TensorRT profile fixed at the bucket's shapes
        apart from the batch (Profile.at_shapes), made at its first call: the session's
        profile fixes every dimension but the batch at the sample's."""
        runner = _SessionAtShapes(self)
        self._bucket_sessions.append(runner)
        return runner

    def close(self) -> None:
        for runner in list(self._bucket_sessions):
            runner.close()
        super().close()

    def save_artifact(self, directory: Path) -> dict:
        settings = super().save_artifact(directory)
        settings.pop("cuda_graph")
        return settings

    @classmethod
    def _from_settings(cls, settings: dict) -> OnnxRuntimeCuda:
        return cls(OrtSettings(**settings["session"]))


class _SessionAtShapes:
    """A bucket's TensorRT session: at the first call, a session whose profile is the
    backend's fixed at that call's shapes apart from the batch (Profile.at_shapes), its
    engine built or read from the engine cache; every later call of the bucket (its bound,
    any batch in the profile) runs it through IO binding, a binding per thread."""

    def __init__(self, backend: OnnxRuntimeTensorrt):
        self._backend = backend
        self._session = None
        self._closed = False
        self._local = threading.local()
        self._lock = threading.Lock()

    def __call__(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        session = self._session
        if session is None:
            session = self._open([x.shape for x in inputs])
        binding = getattr(self._local, "binding", None)
        if binding is None:
            binding = self._local.binding = session.io_binding()
        return self._backend.bound_run(session, binding, inputs)

    def _open(self, shapes):
        backend = self._backend
        with self._lock:
            if self._session is None:
                if self._closed or backend._session is None:
                    raise ClosedError(f"the {backend.name} bucket's session was closed")
                self.profile = backend._profile.at_shapes(shapes)
                providers = backend.profile_providers(self.profile, backend._model_bytes)
                self._session = backend._new_session(backend._model_bytes, providers)
            return self._session

    def close(self) -> None:
        """Release the bucket's session (a plan that lost its timing gives it back)."""
        with self._lock:
            self._session, self._local, self._closed = None, threading.local(), True
        if self in self._backend._bucket_sessions:
            self._backend._bucket_sessions.remove(self)


class OnnxRuntimeTensorrtFp16(OnnxRuntimeTensorrt):
    """The same with `trt_fp16_enable`: TensorRT may run layers in fp16 (reduced precision)."""

    name = "onnxruntime-tensorrt-fp16"
    precision = "fp16"
    rehearse_in_child = True
    fp16 = True


def _runtime_versions() -> str:
    """What built an engine, from the distributions installed: ONNX Runtime and the TensorRT
    libraries its provider loads (an engine is valid only for the TensorRT that built it)."""
    parts = [f"{name} {version}" for name, version in installed_by("onnxruntime")]
    parts += [f"{name} {version}" for name, version in installed_by("tensorrt_libs")]
    parts += list(ort_tensorrt_links())
    return ", ".join(parts)


def cuda_variants(cls: type[OnnxRuntimeCuda]) -> dict[str, Callable[[], OnnxRuntimeCuda]]:
    """The CUDA session and its CUDA-graph variant."""
    return {cls.name: cls, cls.name + ":graph": partial(cls, cuda_graph=True)}
