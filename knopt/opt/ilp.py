"""Exact extraction as an integer program, solved by HiGHS (highspy).

Variables: `x[n]` in {0, 1} chooses e-node n. Constraints: an output class has one chosen node;
any class at most one; a chosen node's children are chosen. The objective is the sum of chosen
nodes' costs. The incumbent from local search is the warm start.

Acyclicity is added lazily: a solution whose chosen nodes form a cycle gets a row that forbids
that cycle (its k nodes: at most k - 1 of them), and the solve runs again, at most CYCLE_ROUNDS
times. (The eager form, an order variable per class and a big-M row per edge, made a larger
program whose search on BERT's kernel phase ran 5 s to a time limit, or 20 s to optimality; on
the test fixtures no cycle has come up, so the lazy form solves one program.)

The solve is bounded by work, not time, so that its answer does not depend on how fast or busy
the machine is: at most MAX_BRANCH_NODES branch-and-bound nodes per round, enough for every
improvement found on the test fixtures (a ViT's kernel phase needs about 770 nodes for 0.36 %).
On every fixture that keeps each improvement the ILP found before (up to 5.6 % over local
search) and finds some more. The time limit is only a safety net; an answer it cuts short is
dropped.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import networkx as nx
import numpy as np

from knopt.opt.serialized import Children, EGraphData, ENode

MAX_BRANCH_NODES = 1000  # see the module docstring
CYCLE_ROUNDS = 20  # solves with one more cycle forbidden each, before giving up
# Costs are seconds (a kernel's are about 1e-6): in microseconds, HiGHS's absolute gap
# tolerance (1e-6) no longer ends a search 4 % above the optimum, as it did on a ViT.
COST_SCALE = 1e6
TIME_LIMIT = "Time limit reached"  # HiGHS's status when the safety net stopped the solve

_Row = tuple[list[int], list[float], float, float]  # columns, coefficients, low, high


@dataclass
class IlpResult:
    """What the solver found."""

    choice: dict[int, ENode] | None
    cost: float
    status: str


def solve_ilp(
    data: EGraphData,
    roots: Sequence[int],
    cost: Callable[[int, ENode], float],
    start: dict[int, ENode],
    seconds: float,
) -> IlpResult:
    """Solve the extraction ILP, warm-started from `start` (a valid choice).

    Args:
        data: The saturated e-graph.
        roots: The output classes.
        cost: The cost of a node in a class.
        start: A valid choice (local search's), the warm start.
        seconds: The safety time limit; a solve it stops returns no choice.
    """
    import highspy

    classes = {c for c, nodes in data.classes.items() if nodes}
    nodes: list[tuple[int, ENode]] = [
        (c, n)
        for c in sorted(classes)
        for n in data.classes[c]
        if all(k in classes for k in data.children(n))
    ]
    members: dict[int, list[int]] = {}
    for j, (c, _) in enumerate(nodes):
        members.setdefault(c, []).append(j)
    if any(root not in members for root in roots):
        return IlpResult(None, float("inf"), "infeasible: an output class has no node")
    solver = quiet_highs()
    count = len(nodes)
    solver.addVars(count, np.zeros(count), np.ones(count))
    solver.changeColsIntegrality(
        count,
        np.arange(count, dtype=np.int32),
        np.array([highspy.HighsVarType.kInteger] * count),
    )
    costs = np.array([cost(c, n) for c, n in nodes]) * COST_SCALE
    solver.changeColsCost(count, np.arange(count, dtype=np.int32), costs)
    _add_rows(solver, _rows(nodes, members, roots, data.children), highspy.kHighsInf)
    solver.setOptionValue("mip_max_nodes", MAX_BRANCH_NODES)
    warm = highspy.HighsSolution()
    warm.col_value = [1.0 if start.get(c) == n else 0.0 for c, n in nodes]
    warm.value_valid = True
    deadline = time.perf_counter() + seconds
    status = "not run"
    for _ in range(CYCLE_ROUNDS):
        solver.setSolution(warm)
        solver.setOptionValue("time_limit", max(0.0, deadline - time.perf_counter()))
        solver.run()
        status = solver.modelStatusToString(solver.getModelStatus())
        if status == TIME_LIMIT:  # its answer would depend on the machine's speed and load
            return IlpResult(None, float("inf"), f"{status} (answer dropped)")
        values = np.asarray(solver.getSolution().col_value)
        if values.size != count:
            return IlpResult(None, float("inf"), status)
        picked = {c: node for j, (c, node) in enumerate(nodes) if values[j] > 0.5}
        choice = _reachable(picked, roots, data.children)
        if choice is None:
            return IlpResult(None, float("inf"), f"{status}, incomplete solution")
        cycle = _cycle(choice, data.children)
        if not cycle:
            return IlpResult(choice, dag_cost(choice, roots, cost, data.children), status)
        columns = [nodes.index((c, choice[c])) for c in cycle]
        _add_rows(
            solver,
            [(columns, [1.0] * len(columns), -np.inf, len(columns) - 1.0)],
            highspy.kHighsInf,
        )
    return IlpResult(None, float("inf"), f"{status}, still cyclic after {CYCLE_ROUNDS} rounds")


def _rows(
    nodes: list[tuple[int, ENode]],
    members: dict[int, list[int]],
    roots: Sequence[int],
    children: Callable[[ENode], list[int]],
) -> list[_Row]:
    """One node per output class, at most one per class, and a chosen node's children chosen."""
    rows: list[_Row] = []
    for c, js in members.items():
        rows.append((js, [1.0] * len(js), 1.0 if c in roots else -np.inf, 1.0))
    for j, (c, node) in enumerate(nodes):
        for kid in set(children(node)):
            if kid == c:
                rows.append(([j], [1.0], 0.0, 0.0))  # a node reading its own class: never
                continue
            kid_js = members.get(kid, [])
            rows.append(([j, *kid_js], [1.0] + [-1.0] * len(kid_js), -np.inf, 0.0))
    return rows


def _cycle(choice: dict[int, ENode], children: Callable[[ENode], list[int]]) -> list[int]:
    """The classes of some cycle in the chosen program, or []."""
    reads = nx.DiGraph((c, k) for c, node in choice.items() for k in children(node))
    try:
        return [c for c, _ in nx.find_cycle(reads)]
    except nx.NetworkXNoCycle:
        return []


def _add_rows(
    solver: object, rows: list[tuple[list[int], list[float], float, float]], inf: float
) -> None:
    starts: list[int] = []
    index: list[int] = []
    value: list[float] = []
    low: list[float] = []
    high: list[float] = []
    for cols, coefs, lo, hi in rows:
        starts.append(len(index))
        index.extend(cols)
        value.extend(coefs)
        low.append(-inf if lo == -np.inf else lo)
        high.append(inf if hi == np.inf else hi)
    solver.addRows(  # type: ignore[attr-defined]
        len(rows),
        np.array(low),
        np.array(high),
        len(index),
        np.array(starts, dtype=np.int32),
        np.array(index, dtype=np.int32),
        np.array(value),
    )


def _reachable(
    picked: dict[int, ENode], roots: Sequence[int], children: Callable[[ENode], list[int]]
) -> dict[int, ENode] | None:
    choice: dict[int, ENode] = {}
    stack = list(roots)
    while stack:
        cls = stack.pop()
        if cls in choice:
            continue
        if cls not in picked:
            return None
        choice[cls] = picked[cls]
        stack.extend(children(picked[cls]))
    return choice


def dag_cost(
    choice: dict[int, ENode],
    roots: Sequence[int],
    cost: Callable[[int, ENode], float],
    children: Children = ENode.children,
) -> float:
    """The DAG cost of a choice: each needed class paid once."""
    needed: set[int] = set()
    stack = list(roots)
    while stack:
        cls = stack.pop()
        if cls not in needed:
            needed.add(cls)
            stack.extend(children(choice[cls]))
    return sum(cost(c, choice[c]) for c in needed)


def quiet_highs() -> Any:
    """A highspy `Highs` object; its banner, printed on first creation, is silenced."""
    import highspy

    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        solver = highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(devnull)
        os.close(saved)
    solver.setOptionValue("output_flag", False)
    return solver
