"""OpenVINO on the CPU, on the shared ONNX export of the model.

OpenVINO's CPU plugin fuses and JIT-compiles the graph for the exact instruction set here, which
can beat ONNX Runtime on larger models. Its defaults are not a faithful fp32 run: on a CPU with
bf16 support it computes in bf16 unless told otherwise (about 5e-3 relative error), so the exact
candidate pins the inference precision to f32 and bf16 is a reduced-precision candidate of its own.
"""

from __future__ import annotations

import importlib.util
import threading
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

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
from ...model.inputs import InputSignature
from ...model.outputs import OutputSignature
from ...system.environment import (
    BF16_FLAGS,
    install_hint,
    precision_instructions,
)
from ..base import (
    Backend,
    RunFacts,
    Target,
)
from ..triton_plan import (
    TritonPlan,
    copy_onnx,
    model_names,
    onnx_tensors,
)
from .quantize import (
    CALIBRATION_SAMPLES,
    IR_FILE,
    SMOOTH_QUANT_OFF,
    SMOOTH_QUANT_ON,
    OpenVinoInt8,
    nncf_missing,
    quantize_for_openvino,
    read_ir,
)

__all__ = ["OpenVinoCpu", "OpenVinoCpuBf16", "OpenVinoCpuInt8"]

_INSTALL = install_hint("openvino")
_HINTS = ("LATENCY", "THROUGHPUT")


# OpenVINO 2026.4's Type.to_dtype() fills a static table at its first call in a process and
# waits for the GIL while it holds that table's guard: two threads making their first call at
# once deadlock (the other holds the GIL, waiting for the guard). Two OpenVINO candidates
# prepared at once hung `infertune env --check`; 4 threads calling it at once hung 13 of 30
# processes, none with this lock.
_TO_DTYPE = threading.Lock()


def port_dtype(port: Any) -> np.dtype:
    """The numpy dtype of an OpenVINO port, its first computation one thread at a time."""
    with _TO_DTYPE:
        return port.get_element_type().to_dtype()


@cache
def _core() -> Any:
    """One OpenVINO Core per process: it loads the CPU plugin once for every candidate."""
    import openvino

    return openvino.Core()


