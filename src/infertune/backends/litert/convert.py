"""Keras/TensorFlow -> TFLite, done once per optimize() and shared by every LiteRT candidate.

The model is converted with TensorFlow's TFLite converter from the same flat tf.function the
other conversions start from (Target.traced()): float32, no quantization, builtin ops only.
Two conversions: "tflite", with the sample's free dimensions kept free (the batch among them),
and "tflite-fixed", at the sample's exact input shapes, where the converter folds shape
arithmetic into constants (backends/litert/backend.py says when that pays and when the fixed one is
the only one that converts).

A large model (sizes.ModelSize.lean) goes through a SavedModel with its weights stored after
the flatbuffer (flatbuffers and protobuf messages stop at 2 GB); past
CHILD_CONVERSION_MIN_BYTES it is converted in a child process of its own (backends/litert/child.py).

TFLite numbers its tensors in its own order, so outputs are matched by name: the names of
the traced function's output tensors, recorded here with the flatbuffer (`Converted`).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import one_line
from ...export.rewrites import rewriting_for_tflite
from ...model.sizes import FIXED_TFLITE_MAX_BYTES
from ...model.source import (
    tensor_specs,
    trace,
)
from ...model.target import Target
from ...system.paths import (
    link_or_copy,
    remove_with,
)
from .child import (
    convert_in_child,
    convert_saved_model,
)

__all__ = [
    "Converted",
    "convert_fixed",
    "convert_free",
    "convert_int8",
    "converter_error",
    "input_order",
    "read_conversion",
    "reads_shapes",
    "tensor_name",
    "write_conversion",
]


@dataclass(frozen=True)
class Converted:
    """A TFLite flatbuffer and the names of its outputs in the flat function's order."""

    content: bytes  # b"" where `path` holds it
    output_names: tuple[str, ...]
    rewrites: tuple[str, ...] = ()  # notes of the exact rewrites made (rewrites.py)
    # A large model's flatbuffer in a temporary file of its own, removed with this object:
    # each interpreter maps it (XNNPACK packs the weights from it), and no copy of it stays
    # in this process's memory while no LiteRT candidate runs (a 2.42 GB MLP's bytes, held
    # from the conversion to the end, were 1x of its weights in every later peak).
    path: Path | None = None
    _cleanup: Any = field(default=None, repr=False, compare=False)
    # What is made from it and kept with it (the calibrated flatbuffer full int8 quantizes).
    derived: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def size(self) -> int:
        return self.path.stat().st_size if self.path is not None else len(self.content)

    def interpreter(self, **options: Any) -> Any:
        """An Interpreter on the flatbuffer (from the file where there is one)."""
        from ai_edge_litert.interpreter import Interpreter

        if self.path is not None:
            return Interpreter(model_path=str(self.path), **options)
        return Interpreter(model_content=self.content, **options)

    def write(self, destination: Path) -> None:
        """The flatbuffer as the file `destination` (a hard link where it can be)."""
        if self.path is None:
            destination.write_bytes(self.content)
        else:
            link_or_copy(self.path, destination)


def _in_own_file(
    write: Callable[[Path], None], output_names: Callable[[Converted], tuple[str, ...]]
) -> Converted:
    """A Converted whose flatbuffer `write` puts in a temporary file, removed with it; its
    output names read from it by `output_names`."""
    directory = Path(tempfile.mkdtemp(prefix="infertune-tflite-"))
    path = directory / "model.tflite"
    try:
        write(path)
        converted = Converted(b"", output_names(Converted(b"", (), path=path)), path=path)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    object.__setattr__(converted, "_cleanup", remove_with(converted, directory))
    return converted


def convert(target: Target, fixed: bool = False) -> Converted:
    """The model as TFLite (float32, no quantization), shared by every LiteRT variant: with a
    free batch dimension, or `fixed` at the sample's exact input shapes."""
    if target.size().lean:  # the SavedModel path (model/sizes.py says why)
        return _convert_large(target, fixed)
    converter, names, rewritten = _converter(target, fixed)
    converter.optimizations = []  # no quantization: float32 weights and arithmetic
    return Converted(converter.convert(), names, tuple(rewritten))


