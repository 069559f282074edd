"""Each runtime called the way a user writes it by hand, with the runtime's default settings.

Shared by the benchmarks: every function returns a zero-argument runner whose result is on
the host, so it can be timed next to infertune's callable in the same interleaved run.

A sample is one array or a dict of arrays (the model's inputs by name). The exported and
traced functions keep the batch free, and every other axis the Keras model declares free
(None: a sequence length, an image's height and width), as a user writing
`tf.TensorSpec((None, None), tf.int32)` for a text model does; LiteRT converts at the
sample's exact shape, as the LiteRT docs show.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tensorflow as tf
import tf2onnx

Runner = Callable[[], object]


def flat_inputs(sample) -> tuple[list[str], list[np.ndarray]]:
    """The sample as (names, arrays): a dict's keys in sorted order, or ["x"] for one array."""
    if isinstance(sample, dict):
        names = sorted(sample)
        return names, [np.asarray(sample[name]) for name in names]
    return ["x"], [np.asarray(sample)]


def input_specs(model, sample, *, exact: bool = False) -> list[tf.TensorSpec]:
    """One TensorSpec per flat input, named after it (the ONNX and TFLite input names too):
    the sample's exact shapes when `exact`, else the batch and every axis the model
    declares free left as None."""
    names, arrays = flat_inputs(sample)
    declared = _declared_shapes(model, names)
    specs = []
    for name, array in zip(names, arrays):
        shape = list(array.shape)
        if not exact:
            shape[0] = None
            free = declared.get(name)
            if free is not None and len(free) == array.ndim:
                shape = [None if want is None else got for want, got in zip(free, shape)]
        specs.append(tf.TensorSpec(shape, tf.as_dtype(array.dtype), name=name))
    return specs


def _declared_shapes(model, names: list[str]) -> dict[str, tuple]:
    """The input shapes a Keras model declares, by input name (by position for one input)."""
    inputs = list(getattr(model, "inputs", None) or [])
    if len(names) == 1 and len(inputs) == 1:
        return {names[0]: tuple(inputs[0].shape)}
    return {tensor.name: tuple(tensor.shape) for tensor in inputs}


def _flat_function(model, sample) -> Callable:
    """The model as a function of the flat inputs, called with the sample's structure."""
    if isinstance(sample, dict):
        names, _ = flat_inputs(sample)
        return lambda *flat: model(dict(zip(names, flat)))
    return lambda x: model(x)


def _on_host(result) -> object:
    """A function's outputs as numpy: one array, or a flat list for several outputs."""
    if isinstance(result, tf.Tensor):
        return result.numpy()
    return [tensor.numpy() for tensor in tf.nest.flatten(result)]


def keras_call(model, sample) -> Runner:
    return lambda: model(sample).numpy()


def keras_predict(model, sample) -> Runner:
    return lambda: model.predict(sample, verbose=0)


def tf_function(model, sample, jit_compile: bool = False) -> Runner:
    specs = input_specs(model, sample)
    signature = dict(zip(flat_inputs(sample)[0], specs)) if isinstance(sample, dict) else specs[0]
    fn = tf.function(model, input_signature=[signature], jit_compile=jit_compile)
    if isinstance(fn(sample), tf.Tensor):  # traces (and for XLA compiles) at the first call
        return lambda: fn(sample).numpy()
    return lambda: _on_host(fn(sample))


def onnx_bytes(model, sample) -> bytes:
    specs = input_specs(model, sample)
    proto, _ = tf2onnx.convert.from_function(
        tf.function(_flat_function(model, sample), input_signature=specs), input_signature=specs
    )
    return proto.SerializeToString()


def _feed(names_wanted: list[str], sample) -> dict[str, np.ndarray]:
    """The sample's arrays by the runtime's input names, which must be the sample's names."""
    names, arrays = flat_inputs(sample)
    if sorted(names_wanted) != names:
        raise ValueError(f"The runtime's inputs are {names_wanted}; the sample has {names}.")
    return dict(zip(names, arrays))


def onnxruntime_session(model_bytes: bytes, sample, options=None) -> Runner:
    import onnxruntime

    session = onnxruntime.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
    if not isinstance(sample, dict):
        name = session.get_inputs()[0].name
        return lambda: session.run(None, {name: sample})
    feed = _feed([node.name for node in session.get_inputs()], sample)
    return lambda: session.run(None, feed)


def openvino_compiled(model_bytes: bytes, sample, precision_hint: str | None = None) -> Runner:
    """OpenVINO from the ONNX export. With its defaults (no `precision_hint`) that means
    bf16 inference on CPUs with bf16 support; precision_hint="f32" asks for float32."""
    import openvino

    core = openvino.Core()
    config = {} if precision_hint is None else {"INFERENCE_PRECISION_HINT": precision_hint}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        path.write_bytes(model_bytes)
        compiled = core.compile_model(core.read_model(path), "CPU", config)
    inputs = sample
    if isinstance(sample, dict):
        inputs = _feed([node.get_any_name() for node in compiled.inputs], sample)
    if len(compiled.outputs) == 1:
        output = compiled.output(0)
        return lambda: compiled(inputs)[output]
    ports = compiled.outputs

    def run_all():
        result = compiled(inputs)
        return [result[port] for port in ports]

    return run_all


def tflite_bytes(model, sample) -> bytes:
    """The model converted to TFLite at the sample's shape, the way the LiteRT docs show."""
    fn = tf.function(_flat_function(model, sample))
    concrete = fn.get_concrete_function(*input_specs(model, sample, exact=True))
    return tf.lite.TFLiteConverter.from_concrete_functions([concrete], fn).convert()


def litert_interpreter(model, sample, content: bytes | None = None) -> Runner:
    """TFLite conversion at the sample's shape (`content`, where it is made already) and
    ai-edge-litert's interpreter (XNNPACK), with its default thread count (one)."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=content or tflite_bytes(model, sample))
    interpreter.allocate_tensors()
    output_indices = [detail["index"] for detail in interpreter.get_output_details()]
    if not isinstance(sample, dict):
        input_index = interpreter.get_input_details()[0]["index"]
        output_index = output_indices[0]

        def run():
            interpreter.set_tensor(input_index, sample)
            interpreter.invoke()
            return interpreter.get_tensor(output_index)

        return run
    details = interpreter.get_input_details()
    feed = _feed([detail["name"] for detail in details], sample)
    indexed = [(detail["index"], feed[detail["name"]]) for detail in details]

    def run_named():
        for index, array in indexed:
            interpreter.set_tensor(index, array)
        interpreter.invoke()
        outputs = [interpreter.get_tensor(index) for index in output_indices]
        return outputs[0] if len(outputs) == 1 else outputs

    return run_named


def float32_builders(model, sample) -> tuple[dict[str, Callable[[], Runner]], Callable[[], bytes]]:
    """The float32 runtimes by hand, each a builder (label -> () -> runner), and the ONNX
    export they share, made on first use (a builder of another runtime may start from it)."""
    exported: dict[str, bytes] = {}

    def onnx() -> bytes:  # one export by hand, shared by everything ONNX
        if "onnx" not in exported:
            exported["onnx"] = onnx_bytes(model, sample)
        return exported["onnx"]

    builders = {
        "tf.function": lambda: tf_function(model, sample),
        "tf.function+XLA": lambda: tf_function(model, sample, jit_compile=True),
        "onnxruntime": lambda: onnxruntime_session(onnx(), sample),
        "openvino-f32": lambda: openvino_compiled(onnx(), sample, precision_hint="f32"),
        "litert": lambda: litert_interpreter(model, sample),
    }
    return builders, onnx
