"""Checking an instance against the rule's conditions, as egglog will see the instance.

The built graph is read back as egglog will see it (a 0.5 splat of an integer type is 0), and
the conditions are evaluated in any order, each pass what it can; what fails is handed to
`repair.Repairer`, which says which variable to force for the next attempt.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from knopt.ir.graph import Graph, Value
from knopt.ir.shape import Dim
from knopt.opt.terms import TermTables, graph_commands
from knopt.testing.rulecheck.draft import Draft, Forced
from knopt.testing.rulecheck.evaluate import Evaluator, Unknown
from knopt.testing.rulecheck.repair import Repairer, base_facts
from knopt.testing.rulecheck.sampler import DERIVED
from knopt.testing.rulecheck.sexpr import Expr, Lit, Sym, head


def _literal(expr: Any) -> Any:
    value = expr.value
    return getattr(value, "value", value)  # knopt's literals, or the egglog bindings' ones


def _decode(expr: Any) -> Any:
    """An attribute of an encoded term as a Python value (tensor arguments give None)."""
    if type(expr).__name__ == "Lit":
        return _literal(expr)
    if expr.name in ("vec-of", "vec-empty") and all(type(a).__name__ == "Lit" for a in expr.args):
        return tuple(_literal(a) for a in expr.args)
    if not expr.args and expr.name != "vec-empty":
        return expr.name
    return None


class Checker:
    """Checks a built instance against the pattern's conditions and proposes repairs."""

    def __init__(self, draft: Draft) -> None:
        self.draft = draft
        self._base = base_facts(draft.book)
        self._repairer = Repairer(draft, self._base)

    def check(self, graph: Graph) -> Forced | None:
        """Repairs for the next attempt (empty when the instance matches), None if hopeless."""
        tables = TermTables()
        repairs = Forced()
        env = self._read_back(graph, tables, repairs)
        if env is None:
            return None

        def codes(value: Value) -> tuple[tuple[int, ...], str]:
            shape = reshaped.get(id(value), value.shape)
            return tuple(tables.dim(d) for d in shape), value.dtype.name

        reshaped: dict[int, tuple[Dim, ...]] = {}
        if not self._evaluate(dict(env), codes, repairs):
            return None
        if self._repairer.reshaped:
            # The values were computed from the old shapes: compute them from the new ones.
            repairs.values.clear()
            reshaped.update(
                (id(self.draft.values[leaf]), shape)
                for leaf, shape in repairs.shapes.items()
                if leaf in self.draft.values
            )
            self._repairer.reshaped = False
            again = Forced(shapes=dict(repairs.shapes), dtypes=dict(repairs.dtypes))
            if self._evaluate(dict(env), codes, again) and not self._repairer.reshaped:
                repairs.values.update(again.values)
                repairs.shapes.update(again.shapes)
                repairs.dtypes.update(again.dtypes)
        return repairs

    def _evaluate(
        self,
        env: dict[str, Any],
        codes: Callable[[Value], tuple[tuple[int, ...], str]],
        repairs: Forced,
    ) -> bool:
        """Evaluate the conditions, recording repairs; False if one cannot hold."""
        evaluator = Evaluator(env, self.draft.values, codes, self._base)
        facts: list[Expr] = [
            (Sym(name), *(a if isinstance(a, Sym) else Lit(a) for a in args))
            for name, args in self.draft.pattern.facts
            if name in self._base and not any(isinstance(a, tuple) for a in args)
        ]
        pending = [*self.draft.pattern.guards, *facts]
        while pending:  # conditions in any order: each pass evaluates what it can
            waiting = []
            for guard in pending:
                outcome = self._guard(guard, evaluator, env, repairs)
                if outcome is None:
                    waiting.append(guard)
                elif not outcome:
                    return False
            if len(waiting) == len(pending):
                break
            pending = waiting
        return True

    def _read_back(
        self, graph: Graph, tables: TermTables, repairs: Forced
    ) -> dict[str, Any] | None:
        """Each variable's value as egglog will see it, or None if a term came out otherwise.

        Derived attributes (result shapes) that differ from what was assigned are repaired.
        """
        terms = graph_commands(graph, tables).terms
        position = {id(node): i for i, node in enumerate(graph.nodes)}
        env: dict[str, Any] = dict(self.draft.assign)
        seen: set[str] = set()
        for var, value in self.draft.values.items():
            call = self.draft.pattern.bindings.get(var)
            if call is None or id(value.producer) not in position:
                continue
            term = terms[position[id(value.producer)]]
            if term.name != call.name:
                return None  # a Constant that came out a Splat, or the other way round
            derived = DERIVED.get(call.name, frozenset())
            for i, arg in enumerate(call.args):
                actual = _decode(term.args[i])
                if actual is None or isinstance(arg, tuple):
                    continue
                if not isinstance(arg, Sym):
                    if actual != arg:
                        return None
                elif i in derived and arg.name in env and env[arg.name] != actual:
                    repairs.values[arg.name] = actual
                elif arg.name not in seen:
                    # What egglog will see (a 0.5 splat of an integer type is 0), not what
                    # was asked for.
                    env[arg.name] = actual
                    seen.add(arg.name)
        return env

    def _guard(
        self, guard: Expr, evaluator: Evaluator, env: dict[str, Any], repairs: Forced
    ) -> bool | None:
        """Check one condition, defining or repairing what it names.

        Returns False if it cannot hold, None if Python cannot evaluate it (yet).
        """
        name = head(guard)
        assert isinstance(guard, tuple)
        if name == "=":
            left, right = guard[1], guard[2]
            for a, b in ((left, right), (right, left)):
                if isinstance(a, Sym) and a.name not in env and a.name not in self.draft.values:
                    try:
                        env[a.name] = evaluator.value(b)
                    except Unknown:
                        return None
                    return True
        try:
            if evaluator.holds(guard):
                return True
        except Unknown:
            return None
        repaired = self._repairer.repair(guard, evaluator, repairs)
        env.update(repairs.values)  # the conditions that follow read the repaired values
        return repaired
