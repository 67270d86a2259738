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


def _same_padded_conv() -> onnx.ModelProto:
    # auto_pad SAME pads by an amount that depends on the (symbolic) image size.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, None)
    nodes = [
        helper.make_node("Conv", ["x", "k"], ["conv"], auto_pad="SAME_UPPER", strides=[2, 2]),
        helper.make_node("ReduceMean", ["conv"], ["pooled"], axes=[2, 3], keepdims=0),
        helper.make_node("Add", ["pooled", "y"], ["out"]),
    ]
    kernel = np.linspace(-1, 1, 2 * 2 * 3 * 3, dtype=np.float32).reshape(2, 2, 3, 3)
    graph = helper.make_graph(nodes, "same", [x, y], [out], [numpy_helper.from_array(kernel, "k")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_model_that_needs_fixed_sizes_imports_per_input_shape(rng: np.random.Generator) -> None:
    model = _same_padded_conv()
    data = model.SerializeToString()
    with pytest.raises(SymbolicSizeError, match=r"dims="):
        knopt.load(data)
    session = knopt.compile(data)
    assert isinstance(session, PerSizeSession)
    assert session.input_names == ["x", "y"]
    assert session.output_names == ["out"]
    for n, h, w in ((1, 7, 6), (2, 5, 9), (1, 7, 6)):
        feeds = {
            "x": rng.uniform(-2, 2, (n, 2, h, w)).astype(np.float32),
            "y": rng.uniform(-2, 2, (n, 2)).astype(np.float32),
        }
        (ours,) = session.run(None, feeds)
        np.testing.assert_allclose(ours, run_onnxruntime(model, feeds)[0], rtol=1e-6, atol=1e-7)
    assert session.graph.symbols() == frozenset()
    (optimized,) = knopt.compile(data, optimize=True).run(None, feeds)
    np.testing.assert_allclose(optimized, ours, rtol=1e-6, atol=1e-7)


def test_per_size_session_rejects_inputs_of_the_wrong_rank() -> None:
    session = knopt.compile(_same_padded_conv().SerializeToString())
    with pytest.raises(InputError, match="input 'y'"):
        session.run(None, {"x": np.ones((1, 2, 4, 4), np.float32), "y": np.ones(2, np.float32)})
