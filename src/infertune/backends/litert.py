"""LiteRT (TensorFlow Lite) with XNNPACK: a lean interpreter with a low per-call floor.

The model is converted with TensorFlow's TFLite converter from the same flat tf.function
the other TensorFlow candidates use (float32, no quantization), and run by ai-edge-litert's
interpreter, whose default CPU delegate for float models is XNNPACK. The batch dimension is
-1 in the converted model: a new batch size resizes the input tensors once, and calls at an
unchanged shape do no resizing.

TFLite numbers its tensors in its own order (two outputs may come back swapped), so inputs and
outputs are matched by name: inputs by the in_<i> names the TensorSpecs carry, outputs by the
names of the traced function's output tensors, recorded at conversion. A name that does not
match fails prepare() instead of guessing an order.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from ..environment import usable_cores
from ..models import tensor_specs
from .base import Backend, Target

__all__ = ["LiteRT", "litert_variants"]

_INSTALL = "pip install 'infertune[litert]'"


class LiteRT(Backend):
    """ai-edge-litert's Interpreter on the TFLite conversion of the model.

    `threads` None uses every usable core; LiteRT's own default is one thread, which is
    1.3x faster for a tiny CNN and 1.8x slower for MobileNetV2 on two cores: a variant each.
    """

    name = "litert"
    requires = "litert"
    runtime_packages = ("ai-edge-litert",)
    rehearse_in_child = True

    def __init__(self, threads: int | None = None):
        self.threads = threads
        self.name = type(self).name + (f":threads={threads}" if threads else "")

    def available(self) -> str | None:
        if importlib.util.find_spec("ai_edge_litert") is None:
            return f"ai-edge-litert is not installed; {_INSTALL}"
        return None

    def convert(self, target: Target) -> None:
        self._converted: Converted = target.shared("tflite", lambda: _convert(target))

    def prepare(self, target: Target) -> None:
        from ai_edge_litert.interpreter import Interpreter

        self.convert(target)
        converted = self._converted
        threads = self.threads or usable_cores()
        # The default op resolver (AUTO) applies XNNPACK, LiteRT's default CPU delegate, to
        # the float ops it supports; the rest run on the builtin kernels.
        self._open = partial(Interpreter, model_content=converted.content, num_threads=threads)
        first = _Session(self._open())
        self._interpreter = first.interpreter  # the one a single-threaded caller always gets
        self._inputs = _input_order(
            self._interpreter.get_input_details(), len(target.signature.specs)
        )
        self._outputs = _output_order(
            self._interpreter.get_output_details(), converted.output_names
        )
        if len(self._outputs) != len(target.output_dtypes):
            raise RuntimeError(
                f"TFLite model has {len(self._outputs)} outputs, the model "
                f"{len(target.output_dtypes)}"
            )
        # An Interpreter runs one call at a time. A call takes an idle one from this list and
        # puts it back; a call that finds none idle (the others busy in other threads) opens
        # one more, which stays for later calls: tensor indices are the model's, the same in
        # each. A list's pop and append are atomic, so no lock is taken: one costs 0.15-0.3 us,
        # 1-2% of a small CNN's call. Each interpreter holds XNNPACK's own packed copy of the
        # weights, so memory grows with the number of calls ever run at once.
        self._idle = [first]
        if len(self._inputs) == 1 and len(self._outputs) == 1:
            self._input0, self._output0 = self._inputs[0], self._outputs[0]
            self.run = self._run_one  # a tiny model's call is ~10 us: skip the loops

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        idle = self._idle  # close() replaces it: the session goes back to this list
        try:
            session = idle.pop()
        except IndexError:  # every interpreter is busy in another thread
            session = _Session(self._open())
        try:
            shapes = [array.shape for array in inputs]
            if shapes != session.shapes:
                self._resize(session, shapes)
            interpreter = session.interpreter
            for index, array in zip(self._inputs, inputs):
                interpreter.set_tensor(index, array)
            interpreter.invoke()
            return [interpreter.get_tensor(index) for index in self._outputs]  # copies
        finally:
            idle.append(session)

    def _run_one(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """`run` for one input and one output."""
        array = inputs[0]
        idle = self._idle
        try:
            session = idle.pop()
        except IndexError:
            session = _Session(self._open())
        try:
            if array.shape != session.shape0:
                self._resize(session, [array.shape])
            interpreter = session.interpreter
            interpreter.set_tensor(self._input0, array)
            interpreter.invoke()
            return [interpreter.get_tensor(self._output0)]
        finally:
            idle.append(session)

    def _resize(self, session: _Session, shapes: list[tuple[int, ...]]) -> None:
        """A new batch size: resize the inputs once; later calls at this shape reuse it."""
        interpreter = session.interpreter
        for index, shape in zip(self._inputs, shapes):
            interpreter.resize_tensor_input(index, shape, strict=True)
        interpreter.allocate_tensors()
        session.shapes = list(shapes)
        session.shape0 = session.shapes[0]

    def close(self) -> None:
        self._interpreter = None
        self._idle = None  # a later call fails instead of opening a new interpreter
        self._open = None
        self._converted = None

    def save_artifact(self, directory: Path) -> dict:
        """model.tflite, the thread count and the output names that map its tensors."""
        (directory / "model.tflite").write_bytes(self._converted.content)
        return {
            "file": "model.tflite",
            "threads": self.threads,
            "output_names": list(self._converted.output_names),
        }

    @classmethod
    def load_artifact(cls, directory: Path, settings: dict, target: Target) -> Backend:
        content = (directory / settings["file"]).read_bytes()
        target.preload("tflite", Converted(content, tuple(settings["output_names"])))
        backend = cls(settings["threads"])
        backend.prepare(target)
        return backend


class _Session:
    """One Interpreter and the input shapes its tensors are allocated for (none yet: the
    first call resizes from the converted batch of 1)."""

    __slots__ = ("interpreter", "shape0", "shapes")

    def __init__(self, interpreter):
        interpreter.allocate_tensors()
        self.interpreter = interpreter
        self.shapes: list[tuple[int, ...]] = []
        self.shape0: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Converted:
    """A TFLite flatbuffer and the names of its outputs in the flat function's order."""

    content: bytes
    output_names: tuple[str, ...]


