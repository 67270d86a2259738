"""Extraction: choose one e-node per needed class so the program's total cost is least.

The cost of a program is the sum of the costs of the nodes it computes, each class paid once
however many readers it has (DAG cost). Three steps:

1. **Order.** Every class gets a key; a node is *allowed* in a class only if all its children
   have smaller keys, so any choice of allowed nodes is acyclic. Classes that hold IR nodes take
   their IR position, so the original program is always allowed; classes made by rules get keys
   just above their children (a Dijkstra pass over "max of the children").
2. **Greedy + local search.** A bottom-up pass picks, per class, the allowed node with the least
   cost when shared children are split among their readers. Local search then makes exact moves
   (reference counts track which classes are needed): switch one class to another node, or stop
   reading a shared class by switching all its readers at once (inline a cheap intermediate).
3. **ILP** (HiGHS through highspy) when the e-graph is small enough: binary node variables,
   one node per class, children of chosen nodes chosen, explicit topological-order constraints
   for acyclicity, warm-started from step 2 and time-limited.

Every result is checked (one node per needed class, children present, no cycle); a failed
check falls back to the local-search answer.
"""

from __future__ import annotations

import heapq
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from knopt.errors import OptimizeError
from knopt.opt.serialized import EGraphData, ENode

_STEP = 1 << 20  # keys: IR position * _STEP, plus the depth of rule-made classes above it


@dataclass
class Extraction:
    """The chosen node of every needed class.

    Attributes:
        choice: Class id to its node, for needed classes only.
        cost: Total DAG cost (seconds).
        method: Which step produced the answer ("greedy", "local", "ilp").
        ilp_status: What the ILP did, if it ran.
    """

    choice: dict[int, ENode]
    cost: float
    method: str
    ilp_status: str = "not run"


class _Problem:
    """Dense arrays of classes and allowed nodes."""

    def __init__(
        self,
        data: EGraphData,
        cost: Callable[[int, ENode], float],
        ir_classes: Sequence[int],
    ) -> None:
        self.data = data
        self.key = _keys(data, ir_classes)
        self.nodes: dict[int, list[ENode]] = {}
        self.costs: dict[int, list[float]] = {}
        self.kids: dict[int, list[tuple[int, ...]]] = {}
        for cls, nodes in data.classes.items():
            if cls not in self.key:
                continue
            mine = self.key[cls]
            kept = [n for n in nodes if all(self.key.get(c, mine) < mine for c in n.children())]
            kept = [n for n in kept if all(c in self.key for c in n.children())]
            self.nodes[cls] = kept
            self.costs[cls] = [cost(cls, n) for n in kept]
            self.kids[cls] = [tuple(dict.fromkeys(n.children())) for n in kept]


def _keys(data: EGraphData, ir_classes: Sequence[int]) -> dict[int, int]:
    """Each class's key: IR position for IR classes, else just above its cheapest children."""
    key: dict[int, int] = {}
    for index, cls in enumerate(ir_classes):
        key.setdefault(cls, index * _STEP)
    parents: dict[int, list[tuple[int, int]]] = {}
    waiting: dict[tuple[int, int], int] = {}
    heap: list[tuple[int, int]] = []
    for cls, nodes in data.classes.items():
        for i, node in enumerate(nodes):
            kids = set(node.children())
            waiting[(cls, i)] = len(kids)
            for kid in kids:
                parents.setdefault(kid, []).append((cls, i))
            if not kids and cls not in key:
                heapq.heappush(heap, (-_STEP + 1, cls))
    for cls, k in key.items():
        heapq.heappush(heap, (k, cls))
    settled: dict[int, int] = {}
    while heap:
        k, cls = heapq.heappop(heap)
        if cls in settled:
            continue
        settled[cls] = k
        for parent, i in parents.get(cls, []):
            waiting[(parent, i)] -= 1
            if waiting[(parent, i)] == 0 and parent not in settled and parent not in key:
                heapq.heappush(heap, (k + 1, parent))
    return settled


