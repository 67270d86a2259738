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
