"""ONNX Runtime on the CPU, on the shared ONNX export of the model.

Besides the default session, the session settings a performance engineer would try by hand
(as Microsoft Olive does) are candidates of their own: intra-op threads from 1 up to the
usable cores, the parallel execution mode, a lower graph optimization level, worker threads
that sleep instead of spinning between calls (a spinning worker burns about 40 ms of a core
after every call: CPU a service may need for its other work), and dynamic int8 quantization
as a reduced-precision candidate. Each is measured like any other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ...errors import closed_call
from ...export.onnx import (
    OnnxExport,
    read_onnx,
    write_onnx,
)
from ...export.registry import (
    export_onnx,
    int8_dot,
    shared,
    static_int8,
)
from ...model.inputs import InputSignature
from ...model.outputs import OutputSignature
from ...system.environment import (
    install_hint,
    usable_cores,
)
from ..base import (
    Backend,
    NotApplicable,
    Target,
)
from ..triton_plan import (
    TritonPlan,
    copy_onnx,
    model_names,
    onnx_tensors,
)
from .quantize import (
    CALIBRATION_METHODS,
    INT8_QUANTIZATION,
    INT8_SETTINGS_TEXT,
    static_settings_text,
)

__all__ = [
    "OnnxRuntimeCpu",
    "OnnxRuntimeCpuInt8",
    "OnnxRuntimeCpuInt8Static",
    "OrtSettings",
    "onnxruntime_cpu_variants",
]

# What ORT_PARALLEL cost where the graph is a chain (benchmarks/studies/ort_parallel.py, 2-core
# AMD EPYC, interleaved: 0.0182 against 0.0166 ms on the demo's small CNN at batch 1).
PARALLEL_OVERHEAD_WORDS = (
    "measured on a chain of layers, the demo's small CNN: 1.1x the sequential session's time"
)
_LEVELS = {"all": "ORT_ENABLE_ALL", "extended": "ORT_ENABLE_EXTENDED", "basic": "ORT_ENABLE_BASIC"}
_MODES = {"sequential": "ORT_SEQUENTIAL", "parallel": "ORT_PARALLEL"}


@dataclass(frozen=True)
class OrtSettings:
    """Session options that change speed; the defaults are ONNX Runtime's own."""

    intra_op_threads: int = 0  # 0: ONNX Runtime's default, one per physical core
    graph_optimization: str = "all"
    execution_mode: str = "sequential"
    allow_spinning: bool = True  # idle worker threads spin for work (about 40 ms a call here)

    @property
    def spins(self) -> bool:
        return self.allow_spinning and self.intra_op_threads != 1  # one thread: no workers

    def suffix(self) -> str:
        """`:threads=1`, `:parallel`, `:opt=basic`: what differs from the defaults."""
        parts = []
        if self.intra_op_threads:
            parts.append(f"threads={self.intra_op_threads}")
        if self.execution_mode != "sequential":
            parts.append(self.execution_mode)
        if self.graph_optimization != "all":
            parts.append(f"opt={self.graph_optimization}")
        if not self.allow_spinning:
            parts.append("nospin")
        return "".join(f":{p}" for p in parts)

    def session_options(self):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3  # errors only: warnings would flood the user's log
        options.intra_op_num_threads = self.intra_op_threads
        options.graph_optimization_level = getattr(
            onnxruntime.GraphOptimizationLevel, _LEVELS[self.graph_optimization]
        )
        options.execution_mode = getattr(onnxruntime.ExecutionMode, _MODES[self.execution_mode])
        if not self.allow_spinning:
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return options


