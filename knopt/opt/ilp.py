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
the machine is. The ILP runs only where it can pay off within a small share of the
optimizer's time, in two steps:

- **Dominated nodes out.** A node that costs no less than another node of its class and reads
  a superset of its classes is never needed for the optimum (`undominated`). Dropping them
  (10-20 % of the nodes of the fixtures' kernel phases) made HiGHS solve BERT's kernel phase 5x
  and ViT's 10x faster, with the same answers.
- **The root first.** HiGHS solves the root node of its search (LP, cuts, heuristics) and
  branches, up to MAX_BRANCH_NODES nodes, only where the root found a better program than the
  warm start without proving it optimal. Measured on every fixture (cpu and h200 profiles, both
  phases): each improvement the ILP makes over local search (up to 5 %) is found at the root;
  the branching after a root that found nothing never found anything, and it was the ILP's
  whole cost where it ran long (BERT's kernel phase on the cpu profile: 1000 nodes, 3 s, now
  0.5 s at the root).

The time limit is only a safety net; an answer it cuts short is dropped.
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

MAX_BRANCH_NODES = 1000  # after a root that improved on the warm start; see the docstring
ROOT_ONLY = "root found no better program (not branched)"  # the status when branching was skipped
CYCLE_ROUNDS = 20  # solves with one more cycle forbidden each, before giving up
# Costs are seconds (a kernel's are about 1e-6): in microseconds, HiGHS's absolute gap
# tolerance (1e-6) no longer ends a search 4 % above the optimum, as it did on a ViT.
COST_SCALE = 1e6
BETTER = 1e-12 * COST_SCALE  # a cheaper program, as extraction counts one (1e-12 s), scaled
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

    usable = undominated(data, cost)
    nodes: list[tuple[int, ENode]] = [(c, n) for c in sorted(usable) for n, _ in usable[c]]
    members: dict[int, list[int]] = {}
    for j, (c, _) in enumerate(nodes):
        members.setdefault(c, []).append(j)
    if any(root not in members for root in roots):
        return IlpResult(None, float("inf"), "infeasible: an output class has no node")
    solver = quiet_highs()
    # To the optimum: at HiGHS's default relative gap (1e-4), a solve could stop at a program
    # dearer by a tie-breaking trace of cost (6e-7 relative, on a ResNet).
    solver.setOptionValue("mip_rel_gap", 0.0)
    count = len(nodes)
    solver.addVars(count, np.zeros(count), np.ones(count))
    solver.changeColsIntegrality(
        count,
        np.arange(count, dtype=np.int32),
        np.array([highspy.HighsVarType.kInteger] * count),
    )
    costs = np.array([node_cost for c in sorted(usable) for _, node_cost in usable[c]]) * COST_SCALE
    solver.changeColsCost(count, np.arange(count, dtype=np.int32), costs)
    _add_rows(solver, _rows(nodes, members, roots, data.children), highspy.kHighsInf)
    warm = highspy.HighsSolution()
    warm_choice = _dominators(start, usable, data.children)
    warm.col_value = [1.0 if warm_choice.get(c) == n else 0.0 for c, n in nodes]
    warm.value_valid = True
    deadline = time.perf_counter() + seconds
    status = "not run"
    for _ in range(CYCLE_ROUNDS):
        status = _solve(solver, warm, float(np.dot(costs, warm.col_value)), deadline)
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


def _solve(solver: Any, warm: Any, warm_cost: float, deadline: float) -> str:
    """Solve the root node, then branch only if the root improved on `warm` without proving.

    Returns HiGHS's status, or ROOT_ONLY where the root found nothing better (the solution is
    then the warm start).
    """
    import highspy

    solver.setSolution(warm)
    solver.setOptionValue("mip_max_nodes", 1)
    solver.setOptionValue("time_limit", max(0.0, deadline - time.perf_counter()))
    solver.run()
    if solver.getModelStatus() != highspy.HighsModelStatus.kSolutionLimit:
        return str(solver.modelStatusToString(solver.getModelStatus()))
    if solver.getInfo().objective_function_value >= warm_cost - BETTER:
        return ROOT_ONLY
    solver.setSolution(solver.getSolution())
    solver.setOptionValue("mip_max_nodes", MAX_BRANCH_NODES)
    solver.setOptionValue("time_limit", max(0.0, deadline - time.perf_counter()))
    solver.run()
    return str(solver.modelStatusToString(solver.getModelStatus()))


Usable = dict[int, list[tuple[ENode, float]]]  # class -> its nodes kept, with their costs


def undominated(data: EGraphData, cost: Callable[[int, ENode], float]) -> Usable:
    """Each class's usable nodes that no other node of the class dominates, with their costs.

    A node is usable when every class it reads has nodes and it does not read its own class.
    Node `a` dominates node `b` of the same class when `a` costs no more and reads a subset of
    `b`'s classes: a program that chooses `b` costs no less with `a` instead (it needs no
    class more) and stays acyclic (a cycle through `a` passes a class `b` reads too), so
    dropping `b` keeps the optimum. Of equal nodes the first is kept. On the fixtures' kernel
    phase this drops 10-20 % of the nodes, and HiGHS solves BERT's 5x and ViT's 10x faster.
    """
    classes = {c for c, nodes in data.classes.items() if nodes}
    usable: Usable = {}
    for c in sorted(classes):
        found = []
        for n in data.classes[c]:
            kids = data.children(n)
            if c not in kids and all(k in classes for k in kids):
                found.append((n, cost(c, n), frozenset(kids)))
        kept = [
            (n, n_cost)
            for i, (n, n_cost, n_kids) in enumerate(found)
            if not any(
                _dominates((m_cost, m_kids, j), (n_cost, n_kids, i))
                for j, (_, m_cost, m_kids) in enumerate(found)
                if j != i
            )
        ]
        if kept:
            usable[c] = kept
    return usable


def _dominates(a: tuple[float, frozenset[int], int], b: tuple[float, frozenset[int], int]) -> bool:
    """Whether node `a` (cost, classes read, index) dominates node `b` of the same class."""
    a_cost, a_kids, a_index = a
    b_cost, b_kids, b_index = b
    if a_cost > b_cost or not a_kids <= b_kids:
        return False
    return a_cost < b_cost or a_kids < b_kids or a_index < b_index


def _dominators(
    start: dict[int, ENode], usable: Usable, children: Callable[[ENode], list[int]]
) -> dict[int, ENode]:
    """`start` with each dropped node replaced by a kept node of its class that dominates it."""
    found = {}
    for c, node in start.items():
        kept = usable.get(c, [])
        if any(n == node for n, _ in kept):
            found[c] = node
            continue
        kids = frozenset(children(node))
        better = [(n_cost, i) for i, (n, n_cost) in enumerate(kept) if set(children(n)) <= kids]
        if better:
            found[c] = kept[min(better)[1]][0]
    return found


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
    for j, (_, node) in enumerate(nodes):
        for kid in set(children(node)):
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
