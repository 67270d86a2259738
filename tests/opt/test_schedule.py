"""knopt/opt/schedule.py: the schedule in slices of one iteration, under limits inside a step."""

from __future__ import annotations

import numpy as np
import pytest
from egglog import bindings as eb

import knopt
from knopt.cpu import run_graph
from knopt.ir import DType, Graph, GraphBuilder, Unary
from knopt.opt.egraph import Limits, _load, saturate
from knopt.opt.rules import RuleFile, saturated_rulesets, schedule_file, shipped_rule_files
from knopt.opt.schedule import ScheduleRunner, egraph_size, schedule_steps
from tests.models import MODELS
from tests.oracle import assert_same


def _sines(count: int = 100) -> Graph:
    g = GraphBuilder("sines")
    value = g.input("x", (2,), DType.F32)
    for _ in range(count):
        value = g.unary(Unary.SIN, value)
    g.output(value, "y")
    return g.build()


def _growing_rule(depth: int = 10) -> RuleFile:
    """sin(x) is sin(x) * 2 * 0.5 * ... (exact): each match adds 2 * depth e-nodes."""
    rhs = "(UnaryOp (SIN) x)"
    for _ in range(depth):
        rhs = f"(BinaryOp (MUL) (BinaryOp (MUL) {rhs} (Splat 2.0 s d)) (Splat 0.5 s d))"
    return RuleFile(
        "grow.egg",
        f"(rewrite (UnaryOp (SIN) x) {rhs} :when ((= s (shape x)) (= d (dtype x)))\n"
        '         :ruleset algebra :name "user-sin-grows")\n',
    )


@pytest.mark.parametrize("phase", [0, 1])
def test_slices_do_what_egglog_does_with_the_whole_schedule(phase: int) -> None:
    graph = knopt.load(MODELS / "mlp_ts14.onnx")
    files = shipped_rule_files()
    egraph, _, _ = _load(graph, files)
    command = egraph.parse_program(schedule_file().text)[phase]
    (output,) = egraph.run_program(command)
    assert isinstance(output, eb.RunScheduleOutput)
    expected = {k: v for k, v in output.report.num_matches_per_rule.items() if v}

    sliced, _, _ = _load(graph, files)
    runner = ScheduleRunner(sliced, Limits())
    runner.run(schedule_steps(sliced, schedule_file())[phase])
    assert runner.stopped_by is None
    assert egraph_size(sliced) == egraph_size(egraph)
    # The same rules fire; egglog's match counts shift by a few percent when the same
    # iterations come in several calls.
    assert {k for k, v in runner.rules_fired.items() if v} == set(expected)


def test_the_schedule_saturates_the_fact_rulesets() -> None:
    assert saturated_rulesets() == {"analysis", "fold", "merge", "fusion-facts", "epilogue"}


def test_a_node_limit_stops_inside_a_step() -> None:
    graph, rule = _sines(30), _growing_rule(depth=1)
    start = saturate(graph, [rule], Limits(nodes=1)).egraph_nodes  # the first step only
    result = saturate(graph, [rule], Limits(nodes=start + 1))
    assert (result.stopped_by or "").startswith(f"node limit ({start + 1} e-nodes")
    # Stopped after round 1's `(run algebra)`, before its analyses: they ran to settle types.
    steps = [p.name.split(":")[0] for p in result.phases]
    assert steps == ["(saturate analysis fold)", "round 1/12"]
    assert all(cls in result.data.shapes for cls in result.data.classes)


def test_an_iteration_far_past_the_node_limit_is_undone(rng: np.random.Generator) -> None:
    graph, rule = _sines(), _growing_rule()
    start = saturate(graph, [rule], Limits(nodes=1)).egraph_nodes
    result = saturate(graph, [rule], Limits(nodes=start + 10))
    assert "(run algebra), was undone" in (result.stopped_by or "")
    assert result.egraph_nodes <= start + 10
    optimized = knopt.optimize(graph, rules=[rule], limits=Limits(nodes=start + 10))
    assert "was undone" in (optimized.report.stopped_by or "")
    feeds = {"x": rng.standard_normal(2).astype(np.float32)}
    assert_same(run_graph(optimized.graph, feeds), run_graph(graph, feeds))


def test_a_time_limit_stops_a_growing_user_rule_with_a_correct_result(
    rng: np.random.Generator,
) -> None:
    # A limit of 0 s is past at the first check, so where it stops does not depend on how
    # fast the machine is: after round 1's `(run algebra)`, with the e-graph half grown.
    graph, rule = _sines(), _growing_rule()
    whole = saturate(graph, [rule], Limits())
    stopped = saturate(graph, [rule], Limits(seconds=0.0))
    assert stopped.stopped_by == "time limit (0 s)"
    assert [p.name.split(":")[0] for p in stopped.phases] == [
        "(saturate analysis fold)",
        "round 1/12",
    ]
    assert stopped.egraph_nodes < whole.egraph_nodes
    result = knopt.optimize(graph, rules=[rule], limits=Limits(seconds=0.0), ilp=False)
    assert result.report.stopped_by == "time limit (0 s)"
    feeds = {"x": rng.standard_normal(2).astype(np.float32)}
    assert_same(run_graph(result.graph, feeds), run_graph(graph, feeds))


def test_an_e_graph_too_big_to_read_back_is_an_optimize_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_memory(*args: object, **kwargs: object) -> None:
        raise MemoryError

    monkeypatch.setattr(eb.EGraph, "serialize", no_memory)
    with pytest.raises(knopt.errors.OptimizeError, match="too big to read back"):
        saturate(_sines(3))
