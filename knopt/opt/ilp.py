"""Exact extraction as an integer program, solved by HiGHS (highspy).

Variables: `x[n]` in {0, 1} chooses e-node n; `t[c]` in [0, N] is class c's position in a
topological order. Constraints: an output class has one chosen node; any class at most one; a
chosen node's children are chosen; a chosen node's class comes after its children
(`t[c] >= t[d] + 1` when `x[n] = 1`, a big-M constraint), so the program is acyclic.
The objective is the sum of chosen nodes' costs. The incumbent from local search is the warm
start, and a time limit bounds the solve.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from knopt.opt.serialized import Children, EGraphData, ENode


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
    """Solve the extraction ILP, warm-started from `start` (a valid choice)."""
    import highspy

    classes = [c for c, nodes in data.classes.items() if nodes]
    class_index = {c: i for i, c in enumerate(classes)}
    nodes: list[tuple[int, ENode]] = [
        (c, n)
        for c in classes
        for n in data.classes[c]
        if all(k in class_index for k in data.children(n))
    ]
    n_x, n_t = len(nodes), len(classes)
    big = float(n_t + 1)
    rows: list[tuple[list[int], list[float], float, float]] = []
    members: dict[int, list[int]] = {}
    for j, (c, _) in enumerate(nodes):
        members.setdefault(c, []).append(j)
    for c, js in members.items():
        low = 1.0 if c in roots else -np.inf
        rows.append((js, [1.0] * len(js), low, 1.0))
    for root in roots:
        if root not in members:
            return IlpResult(None, float("inf"), "infeasible: an output class has no node")
    for j, (c, node) in enumerate(nodes):
        for kid in set(data.children(node)):
            if kid == c:
                rows.append(([j], [1.0], 0.0, 0.0))  # a node reading its own class: never
                continue
            kid_js = members.get(kid, [])
            rows.append(([j, *kid_js], [1.0] + [-1.0] * len(kid_js), -np.inf, 0.0))
            tc, td = n_x + class_index[c], n_x + class_index[kid]
            rows.append(([tc, td, j], [1.0, -1.0, -big], 1.0 - big, np.inf))
    solver = quiet_highs()
    inf = highspy.kHighsInf
    lower = np.zeros(n_x + n_t)
    upper = np.concatenate([np.ones(n_x), np.full(n_t, float(n_t))])
    solver.addVars(n_x + n_t, lower, upper)
    solver.changeColsIntegrality(
        n_x, np.arange(n_x, dtype=np.int32), np.array([highspy.HighsVarType.kInteger] * n_x)
    )
    costs = np.array([cost(c, n) for c, n in nodes])
    solver.changeColsCost(n_x, np.arange(n_x, dtype=np.int32), costs)
    _add_rows(solver, rows, inf)
    solver.setSolution(_warm_start(nodes, classes, start, roots, data.children))
    solver.setOptionValue("time_limit", float(seconds))
    solver.run()
    status = solver.modelStatusToString(solver.getModelStatus())
    values = np.asarray(solver.getSolution().col_value)
    if values.size != n_x + n_t:
        return IlpResult(None, float("inf"), status)
    picked: dict[int, ENode] = {}
    for j, (c, node) in enumerate(nodes):
        if values[j] > 0.5:
            picked[c] = node
    choice = _reachable(picked, roots, data.children)
    if choice is None:
        return IlpResult(None, float("inf"), f"{status}, incomplete solution")
    return IlpResult(choice, dag_cost(choice, roots, cost, data.children), status)


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


def _warm_start(
    nodes: list[tuple[int, ENode]],
    classes: list[int],
    start: dict[int, ENode],
    roots: Sequence[int],
    children: Callable[[ENode], list[int]],
) -> object:
    import highspy

    order = _topological(start, roots, children)
    x = [1.0 if start.get(c) == n else 0.0 for c, n in nodes]
    t = [float(order.get(c, 0)) for c in classes]
    solution = highspy.HighsSolution()
    solution.col_value = x + t
    solution.value_valid = True
    return solution


def _topological(
    choice: dict[int, ENode], roots: Sequence[int], children: Callable[[ENode], list[int]]
) -> dict[int, int]:
    position: dict[int, int] = {}
    visiting: set[int] = set()

    def visit(cls: int) -> None:
        stack = [(cls, False)]
        while stack:
            c, leaving = stack.pop()
            if leaving:
                position[c] = len(position)
                continue
            if c in position or c in visiting:
                continue
            visiting.add(c)
            stack.append((c, True))
            stack.extend((k, False) for k in children(choice[c]) if k not in position)

    for root in roots:
        visit(root)
    return position


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