def _convert(target: Target) -> Converted:
    """The model as TFLite (float32, no quantization), shared by every LiteRT variant."""
    import tensorflow as tf

    function = tf.function(
        target.source.graph_function(target.signature),
        input_signature=tensor_specs(target.signature),
    )
    concrete = function.get_concrete_function()
    # The tf.function as trackable_obj selects the converter's concrete-function pipeline
    # (freeze the variables, convert the graph): tensors keep their graph names (in_0,
    # Identity_1), and there is no SavedModel round trip through a temporary directory.
    converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete], function)
    converter.optimizations = []  # no quantization: float32 weights and arithmetic
    # Builtin ops only: an op without a builtin kernel fails the conversion here, rather than
    # needing TensorFlow's kernels (SELECT_TF_OPS) inside the interpreter.
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    names = tuple(_tensor_name(tensor.name) for tensor in concrete.outputs)
    return Converted(converter.convert(), names)


def litert_variants() -> dict:
    """All usable cores, then 1, 2, 4, ... threads below that."""
    variants = {LiteRT.name: LiteRT}
    threads = 1
    while threads < usable_cores():
        variants[f"{LiteRT.name}:threads={threads}"] = partial(LiteRT, threads)
        threads *= 2
    return variants


def _input_order(details: list[dict], count: int) -> list[int]:
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


def _output_order(details: list[dict], names: tuple[str, ...]) -> list[int]:
    """Tensor indices of the outputs named `names` (the traced function's, in its order)."""
    by_name = {_tensor_name(detail["name"]): detail["index"] for detail in details}
    if sorted(by_name) != sorted(names) or len(details) != len(names):
        got = sorted(d["name"] for d in details)
        raise RuntimeError(f"TFLite outputs {got} are not the function's outputs {list(names)}")
    return [by_name[name] for name in names]


def _tensor_name(name: str) -> str:
    """A graph tensor's name without its output number: Identity_1:0 -> Identity_1."""
    return re.sub(r":0$", "", name)
