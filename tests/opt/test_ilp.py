"""The extraction ILP: dominated nodes left out, and branching only after a root that paid off."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import highspy
import pytest

from knopt.opt.extract import check_extraction
from knopt.opt.ilp import MAX_BRANCH_NODES, ROOT_ONLY, _solve, solve_ilp, undominated
from knopt.opt.serialized import EGraphData, ENode, Ref

LEAF = ENode("Input", ("x",))


def _node(op: str, *children: int) -> ENode:
    return ENode(op, tuple(Ref(c) for c in children))


def _costs(table: Mapping[str, float]) -> Callable[[int, ENode], float]:
    return lambda cls, node: table.get(node.op, 0.0)


# Class 3 can be computed four ways: Cheap reads class 1 only; Dear reads classes 1 and 2 and
# costs more (dominated by Cheap); Twin is Cheap again (an equal node: the first is kept);
# Lean reads nothing but costs more than Cheap (kept: it needs no class 1).
CHOICES = EGraphData(
    classes={
        0: [LEAF],
        1: [_node("A", 0)],
        2: [_node("B", 0)],
        3: [
            _node("Cheap", 1),
            _node("Dear", 1, 2),
            _node("Twin", 1),
            _node("Lean"),
            _node("Me", 3),
        ],
        4: [_node("Out", 3)],
    }
)
CHOICE_COSTS = _costs({"A": 1.0, "B": 1.0, "Cheap": 1.0, "Dear": 2.0, "Twin": 1.0, "Lean": 3.0})


def test_dominated_and_self_reading_nodes_are_left_out() -> None:
    kept = undominated(CHOICES, CHOICE_COSTS)
    assert [node.op for node, _ in kept[3]] == ["Cheap", "Lean"]
    assert [cost for _, cost in kept[3]] == [1.0, 3.0]
    assert set(kept) == {0, 1, 2, 3, 4}


def test_a_warm_start_on_a_dominated_node_still_gives_the_optimum() -> None:
    start = {
        0: LEAF,
        1: _node("A", 0),
        2: _node("B", 0),
        3: _node("Dear", 1, 2),
        4: CHOICES.classes[4][0],
    }
    result = solve_ilp(CHOICES, [4], CHOICE_COSTS, start, 5.0)
    assert result.choice is not None
    assert check_extraction(result.choice, [4]) is None
    assert result.choice[3].op == "Cheap"
    assert result.cost == pytest.approx(2.0)  # A and Cheap; Out and the leaf are free


@dataclass
class _FakeHighs:
    """HiGHS as `_solve` drives it (highspy's method names); run k gives `outcomes[k]`."""

    outcomes: list[tuple[Any, float]]
    options: dict[str, Any] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)
    warm: list[Any] = field(default_factory=list)

    def setSolution(self, solution: Any) -> None:
        self.warm.append(solution)

    def setOptionValue(self, name: str, value: Any) -> None:
        self.options[name] = value

    def run(self) -> None:
        self.runs.append(dict(self.options))

    def getModelStatus(self) -> Any:
        return self.outcomes[len(self.runs) - 1][0]

    def modelStatusToString(self, status: Any) -> str:
        return str(status)

    def getInfo(self) -> Any:
        return type("Info", (), {"objective_function_value": self.outcomes[len(self.runs) - 1][1]})

    def getSolution(self) -> str:
        return f"solution of run {len(self.runs)}"


STATUS = highspy.HighsModelStatus


def test_a_root_that_proves_optimality_is_the_answer() -> None:
    solver = _FakeHighs([(STATUS.kOptimal, 8.0)])
    assert _solve(solver, "warm", 10.0, float("inf")) == str(STATUS.kOptimal)
    assert [run["mip_max_nodes"] for run in solver.runs] == [1]


def test_a_root_that_finds_nothing_better_is_not_branched() -> None:
    solver = _FakeHighs([(STATUS.kSolutionLimit, 10.0)])
    assert _solve(solver, "warm", 10.0, float("inf")) == ROOT_ONLY
    assert [run["mip_max_nodes"] for run in solver.runs] == [1]


def test_a_root_that_finds_a_better_program_is_branched_from_it() -> None:
    solver = _FakeHighs([(STATUS.kSolutionLimit, 9.0), (STATUS.kOptimal, 8.5)])
    assert _solve(solver, "warm", 10.0, float("inf")) == str(STATUS.kOptimal)
    assert [run["mip_max_nodes"] for run in solver.runs] == [1, MAX_BRANCH_NODES]
    assert solver.warm == ["warm", "solution of run 1"]
