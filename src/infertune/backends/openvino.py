"""OpenVINO on the CPU, on the shared ONNX export of the model.

OpenVINO's CPU plugin fuses and JIT-compiles the graph for the exact instruction set here, which
can beat ONNX Runtime on larger models. Its defaults are not a faithful fp32 run: on a CPU with
bf16 support it computes in bf16 unless told otherwise (about 5e-3 relative error), so the exact
candidate pins the inference precision to f32 and bf16 is a reduced-precision candidate of its own.
"""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..environment import install_hint
from ..errors import one_line
from ..export.onnx import export_onnx, read_onnx, write_onnx
from ..inputs import InputSignature
from ..outputs import OutputSignature
from .base import Backend, Target
from .triton_plan import TritonPlan, copy_onnx, model_names, onnx_tensors

__all__ = ["OpenVinoCpu", "OpenVinoCpuBf16"]

_INSTALL = install_hint("openvino")
_HINTS = ("LATENCY", "THROUGHPUT")


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

    def prepare(self, target: Target) -> None:
        import openvino
        import openvino.properties.hint as hints

        self.convert(target)
        exported = self._exported
        core = _core()
        # The ONNX frontend reads the serialized ModelProto from memory: no temporary file;
        # past 2 GB, model.onnx from its path, which maps model.onnx.data beside it.
        model = core.read_model(exported.session_model())
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
        self._inputs = [compiled.input(name) for name in exported.input_names]
        self._outputs = [compiled.output(name) for name in exported.output_names]
        for port, spec in zip(self._inputs, target.signature.specs):
            got = port.get_element_type().to_dtype()
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
            raise RuntimeError("this OpenVINO backend is closed") from None
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

    def available(self) -> str | None:
        reason = super().available()
        if reason is not None:
            return reason
        try:
            capabilities = _core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
        except (ImportError, RuntimeError) as exc:
            return f"OpenVINO cannot query the CPU ({one_line(exc)})"
        if "BF16" not in capabilities:
            return (
                f"this CPU has no bf16 support (OpenVINO's CPU capabilities: "
                f"{', '.join(capabilities)})"
            )
        return None
