"""Instances of a rule's left side: built with the IR builder and repaired to match."""

from __future__ import annotations

from knopt.ir import Graph
from knopt.ir import op as ops
from knopt.opt.rules import shipped_rule_files
from knopt.testing.choices import SeededChoices
from knopt.testing.rulecheck.instance import instantiate
from knopt.testing.rulecheck.pattern import flatten
from knopt.testing.rulecheck.rulebook import read_rulebook
from knopt.testing.rulecheck.unfold import producers, unfold

BOOK = read_rulebook(shipped_rule_files())
INDEX = producers(BOOK)


def _instances(name: str, count: int = 12) -> list[Graph]:
    found = []
    for seed in range(count):
        unfolded = unfold(BOOK, INDEX, BOOK.rule(name).query, SeededChoices(seed), exclude=name)
        pattern = flatten(BOOK, *unfolded) if unfolded is not None else None
        graph = instantiate(BOOK, pattern, seed) if pattern is not None else None
        if graph is not None:
            found.append(graph)
    return found


def test_softmax_instances_reduce_over_the_last_axis_as_the_guard_demands() -> None:
    graphs = _instances("softmax")
    assert len(graphs) >= 8
    for graph in graphs:
        reduces = [n.op for n in graph.nodes if isinstance(n.op, ops.Reduce)]
        rank = graph.outputs[0].rank
        assert {r.axes for r in reduces} == {(rank - 1,)}  # repaired from random axes


def test_layer_norm_instances_divide_by_the_row_length() -> None:
    for graph in _instances("mean-over-last-axis"):
        (reduce,) = [n for n in graph.nodes if isinstance(n.op, ops.Reduce)]
        (scale,) = [n for n in graph.nodes if isinstance(n.op, ops.Constant)]
        length = reduce.inputs[0].shape[-1]
        assert isinstance(scale.op, ops.Constant) and isinstance(length, int)
        assert abs(float(scale.op.data.array.reshape(-1)[0]) * length - 1) < 1e-6


def test_gather_indices_stay_inside_their_axis() -> None:
    graphs = _instances("fold-gather", 20)
    assert graphs
    for graph in graphs:
        for node in graph.nodes:
            if isinstance(node.op, ops.Gather) and isinstance(
                node.inputs[1].producer.op, ops.Constant
            ):
                size = node.inputs[0].shape[node.op.axis]
                indices = node.inputs[1].producer.op.data.array
                assert indices.size == 0 or (-size <= indices.min() and indices.max() < size)


def test_matmul_and_convolution_instances_type_check() -> None:
    assert any(isinstance(n.op, ops.Conv) for g in _instances("scale-into-conv") for n in g.nodes)
    assert any(
        isinstance(n.op, ops.MatMul) for g in _instances("scale-into-matmul") for n in g.nodes
    )
