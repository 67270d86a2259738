"""Opaque ops (ONNX nodes kept as they are) in the optimizer: around them, never through them."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import knopt
from knopt.cpu import run_graph
from knopt.ir import DType, Graph, GraphBuilder, Unary
from knopt.ir.op import BinaryOp, Clamp, Constant, Opaque, TensorType, UnaryOp
from knopt.testing import compare_outputs, graph_from_seed
from knopt.testing.opaque import kept_node

F32 = DType.F32


def _kept(graph: Graph) -> Counter[Opaque]:
    return Counter(n.op for n in graph.nodes if isinstance(n.op, Opaque))


def _count(graph: Graph, kind: type) -> int:
    return sum(isinstance(n.op, kind) for n in graph.nodes)


def test_clamps_on_both_sides_of_a_kept_node_stay_apart(rng: np.random.Generator) -> None:
    # relu(relu(x)) is one relu (clamp of clamp); a kept Relu between them is no relu to rules.
    g = GraphBuilder("clamps")
    x = g.input("x", (4, 5), F32)
    (middle,) = kept_node(g, "Relu", [g.unary(Unary.RELU, x)], [TensorType((4, 5), F32)])
    g.output(g.unary(Unary.RELU, middle), "y")
    graph = g.build()
    optimized = knopt.optimize(graph, ilp=False).graph
    assert _kept(optimized) == _kept(graph)
    assert _count(optimized, UnaryOp) + _count(optimized, Clamp) == 2  # Relu or its clamp
    feeds = {"x": rng.standard_normal((4, 5)).astype(np.float32)}
    np.testing.assert_array_equal(run_graph(optimized, feeds)[0], run_graph(graph, feeds)[0])


def test_double_negation_through_a_kept_node_does_not_cancel() -> None:
    g = GraphBuilder("negations")
    x = g.input("x", (3,), F32)
    (kept,) = kept_node(g, "Neg", [g.unary(Unary.NEG, x)], [TensorType((3,), F32)])
    g.output(g.unary(Unary.NEG, kept), "y")
    optimized = knopt.optimize(g.build(), ilp=False).graph
    assert _count(optimized, UnaryOp) == 2
    assert len(_kept(optimized)) == 1


def test_folding_stops_at_a_kept_node() -> None:
    # Its input is a constant and its reader adds one: neither the node nor the sum folds.
    g = GraphBuilder("fold")
    x = g.input("x", (2, 3), F32)
    constant = g.constant(np.arange(1, 7, dtype=np.float32).reshape(2, 3))
    (kept,) = kept_node(g, "Neg", [constant], [TensorType((2, 3), F32)])
    g.output(g.add(g.add(kept, g.constant(np.float32(2.0))), x), "y")
    graph = g.build()
    optimized = knopt.optimize(graph, ilp=False).graph
    (node,) = [n for n in optimized.nodes if isinstance(n.op, Opaque)]
    assert isinstance(node.inputs[0].producer.op, Constant)
    assert any(isinstance(user.op, BinaryOp) for user in node.output.users())
    feeds = {"x": np.ones((2, 3), np.float32)}
    np.testing.assert_array_equal(run_graph(optimized, feeds)[0], run_graph(graph, feeds)[0])


def _seeded_graphs_with_kept_nodes(count: int) -> list[int]:
    found = []
    for seed in range(2000):
        if _kept(graph_from_seed(seed).graph):
            found.append(seed)
            if len(found) == count:
                return found
    raise AssertionError("too few random graphs hold a kept node")


@pytest.mark.parametrize("seed", _seeded_graphs_with_kept_nodes(6))
def test_random_graphs_keep_every_kept_node_and_compute_the_same(seed: int) -> None:
    case = graph_from_seed(seed)
    result = knopt.optimize(case.graph, ilp=False)
    # Every kept node survives, once (no rule merges, drops or duplicates one)...
    assert _kept(result.graph).keys() == _kept(case.graph).keys()
    # ... and what the graph computes is unchanged.
    comparison = compare_outputs(
        run_graph(result.graph, case.inputs), run_graph(case.graph, case.inputs)
    )
    assert comparison.ok, comparison.message
