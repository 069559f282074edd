"""int8 for OpenVINO ("openvino-int8"): NNCF's post-training quantization of the ONNX
export, calibrated on the user's calibration inputs.

`nncf.quantize(core.read_model(onnx), nncf.Dataset(feeds))` inserts FakeQuantize nodes that
OpenVINO's CPU plugin runs as int8 (VNNI, AMX: ResNet50 224 3.11x float32 on a VNNI EPYC, a
small CNN 3.5x on an AMX Xeon). NNCF imports OpenVINO, scipy and networkx, not TensorFlow nor
torch; its telemetry is switched off (NNCF_CI) and its progress bar, printed by `rich` to
stdout, silenced. Layers kept in float32 are NNCF's ignored scope, matched by their name scope
(onnx_int8.keep_pattern). A transformer-shaped graph (MatMul with Softmax) is quantized with
NNCF's transformer rules (SmoothQuant, no quantized Softmax inputs).

The result is an openvino.Model in memory, written as OpenVINO's IR (model.xml and
model.bin) for save(), which OpenVINO loads without NNCF.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..quiet import stdout_silenced
from .onnx import OnnxExport
from .onnx_int8 import keep_pattern

__all__ = [
    "CALIBRATION_SAMPLES",
    "IR_FILE",
    "OpenVinoInt8",
    "nncf_missing",
    "quantize_for_openvino",
    "read_ir",
]

IR_FILE = "model.xml"  # and model.bin beside it
# Samples NNCF collects statistics on (it keeps statistics, not tensors: its default is 300).
CALIBRATION_SAMPLES = 128


@dataclass
class OpenVinoInt8:
    """The quantized model, and how it was quantized."""

    model: Any  # openvino.Model
    input_names: list[str]
    output_names: list[str]
    settings: str  # in words

    def write(self, directory: Path) -> None:
        import openvino

        openvino.save_model(self.model, str(directory / IR_FILE), compress_to_fp16=False)


def nncf_missing() -> str | None:
    """Why NNCF cannot quantize here (not installed), or None."""
    import importlib.util

    if importlib.util.find_spec("nncf") is None:
        return "nncf is not installed (it quantizes for OpenVINO: pip install 'nncf>=3.4')"
    return None


def quantize_for_openvino(
    exported: OnnxExport,
    feeds: list[dict[str, np.ndarray]],
    keep: tuple[str, ...] = (),
) -> OpenVinoInt8:
    """The export quantized to int8 by NNCF, calibrated on `feeds` (dicts by input name),
    the name scopes in `keep` left in float32."""
    os.environ.setdefault("NNCF_CI", "1")  # before NNCF's import: no telemetry
    import logging

    import nncf
    import openvino

    nncf.set_log_level(logging.ERROR)
    core = openvino.Core()
    model = core.read_model(exported.session_model())
    ops = {op.get_type_name() for op in model.get_ordered_ops()}
    transformer = "Softmax" in ops and "MatMul" in ops
    ignored = None
    if keep:
        patterns = [f".*{keep_pattern(scope)}.*" for scope in keep]
        ignored = nncf.IgnoredScope(patterns=patterns, validate=False)
    with _quiet():
        quantized = nncf.quantize(
            model,
            nncf.Dataset(feeds),
            subset_size=len(feeds),
            model_type=nncf.ModelType.TRANSFORMER if transformer else None,
            ignored_scope=ignored,
        )
    words = f"int8 by NNCF {nncf.__version__} on {len(feeds)} calibration samples"
    if transformer:
        words += ", transformer rules"
    if keep:
        words += f"; kept in float32: {', '.join(keep)}"
    return OpenVinoInt8(quantized, list(exported.input_names), list(exported.output_names), words)


def read_ir(directory: Path, settings: dict) -> OpenVinoInt8:
    """A quantized model saved by OpenVinoInt8.write (no NNCF needed)."""
    import openvino

    model = openvino.Core().read_model(str(directory / IR_FILE))
    return OpenVinoInt8(
        model, list(settings["input_names"]), list(settings["output_names"]),
        settings.get("quantization", ""),
    )  # fmt: skip


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """NNCF's progress bar (rich, on stdout) silenced for the call."""
    try:
        import rich

        console = rich.get_console()
    except ImportError:
        console = None
    quiet = console.quiet if console is not None else None
    if console is not None:
        console.quiet = True
    try:
        with stdout_silenced():
            yield
    finally:
        if console is not None:
            console.quiet = quiet
