"""Extraction: choose one e-node per needed class so the program's total cost is least.

The cost of a program is the sum of the costs of the nodes it computes, each class paid once
however many readers it has (DAG cost). Three steps:

1. **Greedy.** Classes are visited bottom-up (in order of their shallowest node, a Dijkstra
   pass over "one more than the deepest child"); each takes the node whose children are already
   chosen and whose cost is least when a shared child's cost is split among its readers.
2. **Local search** with exact costs: reference counts track which classes the program needs,
   and moves are (a) switching one class to another node, (b) having every reader of a shared
   class stop reading it (inlining a cheap intermediate), (c) the converse, having every
   needed class that could read a class outside the program read it, which then takes its
   best node (a merged op, which pays only once all its parts read it). A move that would make
   a cycle is refused: a topological numbering of the current choice answers most checks at
   once, a bounded search the rest. The original program is a second starting point, so the
   result is never estimated worse than the input.
3. **ILP** (HiGHS through highspy, knopt/opt/ilp.py) when the e-graph is small enough,
   warm-started from step 2, without the nodes another node of their class dominates, and
   branching only where the search's root node found a better program (bounded by work).

Every result is checked (one node per needed class, children present, no cycle); a failed check
falls back to the local-search answer.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from knopt.errors import OptimizeError
from knopt.opt.ilp import solve_ilp
from knopt.opt.serialized import Children, EGraphData, ENode


@dataclass
class Extraction:
    """The chosen node of every needed class.

    Attributes:
        choice: Class id to its node, for needed classes only.
        cost: Total DAG cost (seconds).
        method: Which step produced the answer ("greedy", "original", "local", "ilp").
        ilp_status: What the ILP did, if it ran.
    """

    choice: dict[int, ENode]
    cost: float
    method: str
    ilp_status: str = "not run"


class _Problem:
    """Classes with their usable nodes, node costs and distinct children."""

    def __init__(self, data: EGraphData, cost: Callable[[int, ENode], float]) -> None:
        children = data.children
        self.nodes: dict[int, list[ENode]] = {}
        self.costs: dict[int, list[float]] = {}
        self.kids: dict[int, list[tuple[int, ...]]] = {}
        self.readers: dict[int, set[int]] = {}  # class -> classes with a node that reads it
        for cls, nodes in data.classes.items():
            kept = [n for n in nodes if all(k in data.classes for k in children(n))]
            kept = [n for n in kept if cls not in children(n)]
            self.nodes[cls] = kept
            self.costs[cls] = [cost(cls, n) for n in kept]
            self.kids[cls] = [tuple(dict.fromkeys(children(n))) for n in kept]
            for kids in self.kids[cls]:
                for kid in kids:
                    self.readers.setdefault(kid, set()).add(cls)

    def bottom_up(self) -> list[int]:
        """Classes in order of their shallowest node's depth (unreachable ones left out)."""
        parents: dict[int, list[tuple[int, int]]] = {}
        waiting: dict[tuple[int, int], int] = {}
        heap: list[tuple[int, int]] = []
        for cls, kid_lists in self.kids.items():
            for i, kids in enumerate(kid_lists):
                waiting[(cls, i)] = len(kids)
                for kid in kids:
                    parents.setdefault(kid, []).append((cls, i))
                if not kids:
                    heapq.heappush(heap, (0, cls))
        order: list[int] = []
        seen: set[int] = set()
        while heap:
            depth, cls = heapq.heappop(heap)
            if cls in seen:
                continue
            seen.add(cls)
            order.append(cls)
            for parent, i in parents.get(cls, []):
                waiting[(parent, i)] -= 1
                if waiting[(parent, i)] == 0 and parent not in seen:
                    heapq.heappush(heap, (depth + 1, parent))
        return order


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
        self.position: dict[int, int] = {}
        self.renumber()

    def needed(self) -> list[int]:
        return [c for c, r in self.refs.items() if r > 0]

    def renumber(self) -> bool:
        """A topological numbering of the chosen nodes of all classes (children first).

        Returns False, leaving the numbering unusable, if the chosen nodes form a cycle.
        """
        position: dict[int, int] = {}
        done = 0  # positions are distinct: a tie would hide a cycle from `creates_cycle`
        for start in self.choice:
            if start in position:
                continue
            stack = [(start, False)]
            while stack:
                cls, leaving = stack.pop()
                if leaving:
                    position[cls] = done
                    done += 1
                elif cls not in position:
                    position[cls] = -1  # on the stack
                    stack.append((cls, True))
                    for kid in self.p.kids[cls][self.choice[cls]]:
                        if kid not in position:
                            stack.append((kid, False))
                        elif position[kid] == -1:  # an ancestor on the stack: a cycle
                            return False
        self.position = position
        return True

    def creates_cycle(self, cls: int, new: int) -> bool:
        """Would choosing node `new` for `cls` make `cls` depend on itself?"""
        mine = self.position[cls]
        later = [k for k in self.p.kids[cls][new] if self.position[k] > mine]
        seen: set[int] = set()
        while later:
            kid = later.pop()
            if kid == cls:
                return True
            if kid in seen:
                continue
            seen.add(kid)
            # Only classes numbered after `cls` can lead back to it.
            later.extend(k for k in self.p.kids[kid][self.choice[kid]] if self.position[k] >= mine)
        return False

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
        """Choose node `new` for `cls` (acyclic, checked by the caller); the change of cost."""
        old = self.choice[cls]
        if old == new:
            return 0.0
        self.choice[cls] = new
        self.log.append((cls, -(old + 2)))
        if self.refs.get(cls, 0) == 0:
            return 0.0
        delta = self.p.costs[cls][new] - self.p.costs[cls][old]
        self.total += delta
        for kid in self.p.kids[cls][new]:
            delta += self._inc(kid)
        for kid in self.p.kids[cls][old]:
            delta += self._dec(kid)
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

    def is_stale(self, cls: int, new: int) -> bool:
        """Whether the numbering stopped being topological when `cls` took node `new`."""
        return any(self.position[k] > self.position[cls] for k in self.p.kids[cls][new])

    def accept(self, cls: int, new: int) -> None:
        """Keep the numbering topological after `cls` took node `new`."""
        if self.is_stale(cls, new):
            self.renumber()


