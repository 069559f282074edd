"""Every shared conversion, declared once: what it makes, how it is built, what it costs.

A conversion is work several candidates share (the ONNX export serves every ONNX Runtime and
OpenVINO candidate): built once per optimize() under its key through `shared(target, key)`
(Target.shared keeps the value, or the failure, for the next candidate that asks), timed as a
stage of its own in the report. Planning (pipeline/planning.py: the order and the time
budget), memory admission (pipeline/memory.py), the offload to a worker process
(pipeline/offload.py, tf_worker.py) and the report's stage names all read this table.

Adding a conversion: its module with a build function `build(target) -> value` (in export/
where several runtimes share it, in its runtime's folder in backends/ where one runtime runs
it), and one line in CONVERSIONS. A backend names the keys it uses in `Backend.conversions`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..backends.litert.convert import (
    convert_fixed,
    convert_free,
    read_conversion,
    write_conversion,
)
from ..backends.litert.quantize import CALIBRATION_SAMPLES as TFLITE_SAMPLES
from ..backends.litert.quantize import convert_int8
from ..backends.onnxruntime.quantize import CALIBRATION_SAMPLES as ORT_SAMPLES
from ..backends.onnxruntime.quantize import (
    quantize_dynamic_int8,
    quantize_static_int8,
)
from ..backends.openvino.quantize import CALIBRATION_SAMPLES as NNCF_SAMPLES
from ..backends.openvino.quantize import quantize_for_openvino
from ..model.target import Target
from ..system.environment import (
    INT8_DOT_FLAGS,
    precision_instructions,
)
from .onnx import OnnxExport, convert_to_onnx
from .onnx_fp16 import float16_export

__all__ = [
    "CONVERSIONS",
    "Conversion",
    "WorkerFiles",
    "export_onnx",
    "int8_dot",
    "shared",
    "stage_name",
    "static_int8",
]


@dataclass(frozen=True)
class WorkerFiles:
    """How a conversion built by a worker process crosses to this one: `write(value,
    directory)` there, `read(directory)` here (pipeline/tf_worker.py)."""

    write: Callable[[Any, Path], None]
    read: Callable[[Path], Any]


@dataclass(frozen=True)
class Conversion:
    """One shared conversion.

    `cost`: seconds (whatever the model, per second of one trace of it) on the 2-core machine,
    before the corrections each machine learns (pipeline/machine.py). `memory`: copies of the
    weights it holds at its peak beyond the model, in this process; `memory_in_child`: in a
    child process of its own, where it runs there (`in_child(size)`), learned and estimated
    under the key + "-child" (pipeline/memory.py). `uninterruptible`: the share of its time spent
    in one native call that holds the GIL (a stage abandoned at the budget's end returns only
    when that call does). `worker`: set where a worker process may build it. `samples`: the
    calibration samples it reads (the first ones: what a worker process is given), 0 for
    none; `calibration_gflops`: the rate at which its calibration runs the model on them,
    GFLOP/s on the 2-core machine (pipeline/planning.py estimates its time from the model's
    arithmetic).
    """

    key: str
    stage: str  # its name as a stage of the report
    produces: str  # what it makes, in words
    build: Callable[[Target], Any]
    cost: tuple[float, float]
    memory: float
    memory_in_child: float | None = None
    in_child: Callable[[Any], bool] | None = None  # of sizes.ModelSize
    uninterruptible: float = 0.0
    worker: WorkerFiles | None = None
    samples: int = 0
    calibration_gflops: float = 100.0


# Costs measured inside optimize() on the 2-core machine: ResNet50 128x128 (a 1.2 s trace)
# exported to ONNX in 5.8 s and to TFLite in 4.7-5.7 s, MobileNetV2 224 (0.5 s) in 1.9 and
# 1.3 s, the small CNN in 0.2 s each. TFLite's MLIR conversion of ResNet50 held the GIL 3.6 s
# of 10.9 s. Memory: the process's high-water mark above the model, BERT-base-sized, each
# conversion alone: the ONNX export 4.1x; TFLite 5.4x through a SavedModel (the path past
# 256 MB) and 9.8x from the concrete function (below it); in a child of its own, 3.3x the
# 2.46 GB recommender's weights and the child's TensorFlow (0.65 GB), 3.6x in all: 4x
# covers 1 GiB. The quantization and float16 passes copy the weights once, at their size.
# The calibrated ones, ResNet50 224 (7.75 GFLOP a call, a 0.7 s trace), each alone: TFLite's
# full int8 15.2 s from the float32 conversion the LiteRT candidates share when TFLite's
# calibrator ran the model on 32 samples in the interpreter on one core (12.4 s, 20 GFLOP/s);
# infertune's range pass runs them with XNNPACK on both cores in 3.1-3.9 s, reading and
# writing the flatbuffer included (about 70 GFLOP/s, backends/litert/quantize.py `_ranged`),
# then 2.8 s the quantization (MobileNetV2 224 0.3 s, the BERT-sized encoder, 0.2 s trace,
# 6.6 s with the calibrator); NNCF 15.9 s, 9.5 of it its statistics on 128 samples (OpenVINO,
# 104 GFLOP/s), the rest two compiles and its graph matching; ONNX Runtime's static
# quantization 5.7 s, 2.3 of it the calibration on 32 samples (110 GFLOP/s).
CONVERSIONS: dict[str, Conversion] = {
    c.key: c
    for c in (
        Conversion(
            "onnx", "ONNX export", "the model as ONNX (tf2onnx; external data past 2 GB)",
            convert_to_onnx, cost=(0.3, 4.5), memory=4.0,
        ),
        Conversion(
            "onnx-int8", "int8 quantization", "the ONNX export with dynamic int8 weights",
            lambda target: quantize_dynamic_int8(export_onnx(target)),
            cost=(0.3, 2.0), memory=1.0,
        ),
        Conversion(
            "onnx-int8-static", "int8 static quantization (ONNX Runtime)",
            "the ONNX export with int8 weights and calibrated uint8 activations (QDQ)",
            lambda target: static_int8(target), cost=(1.0, 3.0), memory=1.5,
            samples=ORT_SAMPLES, calibration_gflops=110.0,
        ),
        Conversion(
            "openvino-int8", "int8 quantization (NNCF)",
            "the ONNX export quantized to int8 by NNCF for OpenVINO",
            lambda target: quantize_for_openvino(
                export_onnx(target),
                target.calibration_feeds(export_onnx(target).input_names, NNCF_SAMPLES),
            ),
            cost=(1.0, 8.0), memory=2.0, samples=NNCF_SAMPLES, calibration_gflops=100.0,
        ),
        Conversion(
            "onnx-fp16", "float16 conversion",
            "the ONNX export in float16 (ONNX Runtime's CUDA provider, TensorRT 11)",
            lambda target: float16_export(export_onnx(target)),
            cost=(0.3, 2.0), memory=1.0,
        ),
        Conversion(
            "tflite", "TFLite conversion", "the model as TFLite, free dimensions kept free",
            convert_free, cost=(0.3, 4.0), memory=5.5, memory_in_child=4.0,
            in_child=lambda size: size.tflite_in_child, uninterruptible=0.35,
            worker=WorkerFiles(write_conversion, read_conversion),
        ),
        Conversion(
            "tflite-int8", "TFLite full int8 conversion",
            "the model as TFLite in int8, activations calibrated (float32 inputs and outputs)",
            lambda target: convert_int8(target, target.calibration), cost=(0.3, 4.0),
            memory=5.5, worker=WorkerFiles(write_conversion, read_conversion),
            samples=TFLITE_SAMPLES, calibration_gflops=70.0,
        ),
        Conversion(
            "tflite-dynamic-int8", "TFLite dynamic-range conversion",
            "the model as TFLite with int8 weights, float32 activations",
            lambda target: convert_int8(target, None), cost=(0.3, 4.0), memory=5.5,
        ),
        Conversion(
            "tflite-fixed", "TFLite conversion at the sample's shapes",
            "the model as TFLite at the sample's exact shapes (None where it folds nothing)",
            convert_fixed, cost=(0.3, 4.0), memory=5.5, memory_in_child=4.0,
            in_child=lambda size: size.tflite_in_child, uninterruptible=0.35,
        ),
    )
}  # fmt: skip


def static_int8(target: Target, method: str = "minmax", keep: tuple[str, ...] = ()) -> OnnxExport:
    """The export statically quantized for ONNX Runtime on the target's calibration inputs;
    7-bit weights on a CPU without int8 dot products (VNNI, AMX), where ONNX Runtime's u8s8
    kernels saturate (shared/FIELD_NOTES.md)."""
    exported = export_onnx(target)
    feeds = target.calibration_feeds(exported.input_names, ORT_SAMPLES)
    return quantize_static_int8(exported, feeds, method, keep, reduce_range=not int8_dot())


def int8_dot() -> bool:
    """Whether this CPU sums int8 products in int32 (VNNI or AMX)."""
    return any(flag in precision_instructions() for flag in INT8_DOT_FLAGS)


def shared(target: Target, key: str) -> Any:
    """The conversion `key` of the target's model: built by its registered function on first
    use, then shared (a failure too: it raises again for every candidate that asks)."""
    conversion = CONVERSIONS[key]
    return target.shared(key, lambda: conversion.build(target))


def export_onnx(target: Target) -> OnnxExport:
    """The model as ONNX: the conversion every ONNX-based candidate starts from."""
    return shared(target, "onnx")


def stage_name(key: str) -> str:
    """A shared value's name as a stage of the report (a key outside the table: its own)."""
    conversion = CONVERSIONS.get(key)
    return conversion.stage if conversion is not None else f"conversion {key}"