class _Solution:
    """A choice for every class, with exact reference counting of what is needed."""

    def __init__(self, problem: _Problem, choice: dict[int, int], roots: Sequence[int]) -> None:
        self.p = problem
        self.choice = choice
        self.refs: dict[int, int] = {}
        self.total = 0.0
        # For undo: (class, +1 or -1) is a reference-count change; (class, -(old + 2)) is a
        # change of the class's chosen node from node index `old`.
        self.log: list[tuple[int, int]] = []
        for root in roots:
            self._inc(root)
        self.log.clear()

    def needed(self) -> list[int]:
        return [c for c, r in self.refs.items() if r > 0]

    def _inc(self, cls: int) -> float:
        delta = 0.0
        stack = [cls]
        while stack:
            c = stack.pop()
            self.refs[c] = self.refs.get(c, 0) + 1
            self.log.append((c, 1))
            if self.refs[c] == 1:
                i = self.choice[c]
                delta += self.p.costs[c][i]
                stack.extend(self.p.kids[c][i])
        self.total += delta
        return delta

    def _dec(self, cls: int) -> float:
        delta = 0.0
        stack = [cls]
        while stack:
            c = stack.pop()
            self.refs[c] -= 1
            self.log.append((c, -1))
            if self.refs[c] == 0:
                i = self.choice[c]
                delta -= self.p.costs[c][i]
                stack.extend(self.p.kids[c][i])
        self.total += delta
        return delta

    def switch(self, cls: int, new: int) -> float:
        """Choose node `new` for `cls`; returns the change of total cost."""
        old = self.choice[cls]
        if old == new:
            return 0.0
        delta = 0.0
        if self.refs.get(cls, 0) > 0:
            delta += self.p.costs[cls][new] - self.p.costs[cls][old]
            self.total += delta
            self.choice[cls] = new
            self.log.append((cls, -(old + 2)))  # a choice change, undone by restoring old
            for kid in self.p.kids[cls][new]:
                delta += self._inc(kid)
            for kid in self.p.kids[cls][old]:
                delta += self._dec(kid)
        else:
            self.choice[cls] = new
            self.log.append((cls, -(old + 2)))
        return delta

    def mark(self) -> int:
        return len(self.log)

    def undo(self, mark: int, total: float) -> None:
        while len(self.log) > mark:
            cls, change = self.log.pop()
            if change in (1, -1):
                self.refs[cls] -= change
            else:
                self.choice[cls] = -change - 2
        self.total = total


def _greedy(problem: _Problem) -> dict[int, int]:
    """Per class, the node least costly when shared children are split among readers."""
    readers: dict[int, int] = {}
    for cls, kid_lists in problem.kids.items():
        for kid in {k for kids in kid_lists for k in kids}:
            readers[kid] = readers.get(kid, 0) + 1
    estimate: dict[int, float] = {}
    choice: dict[int, int] = {}
    for cls in sorted(problem.nodes, key=problem.key.__getitem__):
        best, best_i = float("inf"), -1
        for i, kids in enumerate(problem.kids[cls]):
            if not all(k in estimate for k in kids):
                continue
            value = problem.costs[cls][i] + sum(estimate[k] / readers[k] for k in kids)
            if value < best:
                best, best_i = value, i
        if best_i >= 0:
            estimate[cls] = best
            choice[cls] = best_i
    return choice


def _local_search(solution: _Solution, deadline: float) -> int:
    """Improve by exact moves until none helps or time is up; returns accepted moves."""
    p = solution.p
    accepted = 0
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        for cls in sorted(solution.needed(), key=p.key.__getitem__, reverse=True):
            if solution.refs.get(cls, 0) == 0 or len(p.nodes[cls]) < 2:
                continue
            for i in range(len(p.nodes[cls])):
                if not all(k in solution.choice for k in p.kids[cls][i]):
                    continue
                mark, before = solution.mark(), solution.total
                if solution.switch(cls, i) < -1e-15:
                    improved, accepted = True, accepted + 1
                else:
                    solution.undo(mark, before)
        accepted += _inline_shared(solution)
        if time.perf_counter() >= deadline:
            break
    return accepted


def _inline_shared(solution: _Solution) -> int:
    """Try, for each class read more than once, to have all its readers stop reading it."""
    p = solution.p
    readers: dict[int, list[int]] = {}
    for cls in solution.needed():
        for kid in p.kids[cls][solution.choice[cls]]:
            readers.setdefault(kid, []).append(cls)
    accepted = 0
    for shared, users in readers.items():
        if len(users) < 2 or solution.refs.get(shared, 0) == 0:
            continue
        mark, before = solution.mark(), solution.total
        ok = True
        for user in users:
            if shared not in p.kids[user][solution.choice[user]]:
                continue
            options = [
                i
                for i, kids in enumerate(p.kids[user])
                if shared not in kids and all(k in solution.choice for k in kids)
            ]
            if not options:
                ok = False
                break
            best, best_delta = None, float("inf")
            for i in options:
                inner, total = solution.mark(), solution.total
                delta = solution.switch(user, i)
                solution.undo(inner, total)
                if delta < best_delta:
                    best, best_delta = i, delta
            assert best is not None
            solution.switch(user, best)
        if ok and solution.total < before - 1e-15:
            accepted += 1
        else:
            solution.undo(mark, before)
    return accepted