def _greedy(problem: _Problem, order: list[int]) -> dict[int, int]:
    """Per class, the node least costly when shared children are split among readers."""
    readers: dict[int, int] = {}
    for kid_lists in problem.kids.values():
        for kid in {k for kids in kid_lists for k in kids}:
            readers[kid] = readers.get(kid, 0) + 1
    estimate: dict[int, float] = {}
    choice: dict[int, int] = {}
    for cls in order:
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


def _try(solution: _Solution, cls: int, new: int) -> float | None:
    """The cost change of switching `cls` to `new`, applied; None (nothing done) if cyclic."""
    if not all(k in solution.choice for k in solution.p.kids[cls][new]):
        return None
    if solution.creates_cycle(cls, new):
        return None
    return solution.switch(cls, new)


def _local_search(solution: _Solution, deadline: float) -> int:
    """Improve by exact moves until none helps or time is up; returns accepted moves."""
    p = solution.p
    accepted = 0
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        for cls in sorted(solution.needed(), key=solution.position.__getitem__, reverse=True):
            if solution.refs.get(cls, 0) == 0 or len(p.nodes[cls]) < 2:
                continue
            for i in range(len(p.nodes[cls])):
                mark, before = solution.mark(), solution.total
                delta = _try(solution, cls, i)
                if delta is not None and delta < -1e-15:
                    solution.accept(cls, i)
                    improved, accepted = True, accepted + 1
                else:
                    solution.undo(mark, before)
        moved = _inline_shared(solution) + _gather_shared(solution)
        accepted += moved
        improved = improved or moved > 0
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
        # Each reader's cycle check uses the numbering of the choices before the move, which
        # misses a cycle through two readers switched in this move; the renumbering at the end
        # finds those. Renumbering is O(classes), so it is done once a move, not once a reader
        # (bert-16k: 1 s of extraction instead of 19 s). renumber() makes a new dict: this one
        # stays topological for the choices an undo restores.
        numbering = solution.position
        ok = True
        stale = False  # the numbering is not topological for the readers switched so far
        for user in users:
            if shared not in p.kids[user][solution.choice[user]]:
                continue
            best, best_delta = None, float("inf")
            for i, kids in enumerate(p.kids[user]):
                if shared in kids:
                    continue
                inner, total = solution.mark(), solution.total
                delta = _try(solution, user, i)
                solution.undo(inner, total)
                if delta is not None and delta < best_delta:
                    best, best_delta = i, delta
            if best is None:
                ok = False
                break
            solution.switch(user, best)
            stale = stale or solution.is_stale(user, best)
        if ok and solution.total < before - 1e-15 and (not stale or solution.renumber()):
            accepted += 1
        else:
            solution.undo(mark, before)
            solution.position = numbering
    return accepted


def _gather_shared(solution: _Solution) -> int:
    """Try, for each class outside the program, having all needed classes that could read it do.

    The converse of `_inline_shared`. A merged op (rules/merge.egg) computes several needed
    classes at once and pays only once all of them read it: moving one reader at a time never
    helps, so no single switch finds it. The class read then takes its best node: the greedy
    pass chose one for it while it was outside the program, by estimates (which is why even a
    single reader is worth moving: a switch alone keeps that estimated choice).
    """
    p = solution.p
    accepted = 0
    for shared, readers in p.readers.items():
        if solution.refs.get(shared, 0) > 0:
            continue
        users = [c for c in readers if solution.refs.get(c, 0) > 0]
        if not users:
            continue
        mark, before = solution.mark(), solution.total
        numbering = solution.position  # see _inline_shared: one renumbering a move
        stale = False
        for user in users:
            best, best_delta = None, float("inf")
            for i, kids in enumerate(p.kids[user]):
                if shared not in kids or i == solution.choice[user]:
                    continue
                inner, total = solution.mark(), solution.total
                delta = _try(solution, user, i)
                solution.undo(inner, total)
                if delta is not None and delta < best_delta:
                    best, best_delta = i, delta
            if best is not None:
                solution.switch(user, best)
                stale = stale or solution.is_stale(user, best)
        # Renumbering costs a pass over every class: first see whether the move can pay at all.
        hope = min([0.0, *(d for _, d in _deltas(solution, shared))])
        acyclic = False
        if solution.refs.get(shared, 0) > 0 and solution.total + hope < before - 1e-15:
            acyclic = not stale or solution.renumber()
            if acyclic:
                _rechoose(solution, shared)
        if acyclic and solution.total < before - 1e-15:
            accepted += 1
        else:
            solution.undo(mark, before)
            solution.position = numbering
    return accepted


