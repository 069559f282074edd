"""Transposes over unit axes rewritten as transposes of the other axes (onnx_transposes.py):
the same values bit for bit at every size, the export of an attention model rewritten."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper
from test_export import exported_graph
from traffic_models import masked_encoder, request

from infertune.export.onnx_transposes import _static_shapes, _unit_axes, squeeze_unit_transposes


def two_transposes() -> onnx.ModelProto:
    """x (batch, length, 1, 4, 8): the permutation tf2onnx's attention export takes through a
    unit axis ((1, 288, 1, 4, 64) to (1, 4, 1, 64, 288) is ONNX Runtime's slow case), then a
    permutation that moves one axis (ONNX Runtime's fast path: left as it is)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "length", 1, 4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, 1, "length", 8])
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], name="slow", perm=[0, 3, 2, 4, 1]),
        helper.make_node("Transpose", ["t"], ["y"], name="one_axis", perm=[0, 1, 2, 4, 3]),
    ]
    graph = helper.make_graph(nodes, "transposes", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, {"x": x})[0]


def test_a_transpose_through_a_unit_axis_gives_the_same_values_at_every_size():
    original = two_transposes()
    rewritten = two_transposes()
    assert squeeze_unit_transposes(rewritten) == 1
    onnx.checker.check_model(rewritten, full_check=True)
    ops = [(node.op_type, node.name) for node in rewritten.graph.node]
    assert ("Transpose", "one_axis") in ops  # ONNX Runtime's fast path: not touched
    assert [op for op, _ in ops] == ["Squeeze", "Transpose", "Unsqueeze", "Transpose"]
    rng = np.random.default_rng(0)
    for batch, length in [(2, 5), (1, 1), (0, 3), (3, 0)]:
        x = rng.standard_normal((batch, length, 1, 4, 8)).astype(np.float32)
        expected = run(original, x)
        got = run(rewritten, x)
        assert got.shape == expected.shape == (batch, 4, 1, length, 8)
        assert np.array_equal(got, expected)
        assert np.array_equal(got, x.transpose(0, 3, 2, 4, 1).transpose(0, 1, 2, 4, 3))


def test_a_graph_shape_inference_cannot_read_is_left_as_it_is():
    model = two_transposes()
    model.graph.node[0].input[0] = "missing"  # a graph that is not valid ONNX
    before = model.SerializeToString()
    assert squeeze_unit_transposes(model) == 0
    assert model.SerializeToString() == before


@pytest.mark.slow
def test_the_attention_export_has_no_transpose_through_a_unit_axis_left():
    import tensorflow as tf

    model = masked_encoder()
    sample = request(16)
    graph = exported_graph(model, sample)
    transposed = [node for node in graph.node if node.name.endswith("/Transpose")]
    assert transposed  # the rewritten ones: MultiHeadAttention's keys and values
    light = onnx.helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    shapes = _static_shapes(light)
    assert [node.name for node in graph.node if _unit_axes(node, shapes)] == []
    model_bytes = light.SerializeToString()
    session = onnxruntime.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    names = [node.name for node in session.get_inputs()]
    for length, batch in [(16, 1), (5, 3), (40, 2)]:
        x = request(length, batch, seed=length)
        got = session.run(None, dict(zip(names, [x[name] for name in sorted(x)], strict=True)))
        expected = tf.nest.flatten(model(x))  # the export's outputs: the model's, flattened
        for out, ref in zip(got, expected, strict=True):
            np.testing.assert_allclose(out, np.asarray(ref), rtol=1e-4, atol=1e-5)
