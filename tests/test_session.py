"""Sessions: models that import only with fixed sizes are imported once per input shape."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import knopt
from knopt.errors import InputError, SymbolicBroadcastError
from knopt.session import PerSizeSession
from tests.oracle import run_onnxruntime


def _model_with_sizes_named_apart() -> onnx.ModelProto:
    # The dynamo exporter with Dim.AUTO, and TorchScript's list-form dynamic_axes, give each
    # input its own size names, though a model adds the inputs and so needs them equal.
    ids = helper.make_tensor_value_info("ids", TensorProto.FLOAT, ["s0", "s1"])
    mask = helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["s2", "s3"])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [
        helper.make_node("Add", ["ids", "mask"], ["sum"], name="add"),
        helper.make_node("Softmax", ["sum"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(nodes, "apart", [ids, mask], [out])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_sizes_named_apart_that_meet_import_per_input_shape(rng: np.random.Generator) -> None:
    model = _model_with_sizes_named_apart()
    data = model.SerializeToString()
    with pytest.raises(SymbolicBroadcastError, match=r"node 'add'.*dims="):
        knopt.load(data)
    session = knopt.compile(data)
    assert isinstance(session, PerSizeSession)
    assert session.input_names == ["ids", "mask"]
    assert session.output_names == ["y"]
    for shape in ((2, 5), (1, 3), (2, 5)):
        feeds = {
            "ids": rng.uniform(-2, 2, shape).astype(np.float32),
            "mask": rng.uniform(-2, 2, (1, shape[1])).astype(np.float32),
        }
        (ours,) = session.run(None, feeds)
        np.testing.assert_allclose(ours, run_onnxruntime(model, feeds)[0], rtol=1e-6, atol=1e-7)
    assert len(session._bound) == 2
    optimized = knopt.compile(data, optimize=True)
    (ours_optimized,) = optimized.run(None, feeds)
    np.testing.assert_allclose(ours_optimized, ours, rtol=1e-6, atol=1e-7)


def test_per_size_session_rejects_inputs_of_the_wrong_rank() -> None:
    session = knopt.compile(_model_with_sizes_named_apart().SerializeToString())
    with pytest.raises(InputError, match="input 'mask'"):
        session.run(None, {"ids": np.ones((2, 3), np.float32), "mask": np.ones(3, np.float32)})
