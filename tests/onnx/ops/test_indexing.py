"""GatherElements and ReverseSequence import, with static and symbolic (dynamic) sizes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import knopt
from tests.onnx.ops.node_models import assert_matches, node_model
from tests.oracle import run_onnxruntime


def test_gather_elements_with_symbolic_batch_and_sequence_matches_onnxruntime(
    rng: np.random.Generator,
) -> None:
    data = helper.make_tensor_value_info("data", TensorProto.FLOAT, ["batch", "seq", 4])
    index = helper.make_tensor_value_info("index", TensorProto.INT64, ["batch", "seq", 2])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node("GatherElements", ["data", "index"], ["y"], axis=2)
    graph = helper.make_graph([node], "gather", [data, index], [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    session = knopt.compile(model.SerializeToString())
    for batch, seq in ((1, 3), (2, 5)):
        feeds: dict[str, np.ndarray] = {
            "data": rng.uniform(-1, 1, (batch, seq, 4)).astype(np.float32),
            "index": rng.integers(-4, 4, (batch, seq, 2)).astype(np.int64),
        }
        (ours,) = session.run(None, feeds)
        np.testing.assert_array_equal(ours, run_onnxruntime(model, feeds)[0])


def test_gather_elements_along_a_middle_axis_matches_onnxruntime(
    rng: np.random.Generator,
) -> None:
    data = rng.uniform(-1, 1, (3, 5, 2)).astype(np.float32)
    index = rng.integers(0, 5, (3, 2, 2)).astype(np.int64)
    model = node_model("GatherElements", {"data": data, "index": index}, ["y"], opset=13, axis=1)
    assert_matches(model, {"data": data, "index": index}, rtol=0, atol=0)


def test_reverse_sequence_reverses_each_sequence_within_its_length(
    rng: np.random.Generator,
) -> None:
    x = rng.uniform(-1, 1, (4, 3, 2)).astype(np.float32)
    lengths = np.array([4, 1, 3], np.int64)
    model = node_model(
        "ReverseSequence",
        {"x": x, "lengths": lengths},
        ["y"],
        opset=10,
        batch_axis=1,
        time_axis=0,
    )
    assert_matches(model, {"x": x, "lengths": lengths}, rtol=0, atol=0)


def _symbolic_model(node: onnx.NodeProto, inputs: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
    out = helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, None)
    graph = helper.make_graph([node], node.op_type.lower(), inputs, [out])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])


def test_scatter_nd_with_symbolic_sizes_matches_onnxruntime(rng: np.random.Generator) -> None:
    # TorchScript exports slice assignment (`shifted[:, 1:] = ids[:, :-1]`, BART's
    # shift_tokens_right) as ScatterND over index grids of the dynamic batch and sequence.
    node = helper.make_node("ScatterND", ["data", "index", "updates"], ["y"])
    model = _symbolic_model(
        node,
        [
            helper.make_tensor_value_info("data", TensorProto.FLOAT, ["batch", "seq", 3]),
            helper.make_tensor_value_info("index", TensorProto.INT64, ["batch", "n", 2]),
            helper.make_tensor_value_info("updates", TensorProto.FLOAT, ["batch", "n", 3]),
        ],
    )
    session = knopt.compile(model.SerializeToString())
    for batch, seq, n in ((1, 4, 2), (3, 6, 5)):
        # Distinct (row, position) pairs, some written with negative positions.
        rows = np.repeat(np.arange(batch), n).reshape(batch, n)
        cols = np.stack([rng.permutation(seq)[:n] for _ in range(batch)]) - seq * (rows % 2)
        feeds: dict[str, np.ndarray] = {
            "data": rng.uniform(-1, 1, (batch, seq, 3)).astype(np.float32),
            "index": np.stack([rows, cols], axis=-1).astype(np.int64),
            "updates": rng.uniform(-1, 1, (batch, n, 3)).astype(np.float32),
        }
        (ours,) = session.run(None, feeds)
        np.testing.assert_array_equal(ours, run_onnxruntime(model, feeds)[0])


@pytest.mark.parametrize("batch_dims", [0, 1])
def test_gather_nd_with_symbolic_sizes_matches_onnxruntime(
    rng: np.random.Generator, batch_dims: int
) -> None:
    node = helper.make_node("GatherND", ["data", "index"], ["y"], batch_dims=batch_dims)
    model = _symbolic_model(
        node,
        [
            helper.make_tensor_value_info("data", TensorProto.FLOAT, ["batch", "seq", 3]),
            helper.make_tensor_value_info("index", TensorProto.INT64, ["batch", "n", 1]),
        ],
    )
    session = knopt.compile(model.SerializeToString())
    for batch, seq, n in ((1, 4, 2), (3, 6, 5)):
        bound = seq if batch_dims else batch
        feeds: dict[str, np.ndarray] = {
            "data": rng.uniform(-1, 1, (batch, seq, 3)).astype(np.float32),
            "index": rng.integers(-bound, bound, (batch, n, 1)).astype(np.int64),
        }
        (ours,) = session.run(None, feeds)
        np.testing.assert_array_equal(ours, run_onnxruntime(model, feeds)[0])


@pytest.mark.parametrize("opset", [10, 13])
def test_non_zero_of_a_constant_fill_is_an_arange(rng: np.random.Generator, opset: int) -> None:
    # torch.arange(x.shape[1]) exported before opset 11 (BERT's position ids at opset 9/10):
    # NonZero(ConstantOfShape(seq, 1)), transposed and squeezed, added to a float input.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    one = helper.make_tensor("one", TensorProto.INT64, [1], [1])
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "i1"], ["seq"], axis=0),
        helper.make_node("ConstantOfShape", ["seq"], ["ones"], value=one),
        helper.make_node("NonZero", ["ones"], ["nz"]),
        helper.make_node("Transpose", ["nz"], ["t"], perm=[1, 0]),
        helper.make_node("Cast", ["t"], ["pos"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["x", "pos"], ["y"]),
    ]
    index = onnx.numpy_helper.from_array(np.array([1], np.int64), "i1")
    graph = helper.make_graph(nodes, "arange", [x], [y], [index])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    graph_ir = knopt.load(model.SerializeToString())
    optimized = knopt.optimize(graph_ir).graph
    for batch, seq in ((1, 4), (3, 7)):
        feeds = {"x": rng.uniform(0.5, 1.5, (batch, seq, 2)).astype(np.float32)}
        (expected,) = run_onnxruntime(model, feeds)
        for session in (knopt.compile(graph_ir), knopt.compile(optimized)):
            (ours,) = session.run(None, feeds)
            np.testing.assert_allclose(ours, expected, rtol=1e-6)


def test_non_zero_of_a_constant_folds(rng: np.random.Generator) -> None:
    constant = rng.integers(-1, 2, (3, 4)).astype(np.float32)
    x = rng.integers(1, 5, (2, 1)).astype(np.int64)
    nodes = [
        helper.make_node("NonZero", ["c"], ["nz"]),
        helper.make_node("Mul", ["nz", "x"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "nonzero",
        [helper.make_tensor_value_info("x", TensorProto.INT64, [2, 1])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, None)],
        [onnx.numpy_helper.from_array(constant, "c")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    assert_matches(model, {"x": x})


def test_non_zero_of_run_time_values_is_refused_by_name() -> None:
    x = np.ones((2, 3), np.float32)
    model = node_model("NonZero", {"x": x}, ["y"], opset=13)
    with pytest.raises(knopt.UnsupportedModelError, match=r"NonZero.*known when loading"):
        knopt.load(model.SerializeToString())
