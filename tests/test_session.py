"""Sessions: models that import only with fixed sizes are imported once per input shape."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import knopt
from knopt.errors import InputError, SymbolicSizeError
from knopt.session import PerSizeSession
from tests.oracle import run_onnxruntime


def _reshape_to_rows_of_another_input() -> onnx.ModelProto:
    # x.reshape(len(y), -1): with symbolic sizes, (s0 * s1) / s2 is no exact polynomial.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["s0", "s1"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["s2"])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, None)
    nodes = [
        helper.make_node("Shape", ["y"], ["rows"]),
        helper.make_node("Concat", ["rows", "rest"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["rows_of_x"], name="reshape"),
        helper.make_node("Softmax", ["rows_of_x"], ["out"], axis=-1),
    ]
    rest = numpy_helper.from_array(np.array([-1], np.int64), "rest")
    graph = helper.make_graph(nodes, "rows", [x, y], [out], [rest])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_model_that_needs_fixed_sizes_imports_per_input_shape(rng: np.random.Generator) -> None:
    model = _reshape_to_rows_of_another_input()
    data = model.SerializeToString()
    with pytest.raises(SymbolicSizeError, match=r"dims="):
        knopt.load(data)
    session = knopt.compile(data)
    assert isinstance(session, PerSizeSession)
    assert session.input_names == ["x", "y"]
    assert session.output_names == ["out"]
    for rows, cols, length in ((2, 6, 3), (4, 3, 2), (2, 6, 3)):
        feeds = {
            "x": rng.uniform(-2, 2, (rows, cols)).astype(np.float32),
            "y": rng.uniform(-2, 2, (length,)).astype(np.float32),
        }
        (ours,) = session.run(None, feeds)
        np.testing.assert_allclose(ours, run_onnxruntime(model, feeds)[0], rtol=1e-6, atol=1e-7)
    assert session.graph.symbols() == frozenset()
    (optimized,) = knopt.compile(data, optimize=True).run(None, feeds)
    np.testing.assert_allclose(optimized, ours, rtol=1e-6, atol=1e-7)


def test_per_size_session_rejects_inputs_of_the_wrong_rank() -> None:
    session = knopt.compile(_reshape_to_rows_of_another_input().SerializeToString())
    with pytest.raises(InputError, match="input 'y'"):
        session.run(None, {"x": np.ones((2, 3), np.float32), "y": np.ones((1, 2), np.float32)})
