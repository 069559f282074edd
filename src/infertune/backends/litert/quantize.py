"""LiteRT's int8: the TFLite conversion with int8 weights, dynamic range ("tflite-dynamic-int8")
or full int8 with activations calibrated on the user's calibration inputs ("tflite-int8"),
for LiteRTInt8 and LiteRTDynamicInt8 (backends/litert/int8.py).

Full int8 quantizes the float32 conversion the LiteRT candidates share (backends/litert/
convert.py) after a range pass of its own (`_ranged`) where it applies, TFLite's calibrator
elsewhere; layers kept in float32 are the quantizer's deny list, found by their name scope
(precision/layers.py `keep_pattern`).
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ...model.target import Target
from ...precision.layers import keep_pattern
from .convert import (
    Converted,
    _converter,
    convert_free,
    input_order,
)

__all__ = ["CALIBRATION_SAMPLES", "convert_int8"]

# Samples the converter calibrates on. Its calibrator runs the float model in the interpreter
# on each, one at a time, with every tensor logged: ResNet50 224 took 76 s of optimize()'s
# 325 s on 128 samples; 32, what ONNX Runtime's calibration takes, cut it to a quarter.
CALIBRATION_SAMPLES = 32
_CALIBRATED = "calibrated"  # Converted.derived: (the calibration data, the calibrated flatbuffer)
# What the quantizing converter writes on stderr from native code, for every conversion.
_QUANTIZER_LINE = re.compile(rb"^fully_quantize: .*\n", re.M)


def convert_int8(
    target: Target,
    calibration: list[list[np.ndarray]] | None,
    keep: tuple[str, ...] = (),
) -> Converted:
    """The model as TFLite with int8 weights: full int8 (activations too, calibrated on
    `calibration`, flat input batches; float32 inputs and outputs, quantized and dequantized
    inside), or dynamic range where `calibration` is None (int8 weights, float32 activations).
    The name scopes in `keep` stay float32 (the quantizer's deny list: their ops' output
    tensors, found by name in the calibrated model).

    Full int8 is the converter's own post-training path taken in its parts: the float32
    conversion the LiteRT candidates share ("tflite"), calibrated once (`_calibrated`), then
    quantized (`mlir_quantize`, what the converter and its quantization debugger call).
    Before the ranges were measured by `_ranged`, the same flatbuffer, byte for byte, as
    `converter.convert()` with a representative dataset (checked on the precision benchmark's
    six models); now the same but for the ranges the converter's calibrator gets wrong and
    the last bit of others (XNNPACK's arithmetic). The model is not converted a second time
    (ResNet50 224 alone: 20.6 s the converter's way, 15.2 s from the shared conversion with
    TFLite's calibrator), and each variant keeping layers in float32 costs a quantization
    alone (2.8 s there), not a conversion and a calibration twice over (about 40 s)."""
    import tensorflow as tf

    if target.size().lean:
        raise RuntimeError(
            "int8 TFLite conversion of a model past 256 MB of weights is not done (its "
            "SavedModel path is float32 only here)"
        )
    if calibration is None:
        converter, names, rewritten = _converter(target)
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        return Converted(converter.convert(), names, tuple(rewritten))
    from tensorflow.lite.python import convert, lite

    float32 = target.shared("tflite", lambda: convert_free(target))
    calibrated = _calibrated(float32, calibration)
    nodes = _outputs_of(calibrated, keep) if keep else None
    with _quiet_converter():
        content = convert.mlir_quantize(calibrated, denylisted_nodes=nodes)
    content = lite._deduplicate_readonly_buffers(content)  # as the converter ends
    return Converted(content, float32.output_names, float32.rewrites)


def _calibrated(float32: Converted, calibration: list[list[np.ndarray]]) -> bytes:
    """The float32 flatbuffer with its tensors' ranges on the first CALIBRATION_SAMPLES
    calibration samples, made once per conversion and calibration data (kept with the
    conversion): measured by `_ranged` where it applies, else by TFLite's calibrator (one
    sample at a time on one core: ResNet50 224 14.5 s on 32 samples)."""
    held = float32.derived.get(_CALIBRATED)
    if held is not None and held[0] is calibration:
        return held[1]

    def samples() -> Iterator[list[np.ndarray]]:
        count = 0
        for batch in calibration:
            for i in range(len(batch[0])):
                if count == CALIBRATION_SAMPLES:
                    return
                count += 1
                yield [array[i : i + 1] for array in batch]

    flatbuffer = float32.content or float32.path.read_bytes()
    calibrated = _ranged(flatbuffer, samples)
    if calibrated is None:
        calibrated = _calibrator_ranged(flatbuffer, samples)
    float32.derived[_CALIBRATED] = (calibration, calibrated)
    return calibrated


def _calibrator_ranged(
    flatbuffer: bytes, samples: Callable[[], Iterator[list[np.ndarray]]]
) -> bytes:
    """The flatbuffer with the ranges TFLite's calibrator logs over `samples` (its
    interpreter, one sample at a time on one core, arrays in the model's input order)."""
    from tensorflow.lite.python import lite
    from tensorflow.lite.python.optimize import calibrator

    with _quiet_converter():
        logged = calibrator.Calibrator(calibrator.add_intermediate_tensors(flatbuffer), [], [])
        return logged.calibrate(lite.RepresentativeDataset(samples).input_gen)


def _ranged(flatbuffer: bytes, samples: Callable[[], Iterator[list[np.ndarray]]]) -> bytes | None:
    """The flatbuffer with the range (min, max) over `samples` of every float tensor an op
    reads or writes, the tensors TFLite's calibrator records: measured by running the model
    with each of them made an output, at XNNPACK's speed on every core (ResNet50 224, 32
    samples: 3.1-3.9 s against the calibrator's 14.5-14.8 s,
    benchmarks/studies/tflite_ranges.py). None where the calibrator records more (several
    subgraphs: control flow; ops with intermediate tensors: LSTM).

    Where the two differ, the calibrator is wrong: its interpreter runs ADD in place over its
    input and logs that input after the op, so a residual branch's range spans the sum's
    (ResNet50 224: 15 tensors, conv4_block6's -9.8..43.1 where its values span -9.8..9.1, an
    int8 step 2.8x coarser than its values need)."""
    from ai_edge_litert.interpreter import Interpreter
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils

    from ...system.environment import usable_cores
    from ...system.quiet import without_xnnpack_banner

    model = flatbuffer_utils.read_model_from_bytearray(bytearray(flatbuffer))
    if len(model.subgraphs) != 1:
        return None
    graph = model.subgraphs[0]
    if any(op.intermediates is not None and len(op.intermediates) for op in graph.operators):
        return None

    def constant(index: int) -> bool:
        data = model.buffers[graph.tensors[index].buffer].data
        return data is not None and len(data) > 0

    inputs = [int(i) for i in graph.inputs]
    read_or_written = {
        int(i) for op in graph.operators for i in (*op.inputs, *op.outputs) if i >= 0
    }
    ranged = sorted(
        i for i in read_or_written
        if graph.tensors[i].type == schema.TensorType.FLOAT32 and not constant(i)
    )  # fmt: skip
    outputs = [int(i) for i in graph.outputs]
    graph.outputs = np.array(
        outputs + [i for i in ranged if i not in outputs and i not in inputs], dtype=np.int32
    )
    content = bytes(flatbuffer_utils.convert_object_to_bytearray(model))

    def allocated() -> Any:
        made = Interpreter(model_content=content, num_threads=usable_cores())
        made.allocate_tensors()
        return made

    interpreter = without_xnnpack_banner(allocated)
    try:  # the samples' arrays in_0, in_1, ... by name, as LiteRT's candidates feed them
        feeds = input_order(interpreter.get_input_details(), len(inputs))
    except RuntimeError:  # not infertune's names: the calibrator's order, by position
        feeds = [d["index"] for d in interpreter.get_input_details()]
    low, high = _measured(interpreter, feeds, samples, lambda i: graph.tensors[i].name.decode())
    graph.outputs = np.array(outputs, dtype=np.int32)
    for index in ranged:
        if index not in low:
            continue
        tensor = graph.tensors[index]
        if tensor.quantization is None:
            tensor.quantization = schema.QuantizationParametersT()
        tensor.quantization.min, tensor.quantization.max = [low[index]], [high[index]]
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def _measured(
    interpreter: Any, feeds: list[int], samples: Callable, name: Callable[[int], str]
) -> tuple[dict[int, float], dict[int, float]]:
    """The least and greatest value of each float32 input and output of `interpreter` (the
    interpreter's tensor numbers are the model's) over `samples`, fed to `feeds` in order."""
    low: dict[int, float] = {}
    high: dict[int, float] = {}

    def record(index: int, values: np.ndarray) -> None:
        if values.dtype != np.float32 or not values.size:
            return
        lo, hi = float(values.min()), float(values.max())
        if math.isnan(lo) or math.isnan(hi):
            raise ValueError(
                f"the model gives NaN on a calibration sample (tensor {name(index)}): every "
                "calibration input must give real values"
            )
        low[index], high[index] = min(low.get(index, lo), lo), max(high.get(index, hi), hi)

    read = [d["index"] for d in interpreter.get_output_details()]
    # Allocated at these shapes when the interpreter was made.
    made = {d["index"]: tuple(int(n) for n in d["shape"]) for d in interpreter.get_input_details()}
    allocated = [made[index] for index in feeds]
    for arrays in samples():
        shapes = [tuple(a.shape) for a in arrays]
        if shapes != allocated:
            for index, shape in zip(feeds, shapes, strict=True):
                interpreter.resize_tensor_input(index, shape, strict=False)
            interpreter.allocate_tensors()
            allocated = shapes
        for index, array in zip(feeds, arrays, strict=True):
            interpreter.set_tensor(index, array)
            record(index, array)
        interpreter.invoke()
        for index in read:
            record(index, interpreter.get_tensor(index))
    return low, high


def _outputs_of(flatbuffer: bytes, scopes: tuple[str, ...]) -> list[str]:
    """The output tensor names of the ops of `scopes` in a TFLite model: ops whose output or
    constant inputs (weights, biases) carry a scope's name (a fused op joins its ops' names
    with ';'; the model's last op's output is just `Identity`, its weights still name it)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    interpreter = Interpreter(
        model_content=flatbuffer,
        experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
    )
    ops = interpreter._get_ops_details()
    produced = {o for op in ops for o in op["outputs"]}
    produced |= {d["index"] for d in interpreter.get_input_details()}

    def name(index: int) -> str:
        return interpreter._get_tensor_details(index, 0)["name"]

    pattern = re.compile("|".join(keep_pattern(scope) for scope in scopes))
    found = []
    for op in ops:
        output = name(op["outputs"][0])
        constants = [name(i) for i in op["inputs"] if i >= 0 and i not in produced]
        if any(pattern.search(n) for n in (output, *constants)):
            found.append(output)
    return found


@contextlib.contextmanager
def _quiet_converter() -> Iterator[None]:
    """The quantizing converter without its words: Python warnings (its calibrator's use of
    the deprecated tf.lite.Interpreter, statistics it does not need) and its native line."""
    import warnings

    from ...system.quiet import stderr_without

    with warnings.catch_warnings(), stderr_without(_QUANTIZER_LINE):
        warnings.simplefilter("ignore")
        yield
