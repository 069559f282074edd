"""ONNX Runtime on the CPU, on the shared ONNX export of the model."""

from __future__ import annotations

import numpy as np

from ..export.onnx import export_onnx
from .base import Backend, Target

__all__ = ["OnnxRuntimeCpu"]


class OnnxRuntimeCpu(Backend):
    """An InferenceSession with the CPU execution provider and default session options."""

    name = "onnxruntime-cpu"
    provider = "CPUExecutionProvider"

    def available(self) -> str | None:
        try:
            import onnxruntime
        except ImportError as exc:
            return f"onnxruntime is not installed ({exc}); pip install onnxruntime"
        if self.provider not in onnxruntime.get_available_providers():
            return f"ONNX Runtime here has no {self.provider}"
        return None

    def prepare(self, target: Target) -> None:
        import onnxruntime

        exported = export_onnx(target)
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3  # errors only: warnings would flood the user's log
        self._session = onnxruntime.InferenceSession(
            exported.model_bytes, options, providers=[self.provider]
        )
        used = self._session.get_providers()
        if used[0] != self.provider:  # ONNX Runtime falls back silently; a fallback is a failure
            raise RuntimeError(f"ONNX Runtime used {used[0]} instead of {self.provider}")
        self._input_names = exported.input_names
        self._output_names = exported.output_names

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        return self._session.run(self._output_names, dict(zip(self._input_names, inputs)))

    def close(self) -> None:
        self._session = None