class OnnxRuntimeCpu(Backend):
    """An InferenceSession with the CPU execution provider and the given session settings."""

    name = "onnxruntime-cpu"
    conversions = ("onnx",)
    relative_cost = 0.6  # a session compiled twice (rehearsal, then here)
    # MatMul weights packed (the rest mapped from model.onnx.data, shared): a BERT-base-sized
    # session held 0.34 GB for 0.44 GB of weights
    memory_factor = 1.0
    provider = "CPUExecutionProvider"
    requires = "cpu"  # or gpu/tensorrt: onnxruntime-gpu has the CPU provider too
    runtime_packages = ("onnxruntime",)
    rehearse_in_child = True
    triton_serves = True

    def __init__(self, settings: OrtSettings | None = None):
        self.settings = settings or OrtSettings()
        self.name = type(self).name + self.settings.suffix()
        if not self.settings.intra_op_threads and self.settings != OrtSettings():
            self.session_variant = self.settings.suffix().lstrip(":").replace(":", ", ")
        self.threads_variant = self.settings.intra_op_threads or None
        threads_only = dataclasses.replace(self.settings, intra_op_threads=0, allow_spinning=True)
        if self.settings != OrtSettings() and threads_only == OrtSettings():
            self.rehearsal_twin = type(self).name
        # Measured here: after each call, a spinning worker burns about 37 ms of one core.
        self.cooldown_s = 0.05 if self.settings.spins else 0.0

    def available(self) -> str | None:
        try:
            import onnxruntime
        except ImportError as exc:
            return (
                f"onnxruntime is not installed ({exc}); {install_hint('cpu')}, or on a GPU "
                f"machine {install_hint('gpu')}"
            )
        if self.provider not in onnxruntime.get_available_providers():
            return f"ONNX Runtime here has no {self.provider}"
        return None

    def model_export(self, target: Target) -> OnnxExport:
        """The ONNX model the session runs: the shared export (its int8 form for int8)."""
        return export_onnx(target)

    def model_bytes(self, target: Target) -> bytes | str:
        """What InferenceSession takes: the model's bytes, or its path where its weights are
        external data."""
        return self.model_export(target).session_model()

    def convert(self, target: Target) -> None:
        exported = export_onnx(target)
        width = exported.parallel_width  # None for an export read back from a saved result
        if self.settings.execution_mode == "parallel" and width is not None and width < 2:
            raise NotApplicable(
                f"the model has no parallel branches (at most {width} matrix operation at any "
                f"depth of its ONNX graph): ORT_PARALLEL would only hand each node to another "
                f"thread ({PARALLEL_OVERHEAD_WORDS})"
            )
        self._saved = (self.model_export(target), exported)  # what save_artifact writes

    def prepare(self, target: Target) -> None:
        self.convert(target)
        model, exported = self._saved
        self._session = self._new_session(model.session_model(), [self.provider])
        self._run_session, self._release_session = session_runner(self._session)
        self._input_names = exported.input_names
        self._output_names = exported.output_names

    def _new_session(self, model_bytes: bytes | str, providers: list):
        """A session with this candidate's settings on `providers` (names, or (name, options)
        pairs); the first must be `self.provider`."""
        import onnxruntime

        session = onnxruntime.InferenceSession(
            model_bytes, self.settings.session_options(), providers=providers
        )
        used = session.get_providers()
        self.runs_on = ", ".join(used)
        if used[0] != self.provider:  # ONNX Runtime falls back silently; a fallback is a failure
            raise RuntimeError(f"ONNX Runtime used {used[0]} instead of {self.provider}")
        return session

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        return self._run_session(self._output_names, dict(zip(self._input_names, inputs)))

    def single_runner(self, shape: tuple[int, ...]) -> Callable[[np.ndarray], np.ndarray] | None:
        """One array in, one out, at any shape: the session's run without the lists. None
        where a subclass runs the session its own way (CUDA: bound device buffers)."""
        if type(self).run is not OnnxRuntimeCpu.run:
            return None
        if len(self._input_names) != 1 or len(self._output_names) != 1:
            return None
        names, name, run_session = self._output_names, self._input_names[0], self._run_session

        def run_one(array: np.ndarray) -> np.ndarray:
            return run_session(names, {name: array})[0]

        return run_one

    def dict_runner(
        self, inputs: tuple[tuple[Any, np.dtype, frozenset], ...]
    ) -> Callable[[dict], list[np.ndarray] | None] | None:
        """A dict of arrays of one batch size, fed to the session by its input names as it
        is read (cast by the signature's rule where it casts): the session itself refuses a
        wrong rank or fixed dimension (InvalidArgument, caught: the call path's check then
        says what is wrong), so Python checks each value's type, dtype and batch size only
        (a free batch dimension is the one thing the session cannot check across inputs).
        None where a subclass runs the session its own way (CUDA: bound device buffers)."""
        if type(self).run is not OnnxRuntimeCpu.run:
            return None
        from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

        plan = tuple(
            (key, name, dtype, casts)
            for (key, dtype, casts), name in zip(inputs, self._input_names)
        )
        count, names, run_session = len(plan), self._output_names, self._run_session
        ndarray = np.ndarray

        def run(x: dict) -> list[np.ndarray] | None:
            if len(x) != count:
                return None
            feed = {}
            batch = -1
            for key, name, dtype, casts in plan:
                array = x.get(key)
                if type(array) is not ndarray or not array.ndim:
                    return None
                if array.dtype is not dtype:
                    if array.dtype not in casts:
                        return None
                    array = array.astype(dtype)
                if batch != array.shape[0]:
                    if batch >= 0:
                        return None
                    batch = array.shape[0]
                feed[name] = array
            try:
                return run_session(names, feed)
            except InvalidArgument:  # a rank or a fixed dimension: the full check says which
                return None

        return run

    def close(self) -> None:
        """Release the session: the runners handed out (single_runner, dict_runner, run)
        call the session through `_run_session`, whose hold on it is cut here, so none keeps
        it alive and each raises ClosedError from now on (a call already in the session ends
        first: the session is freed when it returns)."""
        release = getattr(self, "_release_session", None)
        if release is not None:
            release(closed_call(f"the {self.name} backend was closed: its session is released"))
        self._release_session = None
        self._session = None
        self._saved = None

    def save_artifact(self, directory: Path) -> dict:
        """model.onnx (the model the session runs, with model.onnx.data past 2 GB) and the
        session settings."""
        model, exported = self._saved
        return {**write_onnx(directory, model, exported), "session": asdict(self.settings)}

    @classmethod
    def triton_plan(
        cls, directory: Path, entry: dict, inputs: InputSignature, outputs: OutputSignature
    ) -> TritonPlan:
        return _triton_plan(directory, entry, inputs, outputs)

    @classmethod
    def load_artifact(cls, directory: Path, settings: dict, target: Target) -> Backend:
        backend = cls._from_settings(settings)
        cls._preload(target, read_onnx(directory, settings))
        backend.prepare(target)
        return backend

    @classmethod
    def _from_settings(cls, settings: dict) -> OnnxRuntimeCpu:
        """The backend as save_artifact's settings describe it, not prepared yet."""
        return cls(OrtSettings(**settings["session"]))

    @classmethod
    def _preload(cls, target: Target, exported: OnnxExport) -> None:
        target.preload("onnx", exported)


