"""Loading models with symbolic sizes: sizes named apart, sizes that must be fixed."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import knopt
from knopt.errors import InputError, SymbolicSizeError
from knopt.ir.shape import format_shape
from knopt.onnx.context import KnownValueRequired
from tests.oracle import run_onnxruntime


def _mask_added_to_scores() -> onnx.ModelProto:
    # TorchScript's list-form dynamic_axes ({"ids": [0, 1], "mask": [0, 1]}) and dynamo's
    # Dim.AUTO give each input its own size names, though the model adds the two inputs.
    ids = helper.make_tensor_value_info("ids", TensorProto.FLOAT, ["ids_dim0", "ids_dim1"])
    mask = helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["mask_dim0", None])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [
        helper.make_node("Add", ["ids", "mask"], ["sum"], name="add"),
        helper.make_node("Softmax", ["sum"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(nodes, "apart", [ids, mask], [out])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_sizes_named_apart_that_broadcast_together_become_one(rng: np.random.Generator) -> None:
    model = _mask_added_to_scores()
    graph = knopt.load(model.SerializeToString())
    assert graph.symbols() == frozenset({"ids_dim0", "ids_dim1"})
    assert [format_shape(v.shape) for v in graph.inputs] == ["[ids_dim0, ids_dim1]"] * 2
    session = knopt.compile(graph)
    saved = knopt.save(knopt.optimize(graph))
    for shape in ((2, 5), (1, 3)):
        feeds = {name: rng.uniform(-2, 2, shape).astype(np.float32) for name in ("ids", "mask")}
        (expected,) = run_onnxruntime(model, feeds)
        (ours,) = session.run(None, feeds)
        np.testing.assert_allclose(ours, expected, rtol=1e-6, atol=1e-7)
        (optimized,) = run_onnxruntime(saved, feeds)
        np.testing.assert_allclose(optimized, expected, rtol=1e-6, atol=1e-6)


def test_sizes_taken_as_one_must_agree_when_the_model_runs() -> None:
    session = knopt.compile(_mask_added_to_scores().SerializeToString())
    feeds = {"ids": np.ones((2, 5), np.float32), "mask": np.ones((2, 4), np.float32)}
    with pytest.raises(InputError, match="input 'mask'"):
        session.run(None, feeds)


def test_shape_computed_beyond_symbolic_arithmetic_asks_for_sizes(
    rng: np.random.Generator,
) -> None:
    # x.view(b, min(s, 4), -1): the dynamo exporter writes such targets (GPT-Neo's local
    # attention window); min(s, 4) is no polynomial of s, but is known once s is fixed.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s"])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [
        helper.make_node("Shape", ["x"], ["batch"], start=0, end=1),
        helper.make_node("Shape", ["x"], ["seq"], start=1, end=2),
        helper.make_node("Min", ["seq", "four"], ["window"]),
        helper.make_node("Concat", ["batch", "window", "rest"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"], name="view"),
    ]
    constants = [
        numpy_helper.from_array(np.array([4], np.int64), "four"),
        numpy_helper.from_array(np.array([-1], np.int64), "rest"),
    ]
    graph = helper.make_graph(nodes, "window", [x], [out], constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    data = model.SerializeToString()
    with pytest.raises(SymbolicSizeError, match=r"node 'view'.*dims="):
        knopt.load(data)
    session = knopt.compile(data)
    for shape in ((2, 8), (1, 3)):
        feeds = {"x": rng.uniform(-2, 2, shape).astype(np.float32)}
        (ours,) = session.run(None, feeds)
        np.testing.assert_array_equal(ours, run_onnxruntime(model, feeds)[0])
    (fixed,) = knopt.compile(knopt.load(data, {"b": 1, "s": 3})).run(None, feeds)
    np.testing.assert_array_equal(fixed, ours)


def test_shape_computed_from_input_values_still_fails_to_load() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 6])
    target = helper.make_tensor_value_info("target", TensorProto.INT64, [2])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Reshape", ["x", "target"], ["y"], name="view")]
    graph = helper.make_graph(nodes, "data", [x, target], [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(KnownValueRequired) as info:
        knopt.compile(model.SerializeToString())
    assert not isinstance(info.value, SymbolicSizeError)


def test_mask_viewed_by_the_batch_of_another_input_shares_its_sizes(
    rng: np.random.Generator,
) -> None:
    # GPT-2's attention_mask.view(batch_size, -1), batch_size read off input_ids: with sizes
    # named apart, (mask_dim0 * mask_dim1) / ids_dim0 is inexact unless the batches are one.
    ids = helper.make_tensor_value_info("ids", TensorProto.FLOAT, ["ids_dim0", "ids_dim1"])
    mask = helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["mask_dim0", "mask_dim1"])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [
        helper.make_node("Shape", ["ids"], ["batch"], start=0, end=1),
        helper.make_node("Concat", ["batch", "rest"], ["target"], axis=0),
        helper.make_node("Reshape", ["mask", "target"], ["flat"], name="view"),
        helper.make_node("Mul", ["ids", "flat"], ["y"]),
    ]
    rest = numpy_helper.from_array(np.array([-1], np.int64), "rest")
    graph = helper.make_graph(nodes, "view", [ids, mask], [out], [rest])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    loaded = knopt.load(model.SerializeToString())
    assert loaded.symbols() == frozenset({"ids_dim0", "ids_dim1"})
    feeds = {name: rng.uniform(-2, 2, (3, 4)).astype(np.float32) for name in ("ids", "mask")}
    (ours,) = knopt.compile(loaded).run(None, feeds)
    np.testing.assert_array_equal(ours, run_onnxruntime(model, feeds)[0])