def _converter(target: Target, fixed: bool = False) -> tuple[Any, tuple[str, ...], list[str]]:
    """The TFLite converter of the traced model (its concrete-function path), the names of
    its outputs, and the list its exact rewrites' notes go into as it converts."""
    import tensorflow as tf

    if fixed:
        specs = tensor_specs(target.signature)
        shapes = target.signature.concrete_shapes()
        specs = [tf.TensorSpec(shape, s.dtype, name=s.name) for shape, s in zip(shapes, specs)]
        function = tf.function(
            target.source.graph_function(target.signature), input_signature=specs
        )
        concrete = trace(function)
    else:
        function, concrete = target.traced()  # the trace the ONNX export starts from too
    # The tf.function as trackable_obj selects the converter's concrete-function pipeline
    # (freeze the variables, convert the graph): tensors keep their graph names (in_0,
    # Identity_1), and there is no SavedModel round trip through a temporary directory.
    converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete], function)
    freeze = partial(_frozen, concrete, converter._freeze_concrete_function)
    rewritten: list[str] = []  # the ops the converter rejects, rewritten (rewrites.py)
    converter._freeze_concrete_function = rewriting_for_tflite(freeze, rewritten)
    # No conversion metadata: adding it reads the whole flatbuffer into Python objects and
    # writes it again (two more copies of the weights, and their time); nothing reads it.
    converter.exclude_conversion_metadata = True
    # Builtin ops only: an op without a builtin kernel fails the conversion here, rather than
    # needing TensorFlow's kernels (SELECT_TF_OPS) inside the interpreter.
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    names = tuple(tensor_name(tensor.name) for tensor in concrete.outputs)
    return converter, names, rewritten


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
    samples: 3.1-3.9 s against the calibrator's 14.5-14.8 s, benchmarks/tflite_ranges.py).
    None where the calibrator records more
    (several subgraphs: control flow; ops with intermediate tensors: LSTM).

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


def input_order(details: list[dict], count: int) -> list[int]:
    """Tensor indices of inputs in_0 ... in_<count-1>, found by name (in_3, or a prefixed
    serving_default_in_3:0), never by position."""
    found: dict[int, int] = {}
    for detail in details:
        match = re.fullmatch(r"(?:.*_)?in_(\d+)(?::\d+)?", detail["name"])
        if match is None or int(match.group(1)) in found:
            raise RuntimeError(f"unexpected TFLite input name {detail['name']!r}")
        found[int(match.group(1))] = detail["index"]
    if sorted(found) != list(range(count)):
        names = sorted(d["name"] for d in details)
        raise RuntimeError(f"TFLite inputs {names} are not in_0 ... in_{count - 1}")
    return [found[i] for i in range(count)]


