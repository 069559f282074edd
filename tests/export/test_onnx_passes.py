"""The exact passes over the ONNX export (onnx_passes.py): transposes through unit axes and
masks broadcast before a select rewritten, the same values bit for bit at every size; the
export of an attention model rewritten."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper
from test_export import exported_graph
from traffic_models import masked_encoder, request

from infertune.export.onnx_passes import (
    _static_shapes,
    _unit_axes,
    narrow_select_masks,
    speed_up,
    squeeze_unit_transposes,
)


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


def test_the_new_names_never_take_a_name_the_graph_has():
    model = two_transposes()
    first, second = model.graph.node
    first.output[0] = second.input[0] = "slow/squeezed"  # the name the rewrite would make
    expected = run(model, np.ones((1, 2, 1, 4, 8), np.float32))
    assert squeeze_unit_transposes(model) == 1
    onnx.checker.check_model(model, full_check=True)  # every name made once
    assert "slow_1/Transpose" in [node.name for node in model.graph.node]
    assert np.array_equal(run(model, np.ones((1, 2, 1, 4, 8), np.float32)), expected)


def test_a_graph_shape_inference_cannot_read_is_left_as_it_is():
    model = two_transposes()
    model.graph.node[0].input[0] = "missing"  # a graph that is not valid ONNX
    before = model.SerializeToString()
    assert squeeze_unit_transposes(model) == 0
    assert model.SerializeToString() == before


def masked_select(shape_of: str = "scores") -> onnx.ModelProto:
    """Keras' masked softmax's select as tf2onnx writes it: c = And(Expand(True,
    Shape(scores)), mask), then Cast(c) * scores + -1e9 * Cast(Not(c)). `shape_of`: the
    tensor whose shape the mask is broadcast to."""
    float_, bool_ = TensorProto.FLOAT, TensorProto.BOOL
    inputs = [
        helper.make_tensor_value_info("scores", float_, ["batch", "heads", "length", "length"]),
        helper.make_tensor_value_info("mask", bool_, ["batch", 1, 1, "length"]),
        helper.make_tensor_value_info("other", float_, ["batch", "heads", "length", "length"]),
    ]
    y = helper.make_tensor_value_info("y", float_, ["batch", "heads", "length", "length"])
    constants = [
        helper.make_tensor("true", bool_, [], [True]),
        helper.make_tensor("large_negative", float_, [], [-1e9]),
    ]
    nodes = [
        helper.make_node("Shape", [shape_of], ["shape"]),
        helper.make_node("Cast", ["shape"], ["shape_int"], to=TensorProto.INT32),
        helper.make_node("Cast", ["shape_int"], ["shape_long"], to=TensorProto.INT64),
        helper.make_node("Expand", ["true", "shape_long"], ["ones"]),
        helper.make_node("And", ["ones", "mask"], ["condition"]),
        helper.make_node("Cast", ["condition"], ["kept"], to=float_),
        helper.make_node("Mul", ["kept", "scores"], ["kept_scores"]),
        helper.make_node("Not", ["condition"], ["dropped"]),
        helper.make_node("Cast", ["dropped"], ["dropped_float"], to=float_),
        helper.make_node("Mul", ["large_negative", "dropped_float"], ["filled"]),
        helper.make_node("Add", ["kept_scores", "filled"], ["selected"]),
        helper.make_node("Add", ["selected", "other"], ["y"]),  # reads `other` either way
    ]
    graph = helper.make_graph(nodes, "select", inputs, [y], constants)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_mask_broadcast_before_a_select_stays_at_its_shape_with_the_same_values():
    original = masked_select()
    rewritten = masked_select()
    assert narrow_select_masks(rewritten) == 1
    onnx.checker.check_model(rewritten, full_check=True)
    ops = [node.op_type for node in rewritten.graph.node]
    assert "And" not in ops and "Expand" not in ops and "Shape" not in ops
    assert [t.name for t in rewritten.graph.initializer] == ["large_negative"]
    casts = [node for node in rewritten.graph.node if node.op_type in ("Cast", "Not")]
    assert {node.input[0] for node in casts} == {"mask", "dropped"}
    rng = np.random.default_rng(0)
    sessions = [
        onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        for m in (original, rewritten)
    ]
    for batch, heads, length in [(2, 3, 5), (1, 1, 1), (0, 2, 4), (2, 2, 0)]:
        feed = {
            "scores": rng.standard_normal((batch, heads, length, length)).astype(np.float32),
            "mask": rng.random((batch, 1, 1, length)) > 0.3,
            "other": rng.standard_normal((batch, heads, length, length)).astype(np.float32),
        }
        expected, got = (session.run(None, feed)[0] for session in sessions)
        assert got.shape == expected.shape == (batch, heads, length, length)
        assert np.array_equal(got, expected)
        wanted = np.where(np.broadcast_to(feed["mask"], got.shape), feed["scores"], -1e9)
        np.testing.assert_array_equal(got, wanted + feed["other"])


def test_a_mask_broadcast_to_another_tensor_s_shape_is_left_as_it_is():
    # Broadcast to `other`, the condition's shape need not be the select's: not rewritten.
    model = masked_select(shape_of="other")
    before = model.SerializeToString()
    assert narrow_select_masks(model) == 0
    assert model.SerializeToString() == before


@pytest.mark.slow
def test_the_attention_export_is_rewritten_and_matches_the_model():
    import tensorflow as tf

    model = masked_encoder()
    sample = request(16)
    graph = exported_graph(model, sample)
    transposed = [node for node in graph.node if node.name.endswith("/Transpose")]
    assert transposed  # the rewritten ones: MultiHeadAttention's keys and values
    light = onnx.helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    shapes = _static_shapes(light)
    assert [node.name for node in graph.node if _unit_axes(node, shapes)] == []
    assert speed_up(light) == {"transposes": 0, "masks": 0}  # both passes ran at the export
    model_bytes = light.SerializeToString()
    session = onnxruntime.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    names = [node.name for node in session.get_inputs()]
    for length, batch in [(16, 1), (5, 3), (40, 2)]:
        x = request(length, batch, seed=length)
        got = session.run(None, dict(zip(names, [x[name] for name in sorted(x)], strict=True)))
        expected = tf.nest.flatten(model(x))  # the export's outputs: the model's, flattened
        for out, ref in zip(got, expected, strict=True):
            np.testing.assert_allclose(out, np.asarray(ref), rtol=1e-4, atol=1e-5)