class OpenVinoCpu(Backend):
    """The model compiled for OpenVINO's CPU device in f32, with a pool of infer requests.

    The batch dimension stays dynamic (as in the ONNX export), so any batch size runs without
    recompiling. `performance_hint` is OpenVINO's PERFORMANCE_HINT; None follows optimize()'s
    objective (LATENCY or THROUGHPUT). THROUGHPUT splits the cores into streams, which one
    synchronous request may not fill: the measurement says whether it pays.
    """

    name = "openvino-cpu"
    conversions = ("onnx",)
    relative_cost = 2.0  # OpenVINO compiles the graph twice, JIT kernels included
    memory_factor = 1.5  # its compiled weights (the ONNX file mapped beside them)
    precision = "fp32"
    requires = "openvino"
    runtime_packages = ("openvino",)
    rehearse_in_child = True
    triton_serves = True
    inference_precision: ClassVar[str] = "f32"  # an openvino.Type name

    def __init__(self, performance_hint: str | None = None, callers_only: bool = False):
        if performance_hint is not None and performance_hint not in _HINTS:
            raise ValueError(
                f"performance_hint must be one of {_HINTS} or None. Received: {performance_hint!r}."
            )
        self.performance_hint = performance_hint
        self.callers_only = callers_only
        suffix = "" if performance_hint is None else f":{performance_hint.lower()}"
        self.name = type(self).name + suffix
        self._idle: list | None = None

    def available(self) -> str | None:
        # find_spec instead of an import: `import openvino` costs 50-250 ms, this 0.1 ms.
        if importlib.util.find_spec("openvino") is None:
            return f"openvino is not installed; {_INSTALL}"
        return None

    def convert(self, target: Target) -> None:
        self._exported = export_onnx(target)  # what save_artifact writes
        self.hint = self._hint(target)  # the PERFORMANCE_HINT compiled with

    def _model(self) -> tuple[Any, list[str], list[str]]:
        """The openvino.Model to compile (after convert()), its input and output names."""
        exported = self._exported
        # The ONNX frontend reads the serialized ModelProto from memory: no temporary file;
        # past 2 GB, model.onnx from its path, which maps model.onnx.data beside it.
        model = _core().read_model(exported.session_model())
        return model, exported.input_names, exported.output_names

    def prepare(self, target: Target) -> None:
        import openvino
        import openvino.properties.hint as hints

        self.convert(target)
        core = _core()
        model, input_names, output_names = self._model()
        wanted = getattr(openvino.Type, self.inference_precision)
        compiled = core.compile_model(
            model,
            "CPU",
            {
                hints.inference_precision: wanted,
                hints.performance_mode: getattr(hints.PerformanceMode, self.hint),
            },
        )
        used = compiled.get_property(hints.inference_precision)
        if used != wanted:  # OpenVINO falls back silently; a fallback is a failure
            raise RuntimeError(f"OpenVINO compiled for {used} instead of {wanted}")

        # Ports by name, in the export's order, not by position in OpenVINO's model.
        self._inputs = [compiled.input(name) for name in input_names]
        self._outputs = [compiled.output(name) for name in output_names]
        for port, spec in zip(self._inputs, target.signature.specs):
            got = port_dtype(port)
            if got != spec.dtype:
                raise RuntimeError(
                    f"OpenVINO input {port.get_any_name()} is {got}, the signature says "
                    f"{spec.dtype} for '{spec.name}'"
                )
        # run() returns the model's own dtypes; astype also copies out of OpenVINO's buffers.
        self._dtypes = list(target.output_dtypes)
        self._compiled = compiled
        # An infer request runs one call at a time: a call takes an idle one and puts it
        # back, and a call that finds none idle (the others busy in other threads) makes
        # one more, which stays. A list's pop and append are atomic: no lock is taken.
        self._idle = [compiled.create_infer_request()]
        self._tensor = openvino.Tensor

    def _hint(self, target: Target) -> str:
        if self.performance_hint is not None:
            return self.performance_hint
        return "THROUGHPUT" if target.objective == "throughput" else "LATENCY"

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        idle, tensor = self._idle, self._tensor
        try:
            request = idle.pop()
        except IndexError:  # every request is busy in another thread
            request = self._compiled.create_infer_request()
        except AttributeError:  # close() set it to None
            raise ClosedError(
                f"the {self.name} backend was closed: its compiled model is released"
            ) from None
        try:
            for port, array in zip(self._inputs, inputs):
                if not array.flags.c_contiguous:  # shared memory needs C order
                    array = np.ascontiguousarray(array)
                request.set_tensor(port, tensor(array, shared_memory=True))
            request.infer()
            # The output buffers are overwritten by the next inference: hand back copies.
            return [
                request.get_tensor(port).data.astype(dtype)
                for port, dtype in zip(self._outputs, self._dtypes)
            ]
        finally:
            idle.append(request)

    def trim(self) -> None:
        idle = self._idle
        if idle:
            del idle[1:]

    def close(self) -> None:
        """Release the compiled model: its infer requests, its ports and the model itself
        (no runner holds them: each call reads them here, and a call after this is refused)."""
        self._idle = None
        self._compiled = None
        self._inputs = self._outputs = []  # ports keep their compiled model alive
        self._exported = None

    def save_artifact(self, directory: Path) -> dict:
        """model.onnx (OpenVINO compiles it on load) and the compile settings."""
        exported = self._exported
        return {
            **write_onnx(directory, exported, exported),
            "performance_hint": self.performance_hint,  # as constructed (None: the objective's)
            "hint": self.hint,  # as compiled
            "inference_precision": self.inference_precision,
        }

    @classmethod
    def triton_plan(
        cls, directory: Path, entry: dict, inputs: InputSignature, outputs: OutputSignature
    ) -> TritonPlan:
        """Triton's OpenVINO backend: the performance hint, and bf16 where it was tuned."""
        settings = entry["settings"]
        triton_inputs, triton_outputs = onnx_tensors(directory / settings["file"])
        plan = TritonPlan(
            "openvino", None, triton_inputs, triton_outputs, copy_onnx(directory, settings)
        )
        plan.names = model_names(inputs, outputs, settings["input_names"], settings["output_names"])
        plan.default_model_filename = "model.onnx"
        plan.parameters["PERFORMANCE_HINT"] = settings["hint"]
        plan.carried += ["instance_group KIND_CPU", f"PERFORMANCE_HINT {settings['hint']}"]
        if settings["inference_precision"] == "bf16":
            plan.parameters["HINT_BF16"] = "YES"
            plan.carried.append("bf16 inference precision (HINT_BF16)")
        else:
            plan.notes.append(
                "f32 inference precision cannot be pinned: Triton's OpenVINO backend has only "
                "HINT_BF16=YES, and on CPUs with bf16 units (avx512_bf16, AMX) OpenVINO computes "
                "in bf16 by default (about 5e-3 relative error measured on MobileNetV2). Serve "
                "it on a CPU without bf16, or export an onnxruntime-cpu result for exact fp32"
            )
        return plan

    @classmethod
    def load_artifact(cls, directory: Path, settings: dict, target: Target) -> Backend:
        backend = cls(settings["performance_hint"])
        target.preload("onnx", read_onnx(directory, settings))
        backend.prepare(target)
        return backend


