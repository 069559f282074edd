"""LiteRT (TensorFlow Lite) with XNNPACK: a lean interpreter with a low per-call floor.

The model is converted with TensorFlow's TFLite converter from the same flat tf.function
the other TensorFlow candidates use (float32, no quantization), and run by ai-edge-litert's
interpreter, whose default CPU delegate for float models is XNNPACK. The batch dimension is
-1 in the converted model: a new batch size resizes the input tensors once, and calls at an
unchanged shape do no resizing.
"""

from __future__ import annotations

import importlib.util
import re
import threading

import numpy as np

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

    def __init__(self, threads: int | None = None):
        self.threads = threads
        self.name = type(self).name + (f":threads={threads}" if threads else "")

    def available(self) -> str | None:
        if importlib.util.find_spec("ai_edge_litert") is None:
            return f"ai-edge-litert is not installed; {_INSTALL}"
        return None

    def prepare(self, target: Target) -> None:
        from ai_edge_litert.interpreter import Interpreter

        from .onnxruntime import usable_cores

        self.model_bytes = target.shared("tflite", lambda: _convert(target))
        threads = self.threads or usable_cores()
        self._interpreter = Interpreter(model_content=self.model_bytes, num_threads=threads)
        self._interpreter.allocate_tensors()
        inputs = {d["name"]: d["index"] for d in self._interpreter.get_input_details()}
        names = [f"in_{i}" for i in range(len(target.signature.specs))]
        if sorted(inputs) != sorted(names):
            raise RuntimeError(f"TFLite inputs {sorted(inputs)} do not match {names}")
        self._inputs = [inputs[name] for name in names]
        self._outputs = _output_order(self._interpreter.get_output_details())
        if len(self._outputs) != len(target.output_dtypes):
            raise RuntimeError(
                f"TFLite model has {len(self._outputs)} outputs, the model "
                f"{len(target.output_dtypes)}"
            )
        self._shapes: list[tuple[int, ...]] = []
        self._shape0: tuple[int, ...] | None = None
        self._lock = threading.Lock()  # an Interpreter runs one call at a time
        if len(self._inputs) == 1 and len(self._outputs) == 1:
            self.run = self._run_one  # a tiny model's call is ~10 us: skip the loops

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        interpreter = self._interpreter
        with self._lock:
            shapes = [array.shape for array in inputs]
            if shapes != self._shapes:
                self._resize(shapes)
            for index, array in zip(self._inputs, inputs):
                interpreter.set_tensor(index, array)
            interpreter.invoke()
            return [interpreter.get_tensor(index) for index in self._outputs]  # copies

    def _run_one(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """`run` for one input and one output."""
        array = inputs[0]
        interpreter = self._interpreter
        with self._lock:
            if array.shape != self._shape0:
                self._resize([array.shape])
            interpreter.set_tensor(self._inputs[0], array)
            interpreter.invoke()
            return [interpreter.get_tensor(self._outputs[0])]

    def _resize(self, shapes: list[tuple[int, ...]]) -> None:
        """A new batch size: resize the inputs once; later calls at this shape reuse it."""
        for index, shape in zip(self._inputs, shapes):
            self._interpreter.resize_tensor_input(index, shape, strict=True)
        self._interpreter.allocate_tensors()
        self._shapes = list(shapes)
        self._shape0 = self._shapes[0]

    def close(self) -> None:
        self._interpreter = None


def _convert(target: Target) -> bytes:
    """The model as TFLite (float32, no quantization), shared by every LiteRT variant."""
    import tensorflow as tf

    function = tf.function(
        target.source.graph_function(target.signature),
        input_signature=tensor_specs(target.signature),
    )
    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [function.get_concrete_function()], function
    )
    return converter.convert()


def litert_variants() -> dict:
    """All usable cores, then 1, 2, 4, ... threads below that."""
    from functools import partial

    from .onnxruntime import usable_cores

    variants = {LiteRT.name: LiteRT}
    threads = 1
    while threads < usable_cores():
        variants[f"{LiteRT.name}:threads={threads}"] = partial(LiteRT, threads)
        threads *= 2
    return variants


def _output_order(details: list[dict]) -> list[int]:
    """Tensor indices in the flat function's output order: Identity, Identity_1, ..."""
    numbered = []
    for detail in details:
        match = re.fullmatch(r"(?:.*/)?Identity(?:_(\d+))?(?::\d+)?", detail["name"])
        if match is None:
            raise RuntimeError(f"unexpected TFLite output name {detail['name']!r}")
        numbered.append((int(match.group(1) or 0), detail["index"]))
    return [index for _, index in sorted(numbered)]