def _outputs_of(flatbuffer: bytes, scopes: tuple[str, ...]) -> list[str]:
    """The output tensor names of the ops of `scopes` in a TFLite model: ops whose output or
    constant inputs (weights, biases) carry a scope's name (a fused op joins its ops' names
    with ';'; the model's last op's output is just `Identity`, its weights still name it)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    from ..onnxruntime.quantize import keep_pattern

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


# Samples the converter calibrates on. Its calibrator runs the float model in the interpreter
# on each, one at a time, with every tensor logged: ResNet50 224 took 76 s of optimize()'s
# 325 s on 128 samples; 32, what ONNX Runtime's calibration takes, cut it to a quarter.
CALIBRATION_SAMPLES = 32
_CALIBRATED = "calibrated"  # Converted.derived: (the calibration data, the calibrated flatbuffer)
# What the quantizing converter writes on stderr from native code, for every conversion.
_QUANTIZER_LINE = re.compile(rb"^fully_quantize: .*\n", re.M)


@contextlib.contextmanager
def _quiet_converter() -> Iterator[None]:
    """The quantizing converter without its words: Python warnings (its calibrator's use of
    the deprecated tf.lite.Interpreter, statistics it does not need) and its native line."""
    import warnings

    from ...system.quiet import stderr_without

    with warnings.catch_warnings(), stderr_without(_QUANTIZER_LINE):
        warnings.simplefilter("ignore")
        yield


def convert_free(target: Target) -> Converted:
    """The "tflite" conversion: every free dimension of the sample kept free."""
    return convert(target)


def convert_fixed(target: Target) -> Converted | None:
    """The "tflite-fixed" conversion, at the sample's exact shapes. Where the free one fails,
    the only one (the candidate then runs those shapes alone); where it succeeds, None where
    the free one serves the sample's shapes as well: past FIXED_TFLITE_MAX_BYTES, or where it
    reads no shape at run time, so that there is nothing to fold (backends/litert/backend.py)."""
    try:
        free = target.shared("tflite", lambda: convert_free(target))  # built once for both
    except Exception:
        return convert(target, fixed=True)
    if free.size > FIXED_TFLITE_MAX_BYTES:
        return None
    if not reads_shapes(free):
        return None
    return convert(target, fixed=True)


def _convert_large(target: Target, fixed: bool) -> Converted:
    """TFLite's large-model path: the function saved as a SavedModel (its variables in files
    of their own, no 2 GB message), converted from there with the weights stored after the
    flatbuffer (`_experimental_use_buffer_offset`: flatbuffers stop at 2 GB too). The outputs
    are a dict keyed in order, whose signature names their tensors in the flatbuffer."""
    import tensorflow as tf

    flat, concrete = target.traced()
    specs = tensor_specs(target.signature)
    if fixed:
        shapes = target.signature.concrete_shapes()
        specs = [tf.TensorSpec(shape, s.dtype, name=s.name) for shape, s in zip(shapes, specs)]

    def keyed(*args):
        return {f"out_{i:04d}": tensor for i, tensor in enumerate(flat(*args))}

    function = tf.function(keyed, input_signature=specs)
    module = tf.Module()
    module.function = function
    module.variables_kept = list(concrete.graph.variables)  # tracked: saved with the module
    directory = tempfile.mkdtemp(prefix="infertune-tflite-")
    try:
        tf.saved_model.save(module, directory, signatures=function.get_concrete_function())
        del module, function
        in_child = target.size().tflite_in_child
        write = convert_in_child if in_child else convert_saved_model
        return _in_own_file(partial(write, directory), _signature_output_names)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _signature_output_names(converted: Converted) -> tuple[str, ...]:
    """The output tensors' names of a model converted from a SavedModel, in the order of
    its signature's output keys (out_0000, out_0001, ...), read by an interpreter without
    XNNPACK (which would pack a copy of every weight)."""
    from ai_edge_litert.interpreter import OpResolverType

    interpreter = converted.interpreter(
        experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    )
    signature = next(iter(interpreter._get_full_signature_list().values()))
    names = {detail["index"]: detail["name"] for detail in interpreter.get_output_details()}
    outputs = signature["outputs"]
    return tuple(tensor_name(names[outputs[key]]) for key in sorted(outputs))


def _frozen(concrete: Any, converters_own: Callable[[], tuple]) -> tuple[Any, list, list, Any]:
    """What the converter's own `_freeze_concrete_function` returns, without the
    ConcreteFunction it rebuilds from the frozen graph (half of ResNet50's conversion: 3.7 s
    of 7.8): the converter reads only the graph and the input and output tensors' names,
    shapes and dtypes, which the traced function has too; its fourth value, the rebuilt
    function, feeds grappler, which the MLIR converter with builtin ops never runs. The
    flatbuffer comes out byte for byte the same (tests/test_litert.py checks it). Where
    TensorFlow's private freezing functions moved, `converters_own` freezes: the same
    result, slower (tests/test_litert.py fails on the pinned versions if that happens).
    """
    import tensorflow as tf

    try:
        from tensorflow.python.framework import convert_to_constants
        from tensorflow.python.util import object_identity

        data_class = convert_to_constants._FunctionConverterDataInEager
        replace = convert_to_constants._replace_variables_by_constants
    except (ImportError, AttributeError):
        return converters_own()
    data = data_class(func=concrete, lower_control_flow=False, aggressive_inlining=False)
    graph_def, converted = replace(converter_data=data)
    # The captures frozen into constants are no longer inputs (as in the rebuilt function).
    captures = concrete.graph.internal_captures
    frozen = object_identity.ObjectIdentitySet(captures[index] for index in converted)
    inputs = [t for t in concrete.inputs if t not in frozen and t.dtype != tf.resource]
    return graph_def, inputs, list(concrete.outputs), None


def converter_error(exc: Exception) -> str:
    """The converter's error in one line: its first MLIR diagnostic ("error: 'tf.X' op ...")
    without the source location that precedes it (a path into TensorFlow's own files)."""
    match = re.search(r"error: ([^\n]+)", str(exc))
    if match is None:
        return one_line(exc)
    text = f"{type(exc).__name__}: {match.group(1).strip()}"
    return text if len(text) <= 240 else text[:237] + "..."


# Operators that read a tensor's shape at run time (what a fixed conversion folds away), and
# control flow, whose subgraphs the operator list does not show.
_SHAPE_READERS = {"SHAPE", "RANK", "BROADCAST_ARGS", "WHILE", "IF", "CALL_ONCE"}


def reads_shapes(converted: Converted) -> bool:
    """Whether the converted model may compute a shape at run time (True where its operators
    cannot be read): its operators as an interpreter without delegates lists them (a
    delegate takes none of these into its partitions)."""
    from ai_edge_litert.interpreter import OpResolverType

    try:
        interpreter = converted.interpreter(
            experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
        )
        interpreter.allocate_tensors()
        ops = {op["op_name"] for op in interpreter._get_ops_details()}
    except Exception:
        return True
    return bool(_SHAPE_READERS & ops)


# A worker process (pipeline/tf_worker.py) writes the free conversion into its job directory
# and this process reads it back.
def write_conversion(converted: Converted, directory: Path) -> None:
    converted.write(directory / "model.tflite")
    (directory / "output_names.json").write_text(json.dumps(list(converted.output_names)))
    (directory / "rewrites.json").write_text(json.dumps(list(converted.rewrites)))


def read_conversion(directory: Path) -> Converted:
    names = tuple(json.loads((directory / "output_names.json").read_text()))
    rewrites = tuple(json.loads((directory / "rewrites.json").read_text()))
    return Converted((directory / "model.tflite").read_bytes(), names, rewrites)


def tensor_name(name: str) -> str:
    """A graph tensor's name without its output number: Identity_1:0 -> Identity_1."""
    return re.sub(r":0$", "", name)