def extract(
    data: EGraphData,
    roots: Sequence[int],
    cost: Callable[[int, ENode], float],
    ir_nodes: Sequence[tuple[int, ENode]],
    *,
    seconds: float = 10.0,
    ilp_max_nodes: int = 4000,
    ilp_seconds: float = 5.0,
) -> Extraction:
    """Choose the cheapest program for `roots`.

    Raises:
        OptimizeError: If no acyclic choice reaches the roots (a knopt bug).
    """
    problem = _Problem(data, cost, [cls for cls, _ in ir_nodes])
    choice = _greedy(problem)
    missing = [r for r in roots if r not in choice]
    if missing:
        raise OptimizeError(f"extraction found no program for output classes {missing}")
    deadline = time.perf_counter() + seconds
    solution = _Solution(problem, dict(choice), roots)
    moves = _local_search(solution, deadline)
    method = "local" if moves else "greedy"
    # The original program is allowed by construction; search from it too, and keep the best,
    # so optimizing never makes the estimate worse.
    start = _original_choice(problem, data, ir_nodes) | {
        c: i for c, i in choice.items() if c not in ir_classes_set(ir_nodes)
    }
    other = _Solution(problem, start, roots)
    other_moves = _local_search(other, deadline)
    if other.total < solution.total - 1e-15:
        solution, method = other, "local" if other_moves else "original"
    best = _chosen(solution)
    result = Extraction(best, solution.total, method)
    assert check_extraction(best, roots) is None, check_extraction(best, roots)
    allowed = sum(len(n) for n in problem.nodes.values())
    if ilp_max_nodes and allowed <= ilp_max_nodes:
        from knopt.opt.ilp import solve_ilp

        ilp = solve_ilp(data, roots, cost, best, ilp_seconds)
        result.ilp_status = ilp.status
        if ilp.choice is not None and ilp.cost < result.cost - 1e-12:
            problem_error = check_extraction(ilp.choice, roots)
            if problem_error is None:
                result = Extraction(ilp.choice, ilp.cost, "ilp", ilp.status)
            else:
                result.ilp_status = f"rejected: {problem_error}"
    return result


def ir_classes_set(ir_nodes: Sequence[tuple[int, ENode]]) -> set[int]:
    """The classes that hold IR nodes."""
    return {cls for cls, _ in ir_nodes}


def _original_choice(
    problem: _Problem, data: EGraphData, ir_nodes: Sequence[tuple[int, ENode]]
) -> dict[int, int]:
    """Each IR class's first IR node (the one its key comes from)."""
    choice: dict[int, int] = {}
    for cls, node in ir_nodes:
        if cls not in choice and node in problem.nodes[cls]:
            choice[cls] = problem.nodes[cls].index(node)
    return choice


def _chosen(solution: _Solution) -> dict[int, ENode]:
    p = solution.p
    return {c: p.nodes[c][solution.choice[c]] for c in solution.needed()}


def check_extraction(choice: dict[int, ENode], roots: Sequence[int]) -> str | None:
    """None if `choice` is a valid program for `roots`, else what is wrong with it."""
    state: dict[int, int] = {}  # 1 on the DFS stack, 2 done
    for root in roots:
        if root not in choice:
            return f"output class {root} has no node"
        stack: list[tuple[int, bool]] = [(root, False)]
        while stack:
            cls, leaving = stack.pop()
            if leaving:
                state[cls] = 2
                continue
            if state.get(cls) == 2:
                continue
            if state.get(cls) == 1:
                return f"class {cls} depends on itself (a cycle)"
            if cls not in choice:
                return f"class {cls} is needed but has no node"
            state[cls] = 1
            stack.append((cls, True))
            for kid in set(choice[cls].children()):
                if state.get(kid) == 1:
                    return f"class {kid} depends on itself (a cycle)"
                if state.get(kid) != 2:
                    stack.append((kid, False))
    return None


def dag_cost(choice: dict[int, ENode], roots: Sequence[int],
             cost: Callable[[int, ENode], float]) -> float:
    """The DAG cost of a choice: each needed class paid once."""
    needed: set[int] = set()
    stack = list(roots)
    while stack:
        cls = stack.pop()
        if cls not in needed:
            needed.add(cls)
            stack.extend(choice[cls].children())
    return sum(cost(c, choice[c]) for c in needed)


def quiet_highs() -> object:
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

