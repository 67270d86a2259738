"""Random graphs: every op and kind appears, seeds reproduce, inputs are non-zero, drawn graphs
are valid and make the rules fire."""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import HealthCheck, given, settings

import knopt
from knopt.cpu import run_graph
from knopt.ir import Binary, Graph, Unary, format_graph, validate
from knopt.ir.op import OP_CLASSES, BinaryOp, UnaryOp
from knopt.opt.rules import shipped_rule_files
from knopt.testing import graph_from_seed, graphs
from knopt.testing.rulecheck.rulebook import read_rulebook


def _ops(graph: Graph) -> set[object]:
    found: set[object] = set()
    for node in graph.nodes:
        found.add(type(node.op))
        if isinstance(node.op, UnaryOp | BinaryOp):
            found.add(node.op.kind)
    return found


def test_the_generator_covers_every_op_and_every_elementwise_kind() -> None:
    seen: set[object] = set()
    for seed in range(1500):
        seen |= _ops(graph_from_seed(seed).graph)
    assert set(OP_CLASSES) <= seen, set(OP_CLASSES) - seen
    assert set(Unary) <= seen, set(Unary) - seen
    assert set(Binary) <= seen, set(Binary) - seen


def test_a_seed_gives_the_same_graph_and_inputs() -> None:
    first, second = graph_from_seed(12345), graph_from_seed(12345)
    assert format_graph(first.graph) == format_graph(second.graph)
    assert first.inputs.keys() == second.inputs.keys()
    for name, array in first.inputs.items():
        np.testing.assert_array_equal(array, second.inputs[name])


def test_inputs_are_non_zero_and_of_moderate_magnitude() -> None:
    floats = 0
    for seed in range(40):
        for array in graph_from_seed(seed).inputs.values():
            if array.dtype.kind == "f":
                floats += 1
                assert np.all(array != 0)
                assert np.all(np.abs(array) <= 2.5)
            elif array.dtype.kind in "iu":
                assert np.all(array != 0)
    assert floats > 40


def test_graphs_share_intermediates_and_have_several_outputs() -> None:
    shared = outputs = 0
    for seed in range(100):
        graph = graph_from_seed(seed).graph
        shared += any(len(node.output.users()) > 1 for node in graph.nodes)
        outputs += len(graph.outputs) > 1
    assert shared > 50
    assert outputs > 30


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs())
def test_drawn_graphs_are_valid_and_run(graph: Graph) -> None:
    validate(graph)
    rng = np.random.default_rng(0)
    from knopt.testing import random_inputs

    outputs = run_graph(graph, random_inputs(graph, rng))
    for value, array in zip(graph.outputs, outputs, strict=True):
        assert array.shape == value.shape
        assert array.dtype == value.dtype.numpy


def test_drawn_graphs_make_the_algebra_rules_fire() -> None:
    rulesets = {r.name: r.ruleset for r in read_rulebook(shipped_rule_files()).rules}
    fired: Counter[str] = Counter()
    graphs_with_algebra = 0
    for seed in range(30):
        report = knopt.optimize(graph_from_seed(seed).graph, ilp=False).report
        algebra = {
            n for n, count in report.rules_fired.items() if count and rulesets.get(n) == "algebra"
        }
        fired.update(algebra)
        graphs_with_algebra += bool(algebra)
    assert graphs_with_algebra >= 24
    assert len(fired) >= 30, sorted(fired)