class OpenVinoCpuBf16(OpenVinoCpu):
    """The same compiled with bf16 inference precision: faster where the CPU has bf16 units."""

    name = "openvino-cpu-bf16"
    precision = "bf16"
    inference_precision = "bf16"
    rehearse_in_child = True
    triton_serves = True

    def not_worth_trying(self, run: RunFacts) -> str | None:
        return _no_bf16_units()


def _no_bf16_units() -> str | None:
    """Why bf16 cannot pay here: a CPU without bf16 arithmetic (avx512_bf16, AMX), where
    OpenVINO would emulate it, slower than float32; None where it has it."""
    if any(flag in precision_instructions() for flag in BF16_FLAGS):
        return None
    return (
        f"this CPU has no bf16 units ({' or '.join(BF16_FLAGS)}): bf16 would be emulated, "
        f"slower than float32"
    )


class OpenVinoCpuInt8(OpenVinoCpu):
    """The ONNX export quantized to int8 by NNCF (backends/openvino/quantize.py), compiled with f32
    inference precision (the ops NNCF leaves in float run in float32, never bf16). Saved as
    OpenVINO's IR, which loads without NNCF. `keep`: layers left in float32 (NNCF's ignored
    scope), a `variant` the pipeline makes where the gate rejects the default; `method`, on a
    transformer-shaped graph, NNCF's transformer rules with SmoothQuant (the default) or
    without (SMOOTH_QUANT_OFF), the pipeline's other calibration method there."""

    name = "openvino-cpu-int8"
    conversions = ("onnx", "openvino-int8")
    precision = "int8"
    needs_calibration = True
    keeps_layers = True
    memory_factor = 1.0  # its int8 weights compiled, the IR's f32 copy dropped
    rehearse_in_child = True
    triton_serves = False
    triton_unsupported = (
        "infertune exports an int8 OpenVINO result as IR (model.xml), which its Triton plan "
        'does not describe yet: export it for Triton\'s Python backend (backend="python"), '
        "which runs it with infertune"
    )

    def __init__(
        self, performance_hint: str | None = None, callers_only: bool = False,
        keep: tuple[str, ...] = (), method: str = SMOOTH_QUANT_ON,
    ):  # fmt: skip
        super().__init__(performance_hint, callers_only)
        if method not in (SMOOTH_QUANT_ON, SMOOTH_QUANT_OFF):
            raise ValueError(f"method must be {SMOOTH_QUANT_ON!r} or {SMOOTH_QUANT_OFF!r}")
        self.keep, self.method = tuple(keep), method
        self._quantized: OpenVinoInt8 | None = None

    @property
    def calibration_methods(self) -> tuple[str, ...]:  # type: ignore[override]
        """With SmoothQuant and without, where the quantized graph has attention (NNCF's
        transformer rules applied); one way otherwise, and before it is quantized."""
        quantized = self._quantized
        return (SMOOTH_QUANT_ON, SMOOTH_QUANT_OFF) if quantized and quantized.transformer else ()

    def tuning_unavailable(self) -> str | None:
        return nncf_missing()

    def variant(self, method: str | None = None, keep: tuple[str, ...] | None = None) -> Backend:
        method = method or self.method
        return type(self)(self.performance_hint, self.callers_only, keep or (), method)

    def convert(self, target: Target) -> None:
        self.hint = self._hint(target)
        if self._quantized is not None:
            return
        default = not self.keep and self.method == SMOOTH_QUANT_ON
        if default or target.loading:  # the shared one, or the saved one
            self._quantized = shared(target, "openvino-int8")
        else:
            exported = export_onnx(target)
            feeds = target.calibration_feeds(exported.input_names, CALIBRATION_SAMPLES)
            smooth_quant = self.method == SMOOTH_QUANT_ON
            self._quantized = quantize_for_openvino(exported, feeds, self.keep, smooth_quant)
        self.precision_note = self._quantized.settings

    def _model(self) -> tuple[Any, list[str], list[str]]:
        quantized = self._quantized
        return quantized.model, quantized.input_names, quantized.output_names

    def close(self) -> None:
        super().close()
        self._quantized = None

    def save_artifact(self, directory: Path) -> dict:
        """OpenVINO's IR of the quantized model (model.xml, model.bin) and the settings."""
        quantized = self._quantized
        quantized.write(directory)
        return {
            "file": IR_FILE,
            "input_names": quantized.input_names,
            "output_names": quantized.output_names,
            "quantization": quantized.settings,
            "keep": list(self.keep),
            "method": self.method,
            "performance_hint": self.performance_hint,
            "hint": self.hint,
            "inference_precision": self.inference_precision,
        }

    @classmethod
    def load_artifact(cls, directory: Path, settings: dict, target: Target) -> Backend:
        backend = cls(
            settings["performance_hint"], keep=tuple(settings.get("keep", ())),
            method=settings.get("method", SMOOTH_QUANT_ON),
        )  # fmt: skip
        target.preload("openvino-int8", read_ir(directory, settings))
        backend.prepare(target)
        return backend
