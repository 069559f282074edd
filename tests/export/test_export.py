"""The ONNX export: layers that hold constants, and the reason given when an op cannot convert."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import target_for

import infertune
from infertune.export import onnx as onnx_export
from infertune.export.registry import export_onnx


def exported_graph(model, sample) -> onnx.GraphProto:
    """The ONNX graph that every ONNX-based candidate of optimize(model, sample) runs."""
    return onnx.load_from_string(export_onnx(target_for(model, sample)).model_bytes).graph


def images(rng, batch: int = 4) -> np.ndarray:
    """Pixels in 0-255, far from zero mean and unit variance, so that normalizing matters."""
    return (rng.random((batch, 8, 8, 3)) * 255).astype("float32")


def convnext_like_model(sample):
    """The layers that lost every ONNX candidate of EfficientNet and ConvNeXt, small:

    - a Normalization adapted on data and one given its mean and variance: Keras 3 keeps both
      as plain tensors, which the traced function captures as placeholders (tf2onnx's
      from_function made them graph inputs);
    - a depthwise convolution written as Conv2D(groups=channels), as ConvNeXt does: Keras 3
      runs grouped convolutions through a nested tf.function compiled by XLA;
    - a per-channel scale held in a variable and multiplied in, as ConvNeXt's LayerScale.
    """
    import keras

    class LayerScale(keras.layers.Layer):
        def build(self, input_shape):
            self.gamma = self.add_weight(shape=(input_shape[-1],), initializer="ones")
            self.gamma.assign(np.linspace(0.5, 2.0, input_shape[-1]).astype("float32"))

        def call(self, x):
            return x * self.gamma

    keras.utils.set_random_seed(0)
    adapted = keras.layers.Normalization(name="adapted")
    adapted.adapt(sample)
    inputs = keras.Input(sample.shape[1:])
    hidden = keras.layers.Conv2D(4, 1)(adapted(inputs))
    hidden = keras.layers.Conv2D(4, 3, groups=4, padding="same", name="depthwise")(hidden)
    hidden = LayerScale(name="scale")(hidden)
    hidden = keras.layers.Normalization(mean=0.5, variance=4.0, name="given")(hidden)
    outputs = keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(hidden))
    return keras.Model(inputs, outputs)


@pytest.mark.slow
def test_layers_holding_constants_export_and_onnxruntime_verifies(rng):
    sample = images(rng)
    model = convnext_like_model(sample)

    graph = exported_graph(model, sample)
    assert [node.name for node in graph.input] == ["in_0"]  # the model's only input

    opt = infertune.optimize(model, sample, backends=["onnxruntime-cpu"], verbose=False)
    result = opt.report.candidate("onnxruntime-cpu")
    assert result.status in ("ok", "selected"), str(opt.report)


def test_an_op_tf2onnx_cannot_convert_is_named_in_the_reason(rng):
    import keras
    import tensorflow as tf

    class LogGamma(keras.layers.Layer):
        def call(self, x):
            return tf.math.lgamma(x)  # TensorFlow's Lgamma: tf2onnx 1.17 has no handler

    inputs = keras.Input((6,))
    positive = keras.layers.Dense(5, activation="softplus")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(3)(LogGamma(name="log_gamma")(positive)))
    sample = rng.random((4, 6)).astype("float32")
    opt = infertune.optimize(model, sample, backends=["onnxruntime-cpu"], verbose=False)
    result = opt.report.candidate("onnxruntime-cpu")
    assert result.status == "failed"
    assert "tf2onnx cannot convert the TensorFlow op Lgamma" in result.reason
    assert "/log_gamma" in result.reason  # the node's scope names the layer
    assert "\n" not in result.reason


def test_the_error_of_a_failing_tf2onnx_handler_is_in_the_reason(rng):
    import tensorflow as tf

    class SpectrumAngle(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec((None, 64))])
        def __call__(self, x):
            # tf2onnx's RFFT handler takes only ComplexAbs as its consumer; rewrites.py lowers
            # the complex ops it knows to real ones, not the phase (docs/candidates.md).
            return tf.math.angle(tf.signal.rfft(x))

    sample = rng.random((3, 64)).astype("float32")
    with pytest.raises(RuntimeError, match=r"ops RFFT \(at .+: .*only allows ComplexAbs"):
        exported_graph(SpectrumAngle(), sample)


def gru_model():
    """A GRU over a free length: tf2onnx converts its while loop to an ONNX Loop, whose body
    is a graph held in a node attribute."""
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((None, 5))
    return keras.Model(inputs, keras.layers.Dense(2)(keras.layers.GRU(6)(inputs)))


def _graph_contents(model_bytes: bytes) -> tuple:
    """What two conversions of one model must share. Not the node names: tf2onnx numbers the
    nodes it adds from a process-wide counter and dedups constants in set order, so even two
    conversions by tf2onnx itself name them differently."""
    import collections
    import hashlib

    graph = onnx.load_from_string(model_bytes).graph

    def initializers(graph):
        return collections.Counter(
            (hashlib.sha256(t.raw_data).hexdigest(), tuple(t.dims)) for t in graph.initializer
        )

    bodies = [
        (node.op_type, [n.op_type for n in attr.g.node], initializers(attr.g))
        for node in graph.node
        for attr in node.attribute
        if attr.type == onnx.AttributeProto.GRAPH
    ]
    return [node.op_type for node in graph.node], initializers(graph), bodies


@pytest.mark.parametrize(
    "make_model, sample",
    [
        (convnext_like_model, images(np.random.default_rng(0))),
        (lambda _: gru_model(), np.random.default_rng(0).random((2, 7, 5), "float32")),
    ],
    ids=["constants-and-grouped-conv", "gru-loop"],
)
def test_the_optimizer_passes_without_proto_updates_give_tf2onnx_s_graph(
    make_model, sample, monkeypatch
):
    import onnxruntime as ort
    from tf2onnx.graph import Graph

    target = target_for(make_model(sample), sample)
    updates = []
    update_proto = Graph.update_proto
    monkeypatch.setattr(
        Graph,
        "update_proto",
        lambda graph, *a, **k: updates.append(1) or update_proto(graph, *a, **k),
    )
    ours = onnx_export.convert_to_onnx(target).model_bytes  # not export_onnx: it keeps the first
    ours_updates = len(updates)
    # tf2onnx's own passes, each ending in its update of every node's protobuf
    monkeypatch.setattr(onnx_export, "_without_proto_updates", lambda make_pass: make_pass)
    theirs = onnx_export.convert_to_onnx(target).model_bytes
    # Ours updates the protobufs when the graph is made, tf2onnx after each of its passes too
    # (if its private pass API moved, ours would fall back to that and this would fail).
    assert ours_updates * 5 < len(updates) - ours_updates

    assert _graph_contents(ours) == _graph_contents(theirs)
    feeds = {"in_0": sample}
    sessions = [ort.InferenceSession(m, providers=["CPUExecutionProvider"]) for m in (ours, theirs)]
    for a, b in zip(*(session.run(None, feeds) for session in sessions), strict=True):
        np.testing.assert_array_equal(a, b)  # the same graph: the same float operations
