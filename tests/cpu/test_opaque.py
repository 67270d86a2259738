"""Opaque ops on the CPU: onnx's reference evaluator runs the node, or the session refuses it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import knopt
from knopt.errors import RunError, UnsupportedOpError
from knopt.ir import DType, GraphBuilder
from knopt.ir.op import Opaque, TensorType
from knopt.onnx.opaque import opaque_call
from knopt.testing.opaque import kept_node
from tests.oracle import run_onnxruntime

F32 = TensorProto.FLOAT


def bitcast_model() -> onnx.ModelProto:
    """A standard op knopt lacks (BitCast, opset 26) between ops it has."""
    nodes = [
        helper.make_node("Abs", ["x"], ["a"], name="abs"),
        helper.make_node("BitCast", ["a"], ["bits"], name="bitcast", to=TensorProto.INT32),
        helper.make_node("BitShift", ["bits_u"], ["shifted"], name="shift", direction="RIGHT"),
        helper.make_node("Cast", ["bits"], ["bits_u"], name="to_u", to=TensorProto.UINT32),
        helper.make_node("Cast", ["shifted"], ["y"], name="to_f", to=TensorProto.FLOAT),
    ]
    nodes[2].input.append("by")
    graph = helper.make_graph(
        [nodes[0], nodes[1], nodes[3], nodes[2], nodes[4]],
        "bitcast",
        [helper.make_tensor_value_info("x", F32, ["n", 4])],
        [helper.make_tensor_value_info("y", F32, ["n", 4])],
        [numpy_helper.from_array(np.array([23], dtype=np.uint32), "by")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 26)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("optimize", [False, True], ids=["as-loaded", "optimized"])
def test_a_standard_op_knopt_lacks_runs_on_the_cpu_as_onnxruntime_does(
    optimize: bool, rng: np.random.Generator
) -> None:
    model = bitcast_model()
    graph = knopt.load(model.SerializeToString())
    assert [n.op.call.op_type for n in graph.nodes if isinstance(n.op, Opaque)] == ["BitCast"]
    session = knopt.compile(graph, optimize=optimize)
    for n in (1, 5):
        feeds = {"x": rng.uniform(-4, 4, (n, 4)).astype(np.float32)}
        (expected,) = run_onnxruntime(model, feeds)
        (actual,) = session.run(None, feeds)
        np.testing.assert_array_equal(actual, expected)  # the float's exponent bits


def test_the_cpu_refuses_an_op_the_reference_evaluator_lacks_before_running() -> None:
    node = helper.make_node("FastGelu", ["x"], ["y"], name="gelu", domain="com.microsoft")
    g = GraphBuilder("contrib")
    x = g.input("x", (2, 3), DType.F32)
    kept = Opaque(opaque_call(node, "com.microsoft", 1), 0, TensorType((2, 3), DType.F32))
    g.output(g.apply(kept, [x]), "y")
    with pytest.raises(UnsupportedOpError, match=r"'gelu'.*CPU.*--target onnx") as caught:
        knopt.compile(g.build())
    assert (caught.value.op_type, caught.value.domain, caught.value.node) == (
        "FastGelu",
        "com.microsoft",
        "gelu",
    )


def test_a_result_that_is_not_the_declared_type_is_a_run_error_naming_it() -> None:
    g = GraphBuilder("declared")
    x = g.input("x", (2, 3), DType.F32)
    (kept,) = kept_node(g, "Sin", [x], [TensorType((2, 4), DType.F32)])
    g.output(kept, "y")
    with pytest.raises(
        RunError, match=r"node 'kept_sin' \(Sin\) computed float32\[2, 3\].*\[2, 4\]"
    ):
        knopt.compile(g.build()).run(None, {"x": np.ones((2, 3), np.float32)})


def test_an_op_without_inputs_runs_at_every_run() -> None:
    # A random op has no value to keep from one run to the next.
    g = GraphBuilder("random")
    x = g.input("x", (4,), DType.F32)
    (noise,) = kept_node(g, "RandomUniform", [], [TensorType((4,), DType.F32)], shape=[4])
    g.output(g.add(x, noise), "y")
    session = knopt.compile(g.build())
    feeds = {"x": np.zeros(4, np.float32)}
    (first,), (second,) = session.run(None, feeds), session.run(None, feeds)
    assert not np.array_equal(first, second)