def session_runner(
    session,
) -> tuple[Callable[[list[str], dict], list[np.ndarray]], Callable[[Callable], None]]:
    """run(output names, feed) of a session, and release(replacement), which makes `run`
    call `replacement` instead and drop its hold on the session (close(): every runner
    built on `run` then lets the session go).

    `run` skips the checks `InferenceSession.run` makes in Python before it calls the native
    session (`session._sess.run`): that every graph input is in the feed (infertune's feed
    always holds them all, in its names), that no input is an OrtValue of another session
    (it passes numpy arrays), the WebGPU graph capture's rule, and a retry on another
    provider (a fallback infertune refuses anyway). On a recommender with four inputs they
    cost 1.1 us of a 14 us call (0.6 us the missing input check alone). Where the native
    session is not there (another ONNX Runtime version), it calls the public run."""
    native = getattr(session, "_sess", None)
    run = getattr(native, "run", None)
    if not callable(run):
        run = session.run  # (output_names, input_feed, run_options) too

    def run_native(output_names: list[str], feed: dict) -> list[np.ndarray]:
        return run(output_names, feed, None)

    def release(replacement: Callable) -> None:
        nonlocal run
        run = replacement

    return run_native, release


def _triton_plan(
    directory: Path, entry: dict, inputs: InputSignature, outputs: OutputSignature
) -> TritonPlan:
    """Triton's ONNX Runtime backend, with the tuned session settings where it has them."""
    settings = entry["settings"]
    triton_inputs, triton_outputs = onnx_tensors(directory / settings["file"])
    session = settings["session"]
    plan = TritonPlan(
        "onnxruntime", None, triton_inputs, triton_outputs, copy_onnx(directory, settings)
    )
    plan.names = model_names(inputs, outputs, settings["input_names"], settings["output_names"])
    plan.default_model_filename = "model.onnx"
    plan.carried.append("instance_group KIND_CPU (tuned on the CPU execution provider)")
    if session["intra_op_threads"]:
        plan.parameters["intra_op_thread_count"] = str(session["intra_op_threads"])
        plan.carried.append(f"intra_op_thread_count {session['intra_op_threads']}")
    plan.parameters["execution_mode"] = "1" if session["execution_mode"] == "parallel" else "0"
    plan.carried.append(f"execution_mode {session['execution_mode']}")
    # Triton's ONNX Runtime backend: no graph level = ORT_ENABLE_ALL, -1 basic, 1 extended.
    level = {"all": None, "extended": 1, "basic": -1}[session["graph_optimization"]]
    if level is not None:
        plan.graph_level = level
        plan.carried.append(f"graph optimization level {session['graph_optimization']}")
    if not session["allow_spinning"]:
        plan.notes.append(
            "the tuned session's worker threads sleep between calls (nospin); Triton's ONNX "
            "Runtime backend has no parameter for that, so its sessions spin (ONNX Runtime's "
            "default)"
        )
    if entry["precision"] != "fp32":
        plan.carried.append(f"{entry['precision']} (in the quantized model.onnx)")
    return plan