def _deltas(solution: _Solution, cls: int) -> list[tuple[int, float]]:
    """The change of cost of switching `cls` to each of its other nodes (cycles unchecked)."""
    found = []
    for i, kids in enumerate(solution.p.kids[cls]):
        if i == solution.choice[cls] or not all(k in solution.choice for k in kids):
            continue
        mark, total = solution.mark(), solution.total
        found.append((i, solution.switch(cls, i)))
        solution.undo(mark, total)
    return found


def _rechoose(solution: _Solution, cls: int) -> None:
    """Switch `cls` to its best node in the current program, if that is cheaper."""
    best, best_delta = None, -1e-15
    for i, _ in sorted(_deltas(solution, cls), key=lambda pair: pair[1]):
        mark, total = solution.mark(), solution.total
        delta = _try(solution, cls, i)
        if delta is not None and delta < best_delta:
            best, best_delta = i, delta
            break  # the cheapest acyclic one, trying the cheapest first
        solution.undo(mark, total)
    if best is not None:
        solution.accept(cls, best)


def extract(
    data: EGraphData,
    roots: Sequence[int],
    cost: Callable[[int, ENode], float],
    ir_nodes: Sequence[tuple[int, ENode]],
    *,
    seconds: float = 10.0,
    ilp_max_nodes: int = 4000,
    ilp_seconds: float = 30.0,
) -> Extraction:
    """Choose the cheapest program for `roots`.

    Args:
        data: The saturated e-graph.
        roots: The output classes.
        cost: The cost of a node in a class.
        ir_nodes: Each original IR node's class and e-node (the original program).
        seconds: Time for local search.
        ilp_max_nodes: Run the ILP only on e-graphs with at most this many nodes (0: never).
        ilp_seconds: A safety net for the ILP: its work bound (`knopt.opt.ilp.MAX_BRANCH_NODES`)
            ends a normal solve well before, and an answer this limit cuts short is dropped.

    Raises:
        OptimizeError: If no acyclic choice reaches the roots (a knopt bug).
    """
    problem = _Problem(data, cost)
    choice = _greedy(problem, problem.bottom_up())
    missing = [r for r in roots if r not in choice]
    if missing:
        raise OptimizeError(f"extraction found no program for output classes {missing}")
    deadline = time.perf_counter() + seconds
    solution = _Solution(problem, dict(choice), roots)
    method = "local" if _local_search(solution, deadline) else "greedy"
    other = _Solution(problem, choice | _original_choice(problem, ir_nodes), roots)
    other_moves = _local_search(other, deadline)
    if other.total < solution.total - 1e-15:
        solution, method = other, "local" if other_moves else "original"
    best = _chosen(solution)
    error = check_extraction(best, roots, data.children)
    assert error is None, error
    result = Extraction(best, solution.total, method)
    if ilp_max_nodes and sum(len(n) for n in problem.nodes.values()) <= ilp_max_nodes:
        ilp = solve_ilp(data, roots, cost, best, ilp_seconds)
        result.ilp_status = ilp.status
        if ilp.choice is not None and ilp.cost < result.cost - 1e-12:
            error = check_extraction(ilp.choice, roots, data.children)
            if error is None:
                result = Extraction(ilp.choice, ilp.cost, "ilp", ilp.status)
            else:
                result.ilp_status = f"rejected: {error}"
    return result


def _original_choice(problem: _Problem, ir_nodes: Sequence[tuple[int, ENode]]) -> dict[int, int]:
    """Each IR class's earliest IR node: the original program, acyclic by construction."""
    choice: dict[int, int] = {}
    for cls, node in ir_nodes:
        if cls not in choice and node in problem.nodes[cls]:
            choice[cls] = problem.nodes[cls].index(node)
    return choice


def _chosen(solution: _Solution) -> dict[int, ENode]:
    p = solution.p
    return {c: p.nodes[c][solution.choice[c]] for c in solution.needed()}


def check_extraction(
    choice: dict[int, ENode], roots: Sequence[int], children: Children = ENode.children
) -> str | None:
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
            if cls not in choice:
                return f"class {cls} is needed but has no node"
            state[cls] = 1
            stack.append((cls, True))
            for kid in set(children(choice[cls])):
                if state.get(kid) == 1:
                    return f"class {kid} depends on itself (a cycle)"
                if state.get(kid) != 2:
                    stack.append((kid, False))
    return None
