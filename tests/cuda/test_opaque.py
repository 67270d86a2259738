"""Opaque ops (ONNX nodes knopt keeps as they are) on the GPU: refused, naming the node."""

from __future__ import annotations

import pytest

import knopt
from knopt.cuda.planner import build_plan
from knopt.errors import UnsupportedOpError
from knopt.ir import DType, Graph, GraphBuilder, Unary
from knopt.ir.op import TensorType
from knopt.ir.program import program_from_graph
from knopt.testing.opaque import kept_node


def _graph() -> Graph:
    g = GraphBuilder("kept")
    x = g.input("x", (2, 3), DType.F32)
    (kept,) = kept_node(g, "Sin", [g.unary(Unary.RELU, x)], [TensorType((2, 3), DType.F32)])
    g.output(g.unary(Unary.NEG, kept), "y")
    return g.build()


def test_planning_an_opaque_op_for_the_gpu_is_refused_naming_it() -> None:
    with pytest.raises(UnsupportedOpError, match=r"node 'kept_sin' \(Sin\).*GPU.*device='cpu'"):
        build_plan(program_from_graph(_graph()))


@pytest.mark.cuda
def test_a_cuda_session_refuses_an_opaque_op_before_any_work() -> None:
    with pytest.raises(UnsupportedOpError, match="cannot run it on the GPU") as caught:
        knopt.compile(_graph(), "cuda")
    assert (caught.value.op_type, caught.value.domain, caught.value.node) == ("Sin", "", "kept_sin")
