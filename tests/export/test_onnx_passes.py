"""The exact passes over the ONNX export (onnx_passes.py): transposes through unit axes and
masks broadcast before a select rewritten, the same values bit for bit at every size, and
nothing rewritten where that would not hold; the export of an attention model rewritten."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper
from test_export import exported_graph
from traffic_models import masked_encoder, request

from infertune.export import onnx as onnx_export
from infertune.export.onnx_passes import (
    _static_shapes,
    _unit_axes,
    narrow_select_masks,
    speed_up,
    squeeze_unit_transposes,
    squeezed_permutation,
)


def transposes(opset: int = 17) -> onnx.ModelProto:
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
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def run(model: onnx.ModelProto, feed: dict) -> np.ndarray:
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, feed)[0]


def test_the_squeezed_permutation_moves_every_value_where_the_transpose_does():
    for rank in range(1, 6):
        for perm in itertools.permutations(range(rank)):
            for count in range(1, rank + 1):
                for unit in itertools.combinations(range(rank), count):
                    shape = [1 if axis in unit else axis + 2 for axis in range(rank)]
                    x = np.arange(np.prod(shape)).reshape(shape)
                    reduced, unit_out = squeezed_permutation(list(perm), list(unit))
                    got = np.expand_dims(np.squeeze(x, unit).transpose(reduced), unit_out)
                    assert np.array_equal(got, x.transpose(perm)), (perm, unit)


def test_a_transpose_through_a_unit_axis_gives_the_same_values_at_every_size():
    original = transposes()
    rewritten = transposes()
    assert squeeze_unit_transposes(rewritten) == 1
    onnx.checker.check_model(rewritten, full_check=True)
    ops = [(node.op_type, node.name) for node in rewritten.graph.node]
    # the names keep the node's scope (static int8 keeps a layer in float32 by it)
    assert ops == [("Squeeze", "slow_squeeze"), ("Transpose", "slow"),
                   ("Unsqueeze", "slow_unsqueeze"), ("Transpose", "one_axis")]  # fmt: skip
    rng = np.random.default_rng(0)
    for batch, length in [(2, 5), (1, 1), (0, 3), (3, 0)]:
        x = rng.standard_normal((batch, length, 1, 4, 8)).astype(np.float32)
        expected = run(original, {"x": x})
        got = run(rewritten, {"x": x})
        assert got.shape == expected.shape == (batch, 4, 1, length, 8)
        assert np.array_equal(got, expected)
        assert np.array_equal(got, x.transpose(0, 3, 2, 4, 1).transpose(0, 1, 2, 4, 3))


def test_a_transpose_without_perm_over_two_unit_axes_gives_the_same_values():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1, 3, 1, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 1, 3, 1, "batch"])
    node = helper.make_node("Transpose", ["x"], ["y"], name="reversed")  # perm: reversed
    graph = helper.make_graph([node], "reversed", [x], [y])
    original = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(original)
    assert squeeze_unit_transposes(rewritten) == 1
    for batch in (2, 0):
        x = np.random.default_rng(batch).standard_normal((batch, 1, 3, 1, 5)).astype("float32")
        assert np.array_equal(run(rewritten, {"x": x}), run(original, {"x": x}))
        assert np.array_equal(run(rewritten, {"x": x}), x.transpose())


def test_the_new_names_never_take_a_name_the_graph_has():
    model = transposes()
    first, second = model.graph.node
    first.output[0] = second.input[0] = "slow_squeezed"  # the name the rewrite would make
    x = np.ones((1, 2, 1, 4, 8), np.float32)
    expected = run(model, {"x": x})
    assert squeeze_unit_transposes(model) == 1
    onnx.checker.check_model(model, full_check=True)  # every name made once
    assert "slow_1_squeeze" in [node.name for node in model.graph.node]
    assert np.array_equal(run(model, {"x": x}), expected)


def test_a_graph_shape_inference_fails_on_or_an_opset_before_13_is_left_as_it_is(monkeypatch):
    old = transposes(opset=12)
    before = old.SerializeToString()
    assert squeeze_unit_transposes(old) == 0  # Squeeze's axes an attribute there
    assert old.SerializeToString() == before

    def fails(*args, **kwargs):
        raise onnx.shape_inference.InferenceError("inference fails")

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", fails)
    model = transposes()
    before = model.SerializeToString()
    assert speed_up(model) == {"transposes": 0, "masks": 0}
    assert model.SerializeToString() == before


def masked_select(
    shape_of: str = "scores",
    swapped: bool = False,
    true_node: bool = False,
    true_shape: tuple = (),
    true_fed: bool = False,
    extra_reader: str | None = None,
    extra_output: str | None = None,
) -> onnx.ModelProto:
    """Keras' masked softmax's select as tf2onnx writes it: c = And(Expand(True,
    Shape(scores)), mask), then Cast(c) * scores + -1e9 * Cast(Not(c)), plus `other`.
    `shape_of`: the tensor the mask is broadcast to; `swapped`: the Add's and the And's
    operands the other way round; `true_node`: True from a Constant node; `true_shape`: its
    shape; `true_fed`: True also a graph input (a default a caller may feed);
    `extra_reader`: a tensor an Identity also reads, into a second output; `extra_output`: a
    tensor that is also a graph output."""
    float_, bool_ = TensorProto.FLOAT, TensorProto.BOOL
    square = ["batch", "heads", "length", "length"]
    inputs = [
        helper.make_tensor_value_info("scores", float_, square),
        helper.make_tensor_value_info("mask", bool_, ["batch", 1, 1, "length"]),
        helper.make_tensor_value_info("other", float_, square),
    ]
    outputs = [helper.make_tensor_value_info("y", float_, square)]
    true = helper.make_tensor("true", bool_, list(true_shape), [True])
    constants = [helper.make_tensor("large_negative", float_, [], [-1e9])]
    nodes = []
    if true_node:
        nodes.append(helper.make_node("Constant", [], ["true"], value=true))
    else:
        constants.append(true)
    if true_fed:
        inputs.append(helper.make_tensor_value_info("true", bool_, list(true_shape)))
    pair = ["ones", "mask"][:: -1 if swapped else 1]
    products = ["kept_scores", "filled"][:: -1 if swapped else 1]
    nodes += [
        helper.make_node("Shape", [shape_of], ["shape"]),
        helper.make_node("Cast", ["shape"], ["shape_int"], to=TensorProto.INT32),
        helper.make_node("Cast", ["shape_int"], ["shape_long"], to=TensorProto.INT64),
        helper.make_node("Expand", ["true", "shape_long"], ["ones"]),
        helper.make_node("And", pair, ["condition"]),
        helper.make_node("Cast", ["condition"], ["kept"], to=float_),
        helper.make_node("Mul", ["kept", "scores"], ["kept_scores"]),
        helper.make_node("Not", ["condition"], ["dropped"]),
        helper.make_node("Cast", ["dropped"], ["dropped_float"], to=float_),
        helper.make_node("Mul", ["large_negative", "dropped_float"], ["filled"]),
        helper.make_node("Add", products, ["selected"]),
        helper.make_node("Add", ["selected", "other"], ["y"]),  # reads `other` either way
    ]
    types = {"true": (bool_, list(true_shape)), "kept": (float_, square),
             "dropped": (bool_, square), "kept_scores": (float_, square)}  # fmt: skip
    if extra_reader is not None:
        nodes.append(helper.make_node("Identity", [extra_reader], ["also"]))
        outputs.append(helper.make_tensor_value_info("also", *types[extra_reader]))
    if extra_output is not None:
        outputs.append(helper.make_tensor_value_info(extra_output, *types[extra_output]))
    graph = helper.make_graph(nodes, "select", inputs, outputs, constants)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def select_feeds(rng) -> list[dict]:
    feeds = []
    for batch, heads, length in [(2, 3, 5), (1, 1, 1), (0, 2, 4), (2, 2, 0)]:
        square = (batch, heads, length, length)
        feeds.append({
            "scores": rng.standard_normal(square).astype(np.float32),
            "mask": rng.random((batch, 1, 1, length)) > 0.3,
            "other": rng.standard_normal(square).astype(np.float32),
        })  # fmt: skip
    return feeds


@pytest.mark.parametrize(
    "variant",
    [{}, {"swapped": True}, {"true_node": True}, {"extra_reader": "true"}],
    ids=["tf2onnx", "operands-swapped", "true-from-a-constant-node", "true-read-elsewhere"],
)
def test_a_mask_broadcast_before_a_select_stays_at_its_shape_with_the_same_values(variant):
    original = masked_select(**variant)
    rewritten = masked_select(**variant)
    assert narrow_select_masks(rewritten) == 1
    onnx.checker.check_model(rewritten, full_check=True)
    ops = [node.op_type for node in rewritten.graph.node]
    assert "And" not in ops and "Expand" not in ops and "Shape" not in ops
    kept_true = "extra_reader" in variant  # still read: kept
    assert ("true" in [t.name for t in rewritten.graph.initializer]) == kept_true
    casts = [node for node in rewritten.graph.node if node.op_type in ("Cast", "Not")]
    assert {node.input[0] for node in casts} == {"mask", "dropped"}
    sessions = [
        onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        for m in (original, rewritten)
    ]
    for feed in select_feeds(np.random.default_rng(0)):
        expected, got = (session.run(None, feed)[0] for session in sessions)
        assert got.shape == expected.shape == feed["scores"].shape
        assert np.array_equal(got, expected)
        wanted = np.where(np.broadcast_to(feed["mask"], got.shape), feed["scores"], -1e9)
        np.testing.assert_array_equal(got, wanted + feed["other"])


@pytest.mark.parametrize(
    "variant",
    [
        {"shape_of": "other"},  # the condition's shape need not be the select's
        {"true_shape": (1, 1, 1, 1, 1)},  # a True of rank 5 makes the condition larger
        {"true_fed": True},  # a caller may feed False
        {"extra_reader": "kept"},  # the Cast read elsewhere, at the full shape
        {"extra_reader": "dropped"},  # the Not read elsewhere
        {"extra_output": "kept_scores"},  # a product the caller reads
    ],
    ids=["broadcast-to-another-tensor", "true-not-a-scalar", "true-a-graph-input",
         "cast-read-elsewhere", "not-read-elsewhere", "product-an-output"],
)  # fmt: skip
def test_a_select_whose_shapes_could_change_is_left_as_it_is(variant):
    model = masked_select(**variant)
    before = model.SerializeToString()
    assert narrow_select_masks(model) == 0
    assert model.SerializeToString() == before


@pytest.mark.slow
def test_the_attention_export_is_rewritten_with_the_same_values(monkeypatch):
    import tensorflow as tf

    model = masked_encoder()
    sample = request(16)
    graph = exported_graph(model, sample)
    monkeypatch.setattr(onnx_export, "speed_up", lambda model_proto: {})
    plain = exported_graph(model, sample)  # the export without the passes
    opsets = [helper.make_opsetid("", onnx_export.OPSET)]
    rewritten = helper.make_model(graph, opset_imports=opsets)
    shapes = _static_shapes(rewritten)
    assert [node.name for node in graph.node if _unit_axes(node, shapes)] == []
    assert speed_up(rewritten) == {"transposes": 0, "masks": 0}  # nothing left to rewrite
    before = helper.make_model(plain, opset_imports=opsets)
    assert speed_up(helper.make_model(plain, opset_imports=opsets)) == {
        "transposes": 2, "masks": 2  # MultiHeadAttention's keys and values, its softmax
    }  # fmt: skip
    sessions = [
        onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        for m in (before, rewritten)
    ]
    names = [node.name for node in sessions[0].get_inputs()]
    for length, batch in [(16, 1), (5, 3), (40, 2)]:
        x = request(length, batch, seed=length)
        feed = dict(zip(names, [x[name] for name in sorted(x)], strict=True))
        expected, got = (session.run(None, feed) for session in sessions)
        for out, ref in zip(got, expected, strict=True):
            assert np.array_equal(out, ref)
        model_outputs = tf.nest.flatten(model(x))  # the export's outputs: the model's, flattened
        for out, ref in zip(got, model_outputs, strict=True):
            np.testing.assert_allclose(out, np.asarray(ref), rtol=1e-4, atol=1e-5)
