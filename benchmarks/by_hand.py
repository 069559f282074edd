"""Each runtime called the way a user writes it by hand, with the runtime's default settings.

Shared by the benchmarks: every function returns a zero-argument runner whose result is on
the host, so it can be timed next to infertune's callable in the same interleaved run.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tensorflow as tf
import tf2onnx

Runner = Callable[[], object]


def _spec(sample: np.ndarray) -> list[tf.TensorSpec]:
    return [tf.TensorSpec((None, *sample.shape[1:]), tf.as_dtype(sample.dtype))]


def keras_call(model, sample) -> Runner:
    return lambda: model(sample).numpy()


def keras_predict(model, sample) -> Runner:
    return lambda: model.predict(sample, verbose=0)


def tf_function(model, sample, jit_compile: bool = False) -> Runner:
    fn = tf.function(model, input_signature=_spec(sample), jit_compile=jit_compile)
    return lambda: fn(sample).numpy()


def onnx_bytes(model, sample) -> bytes:
    spec = _spec(sample)
    proto, _ = tf2onnx.convert.from_function(
        tf.function(lambda x: model(x), input_signature=spec), input_signature=spec
    )
    return proto.SerializeToString()


def onnxruntime_session(model_bytes: bytes, sample, options=None) -> Runner:
    import onnxruntime

    session = onnxruntime.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda: session.run(None, {name: sample})


def openvino_compiled(model_bytes: bytes, sample) -> Runner:
    """OpenVINO with its defaults: on CPUs with bf16 support that means bf16 inference."""
    import openvino

    core = openvino.Core()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        path.write_bytes(model_bytes)
        compiled = core.compile_model(core.read_model(path), "CPU")
    output = compiled.output(0)
    return lambda: compiled(sample)[output]


def tflite_bytes(model, sample) -> bytes:
    """The model converted to TFLite at the sample's shape, the way the LiteRT docs show."""
    fn = tf.function(lambda x: model(x))
    concrete = fn.get_concrete_function(tf.TensorSpec(sample.shape, tf.as_dtype(sample.dtype)))
    return tf.lite.TFLiteConverter.from_concrete_functions([concrete], fn).convert()


def litert_interpreter(model, sample, content: bytes | None = None) -> Runner:
    """TFLite conversion at the sample's shape (`content`, where it is made already) and
    ai-edge-litert's interpreter (XNNPACK), with its default thread count (one)."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=content or tflite_bytes(model, sample))
    interpreter.allocate_tensors()
    input_index = interpreter.get_input_details()[0]["index"]
    output_index = interpreter.get_output_details()[0]["index"]

    def run():
        interpreter.set_tensor(input_index, sample)
        interpreter.invoke()
        return interpreter.get_tensor(output_index)

    return run