class OnnxRuntimeCpuInt8(OnnxRuntimeCpu):
    """Dynamic int8 quantization of the weights of MatMul/Gemm/Conv (onnxruntime.quantization),
    with the settings above (`precision_note` says them in words)."""

    name = "onnxruntime-cpu-int8"
    conversions = ("onnx", "onnx-int8")
    precision = "int8"
    memory_factor = 0.75  # int8 weights, and their packed form
    rehearse_in_child = True  # the saved model.onnx is the quantized one: it loads as it ran
    triton_serves = True  # the quantized model.onnx, in the same Triton backend
    # How it reduces precision, in words a person reading a report or a manifest understands.
    precision_note: ClassVar[str] = INT8_SETTINGS_TEXT

    def model_export(self, target: Target) -> OnnxExport:
        return shared(target, "onnx-int8")

    def convert(self, target: Target) -> None:
        if not target.loading:  # tuning (a saved result loads as it was chosen)
            convolutions = _count_ops(export_onnx(target), ("Conv", "ConvTranspose"))
            if convolutions:
                raise NotApplicable(
                    f"the model has {convolutions} convolution(s), which dynamic quantization "
                    f"runs as ConvInteger, 4-11x slower than float32 (ResNet50, MobileNetV2); "
                    f"static int8 (onnxruntime-cpu-int8-static, with calibration=...) "
                    f"quantizes them"
                )
        super().convert(target)

    def save_artifact(self, directory: Path) -> dict:
        """As the fp32 session, plus the quantization settings the saved model was made with."""
        return {**super().save_artifact(directory), "quantization": dict(INT8_QUANTIZATION)}

    @classmethod
    def _preload(cls, target: Target, exported: OnnxExport) -> None:
        # The saved model.onnx is the quantized model: it is the int8 conversion.
        target.preload("onnx", exported)
        target.preload("onnx-int8", exported)


