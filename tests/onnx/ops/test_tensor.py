"""Tensor-shaping importers (Trilu, ...) with static and symbolic (dynamic) sizes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import knopt
from tests.oracle import run_onnxruntime


@pytest.mark.parametrize(("upper", "k"), [(1, 1), (0, 0), (1, -2), (0, 3)])
def test_trilu_on_symbolic_sizes_matches_onnxruntime(
    rng: np.random.Generator, upper: int, k: int
) -> None:
    # A causal mask over a dynamic sequence, as torch.triu exports with dynamic axes.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", "seq"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node("Trilu", ["x", "k"], ["y"], upper=upper)
    k_init = numpy_helper.from_array(np.array(k, np.int64), "k")
    graph = helper.make_graph([node], "trilu", [x], [y], [k_init])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    graph_ir = knopt.load(model.SerializeToString())
    optimized = knopt.optimize(graph_ir).graph
    for batch, seq in ((1, 3), (2, 6)):
        feeds = {"x": rng.uniform(0.5, 1.5, (batch, seq, seq)).astype(np.float32)}
        (expected,) = run_onnxruntime(model, feeds)
        for session in (knopt.compile(graph_ir), knopt.compile(optimized)):
            (ours,) = session.run(None, feeds)
            np.testing.assert_array_equal(ours, expected)


def test_tile_by_a_symbolic_batch_matches_onnxruntime(rng: np.random.Generator) -> None:
    # DETR's learned queries, `query.weight.unsqueeze(0).repeat(batch, 1, 1)`, exported with a
    # dynamic batch: the repeat counts come from Shape(x) and stay symbolic.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], start=0, end=1),
        helper.make_node("Concat", ["shape", "ones"], ["repeats"], axis=0),
        helper.make_node("Tile", ["q", "repeats"], ["tiled"]),
        helper.make_node("Unsqueeze", ["x", "axis1"], ["x3"]),
        helper.make_node("Add", ["tiled", "x3"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(rng.uniform(0.5, 1.5, (1, 4, 3)).astype(np.float32), "q"),
        numpy_helper.from_array(np.array([1, 1], np.int64), "ones"),
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
    ]
    graph = helper.make_graph(nodes, "tile", [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    graph_ir = knopt.load(model.SerializeToString())
    optimized = knopt.optimize(graph_ir).graph
    for batch in (1, 3):
        feeds = {"x": rng.uniform(0.5, 1.5, (batch, 3)).astype(np.float32)}
        (expected,) = run_onnxruntime(model, feeds)
        for session in (knopt.compile(graph_ir), knopt.compile(optimized)):
            (ours,) = session.run(None, feeds)
            np.testing.assert_allclose(ours, expected, rtol=1e-6)
