"""LiteRT in int8: full int8 with calibrated activations (`LiteRTInt8`, "litert-int8") and
dynamic range, int8 weights and float32 activations (`LiteRTDynamicInt8`,
"litert-dynamic-int8"), both run as the float32 backend runs its conversion
(backends/litert/backend.py), on the conversions backends/litert/quantize.py makes.
"""

from __future__ import annotations

from pathlib import Path

from ...export.registry import shared
from ..base import (
    Backend,
    RunFacts,
    Target,
)
from .backend import LiteRT, note_rewrites
from .convert import Converted
from .quantize import convert_int8

__all__ = ["LARGE_FLOPS", "LiteRTDynamicInt8", "LiteRTInt8"]


class LiteRTInt8(LiteRT):
    """LiteRT on the model converted to full int8 (backends/litert/quantize.py `convert_int8`:
    weights and activations int8, activation ranges calibrated on the user's calibration inputs,
    float32 inputs and outputs quantized and dequantized inside the model), one conversion
    with the sample's free dimensions. `keep`: layers left in float32 (the converter's deny
    list), a `variant` the pipeline makes where the gate rejects the default."""

    name = "litert-int8"
    conversions = ("tflite-int8",)
    precision = "int8"
    needs_calibration = True
    keeps_layers = True
    memory_factor = 1.0  # int8 weights: a quarter, and XNNPACK's packed copy
    rehearse_in_child = True
    conversion = "tflite-int8"  # the registry's key of its conversion

    def __init__(self, threads: int | None = None, keep: tuple[str, ...] = ()):
        super().__init__(threads)
        self.keep = tuple(keep)
        self._own: Converted | None = None
        self.precision_note = "full int8 (calibrated activations, float32 inputs and outputs)"
        if self.keep:
            self.precision_note += f"; kept in float32: {', '.join(self.keep)}"

    def variant(self, method: str | None = None, keep: tuple[str, ...] | None = None) -> Backend:
        return type(self)(self.threads, keep or ())

    def convert(self, target: Target) -> None:
        self._fixed = None
        self.exact_shapes, self.exact_reason = None, ""
        if self.keep and not target.loading:
            if target.source is None:
                raise RuntimeError("keeping TFLite layers in float32 needs the model (TensorFlow)")
            if self._own is None:
                self._own = convert_int8(target, target.calibration, self.keep)
            self._converted = self._own
        else:
            self._converted = shared(target, self.conversion)
        note_rewrites(target, self._converted)

    def close(self) -> None:
        super().close()
        self._own = None

    def save_artifact(self, directory: Path) -> dict:
        return {**super().save_artifact(directory), "keep": list(self.keep)}

    @classmethod
    def load_artifact(cls, directory: Path, settings: dict, target: Target) -> Backend:
        names = tuple(settings["output_names"])
        converted = Converted((directory / settings["file"]).read_bytes(), names)
        target.preload(cls.conversion, converted)
        backend = cls(settings["threads"], tuple(settings.get("keep", ())))
        backend.prepare(target)
        return backend


# Dynamic-range int8 is not tried beside full int8 on convolutional models of at least this
# arithmetic a call (LiteRTDynamicInt8.not_worth_trying).
# benchmarks/studies/litert_dynamic_range.py, p50 at batch 1, dynamic-range over full int8,
# two runs: ResNet50 224 (7.8 GFLOP) 1.48x and 1.63x, MobileNetV2 224 (0.62) 2.84x and
# 3.14x, a MobileNetV2-style 64x64 classifier (0.015) 2.44x and 1.82x; faster on the digits
# CNN (0.011) 0.70x both times and a small transformer 0.28x and 0.41x. Below this the
# conversion takes a second.
LARGE_FLOPS = 100e6


_CONVOLUTIONS = ("Conv2D", "DepthwiseConv2dNative", "Conv3D", "Conv1D")


_BATCHED_PRODUCTS = ("BatchMatMulV2", "BatchMatMulV3", "BatchMatMul", "Einsum")


class LiteRTDynamicInt8(LiteRTInt8):
    """LiteRT on the model converted with dynamic-range int8: int8 weights, float32
    activations (the kernels quantize them per call); no calibration needed."""

    name = "litert-dynamic-int8"
    conversions = ("tflite-dynamic-int8",)
    needs_calibration = False
    keeps_layers = False
    rehearse_in_child = True
    conversion = "tflite-dynamic-int8"

    def __init__(self, threads: int | None = None, keep: tuple[str, ...] = ()):
        super().__init__(threads, keep)
        self.precision_note = "dynamic-range int8 (int8 weights, float32 activations)"

    def not_worth_trying(self, run: RunFacts) -> str | None:
        """Not tried beside full int8 on a convolutional model without attention of at least
        LARGE_FLOPS a call: its convolutions quantize their float32 inputs at every call,
        slower than full int8 on every such model measured, and its conversion takes seconds
        there (ResNet50 224: 8 s of an optimize() of 93)."""
        if LiteRTInt8.name not in run.candidates or not run.calibrated or run.flops is None:
            return None
        ops = run.op_types
        convolutional = any(ops.get(op) for op in _CONVOLUTIONS)
        attention = ops.get("Softmax") and any(ops.get(op) for op in _BATCHED_PRODUCTS)
        if run.flops < LARGE_FLOPS or not convolutional or attention:
            return None
        return (
            f"a convolutional model of {run.flops / 1e9:.2g} GFLOP a call: dynamic-range int8 "
            f"quantizes each convolution's float32 input at every call, slower than full int8 "
            f"({LiteRTInt8.name}, tried here) on every such model measured (ResNet50 224 "
            f"1.5-1.6x, MobileNetV2 224 2.8-3.1x: benchmarks/studies/litert_dynamic_range.py)"
        )