class OnnxRuntimeCpuInt8Static(OnnxRuntimeCpu):
    """Static int8 (QDQ): weights int8 per channel, activations uint8 with ranges calibrated
    on the user's calibration inputs (backends/onnxruntime/quantize.py). `method` is the calibration
    method, `keep` the layers (name scopes) left in float32: the pipeline tries other
    methods, then keeps the layers that lose most in float32 (pipeline/precision.py), each
    such setting a `variant` of its own quantization."""

    name = "onnxruntime-cpu-int8-static"
    conversions = ("onnx", "onnx-int8-static")
    precision = "int8"
    needs_calibration = True
    memory_factor = 0.5  # int8 weights, and their packed form
    relative_cost = 1.0  # a session of the quantized graph compiled twice, and the gate
    rehearse_in_child = True  # the saved model.onnx is the quantized one
    triton_serves = True
    calibration_methods: ClassVar[tuple[str, ...]] = tuple(CALIBRATION_METHODS)
    keeps_layers = True

    def __init__(self, method: str = "minmax", keep: tuple[str, ...] = ()):
        super().__init__()
        if method not in CALIBRATION_METHODS:
            raise ValueError(f"method must be one of {tuple(CALIBRATION_METHODS)}: {method!r}")
        self.method, self.keep = method, tuple(keep)
        self.reduce_range = not int8_dot()
        self.precision_note = static_settings_text(method, self.keep, self.reduce_range)
        self._own: OnnxExport | None = None

    def variant(self, method: str | None = None, keep: tuple[str, ...] | None = None) -> Backend:
        """The same candidate quantized with another calibration method or kept layers."""
        return type(self)(method or self.method, self.keep if keep is None else keep)

    def model_export(self, target: Target) -> OnnxExport:
        default = self.method == "minmax" and not self.keep
        if default or target.loading:  # the shared one, or the saved one (loaded)
            return shared(target, "onnx-int8-static")
        if self._own is None:
            self._own = static_int8(target, self.method, self.keep)
        return self._own

    def close(self) -> None:
        super().close()
        self._own = None

    def save_artifact(self, directory: Path) -> dict:
        """As the fp32 session (the quantized model.onnx), plus how it was quantized."""
        quantization = {"method": self.method, "keep": list(self.keep)}
        quantization["reduce_range"] = self.reduce_range
        return {**super().save_artifact(directory), "quantization": quantization}

    @classmethod
    def _from_settings(cls, settings: dict) -> OnnxRuntimeCpuInt8Static:
        quantization = settings["quantization"]
        backend = cls(quantization["method"], tuple(quantization["keep"]))
        backend.settings = OrtSettings(**settings["session"])
        backend.reduce_range = quantization["reduce_range"]
        backend.precision_note = static_settings_text(
            backend.method, backend.keep, backend.reduce_range
        )
        return backend

    @classmethod
    def _preload(cls, target: Target, exported: OnnxExport) -> None:
        target.preload("onnx", exported)
        target.preload("onnx-int8-static", exported)


def _count_ops(exported: OnnxExport, types: tuple[str, ...]) -> int:
    """How many nodes of the export's graph are of these op types."""
    import onnx

    graph = onnx.load_from_string(exported.model_bytes).graph
    return sum(node.op_type in types for node in graph.node)


def onnxruntime_cpu_variants() -> dict[str, Callable[[], Backend]]:
    """The default session, then one setting changed at a time (threads 1, 2, 4, ... < cores)."""
    settings = [OrtSettings()]
    threads = 1
    while threads < usable_cores():
        settings.append(OrtSettings(intra_op_threads=threads))
        threads *= 2
    settings.append(OrtSettings(execution_mode="parallel"))
    settings.append(OrtSettings(graph_optimization="basic"))
    settings.append(OrtSettings(allow_spinning=False))
    return {OnnxRuntimeCpu.name + s.suffix(): partial(OnnxRuntimeCpu, s) for s in settings}
