"""Keras/TensorFlow -> TFLite, done once per optimize() and shared by every LiteRT candidate.

The model is converted with TensorFlow's TFLite converter from the same flat tf.function the
other conversions start from (Target.traced()): float32, no quantization, builtin ops only.
Two conversions: "tflite", with the sample's free dimensions kept free (the batch among them),
and "tflite-fixed", at the sample's exact input shapes, where the converter folds shape
arithmetic into constants (backends/litert/backend.py says when that pays and when the fixed
one is the only one that converts). The int8 forms, full and dynamic range, are made in
backends/litert/quantize.py.

A large model (sizes.ModelSize.lean) goes through a SavedModel with its weights stored after
the flatbuffer (flatbuffers and protobuf messages stop at 2 GB); past
CHILD_CONVERSION_MIN_BYTES it is converted in a child process of its own
(backends/litert/child.py).

TFLite numbers its tensors in its own order, so outputs are matched by name: the names of
the traced function's output tensors, recorded here with the flatbuffer (`Converted`).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

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
    # What is made from it and kept with it (the calibrated flatbuffer full int8 quantizes:
    # backends/litert/quantize.py).
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
    flatbuffer comes out byte for byte the same (tests/backends/test_litert.py checks it). Where
    TensorFlow's private freezing functions moved, `converters_own` freezes: the same
    result, slower (tests/backends/test_litert.py fails on the pinned versions if that happens).
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
