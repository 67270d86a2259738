"""If, Loop and Scan import: unrolled and selected control flow agrees with onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

import knopt
from knopt.ir.op import Where
from tests.onnx.ops.node_models import assert_matches


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[str],
    opset: int = 16,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "control",
        inputs,
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _branch(name: str, op: str) -> onnx.GraphProto:
    node = helper.make_node(op, ["x", "x"], [f"{name}_out"])
    out = helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [3])
    return helper.make_graph([node], name, [], [out])


def test_if_on_a_computed_condition_selects_between_both_branches(
    rng: np.random.Generator,
) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        helper.make_node("Constant", [], ["zero"], value_float=0.0),
        helper.make_node("Greater", ["total", "zero"], ["positive"]),
        helper.make_node(
            "If",
            ["positive"],
            ["y"],
            then_branch=_branch("then", "Add"),
            else_branch=_branch("else", "Mul"),
        ),
    ]
    model = _model(nodes, [x], ["y"])
    assert any(isinstance(n.op, Where) for n in knopt.load(model.SerializeToString()).nodes)
    for sign in (1.0, -1.0):
        feed = {"x": sign * rng.uniform(0.5, 2, 3).astype(np.float32)}
        assert_matches(model, feed)


def test_loop_with_a_known_trip_count_unrolls_with_scan_outputs(
    rng: np.random.Generator,
) -> None:
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["acc_in", "x"], ["acc_out"]),
            helper.make_node("Mul", ["acc_out", "acc_out"], ["square"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [2]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("square", TensorProto.FLOAT, [2]),
        ],
    )
    nodes = [
        helper.make_node("Constant", [], ["trips"], value=helper.make_tensor("t", 7, [], [4])),
        helper.make_node("Constant", [], ["go"], value=helper.make_tensor("g", 9, [], [True])),
        helper.make_node("Loop", ["trips", "go", "start"], ["acc", "squares"], body=body),
    ]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
        helper.make_tensor_value_info("start", TensorProto.FLOAT, [2]),
    ]
    model = _model(nodes, inputs, ["acc", "squares"])
    feeds = {n: rng.uniform(-1, 1, 2).astype(np.float32) for n in ("x", "start")}
    assert_matches(model, feeds)


def test_scan_runs_backwards_over_its_input_and_stacks_outputs(
    rng: np.random.Generator,
) -> None:
    body = helper.make_graph(
        [
            helper.make_node("Add", ["sum_in", "row"], ["sum_out"]),
            helper.make_node("Identity", ["sum_out"], ["partial"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("sum_in", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("row", TensorProto.FLOAT, [3]),
        ],
        [
            helper.make_tensor_value_info("sum_out", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("partial", TensorProto.FLOAT, [3]),
        ],
    )
    node = helper.make_node(
        "Scan",
        ["init", "xs"],
        ["total", "partials"],
        body=body,
        num_scan_inputs=1,
        scan_input_directions=[1],
    )
    inputs = [
        helper.make_tensor_value_info("init", TensorProto.FLOAT, [3]),
        helper.make_tensor_value_info("xs", TensorProto.FLOAT, [4, 3]),
    ]
    model = _model([node], inputs, ["total", "partials"])
    feeds = {
        "init": rng.uniform(-1, 1, 3).astype(np.float32),
        "xs": rng.uniform(-1, 1, (4, 3)).astype(np.float32),
    }
    assert_matches(model, feeds)
