"""Repairing an instance whose conditions fail: which variable to force, to what.

A condition that fails but names a variable (`(= axes (vec-of a))`, `(= s (shape x))`,
`(< (abs (- c 0.707)) 1e-6)`, `(< n 0)`, a base fact such as `(is-float d)`) is repaired: the
variable is forced to the value the condition wants, and the attempt is made again.
"""

from __future__ import annotations

import math
from typing import Any

from knopt.ir.dtype import DType
from knopt.ir.shape import Dim, sym
from knopt.testing.rulecheck.draft import Draft, Forced, equations
from knopt.testing.rulecheck.evaluate import Evaluator, Unknown
from knopt.testing.rulecheck.rulebook import Rulebook
from knopt.testing.rulecheck.sexpr import Expr, Lit, Sym, head

_DTYPES = frozenset({"F32", "F64", "F16", "I8", "I16", "I32", "I64", "U8", "U16", "BOOL"})
SYMBOLIC = -1000  # what a repair sets a size to that must be symbolic (terms.py's sentinel)


class Repairer:
    """Finds, for a failed condition, the forced value that would make it hold."""

    def __init__(self, draft: Draft, base: dict[str, set[tuple[Any, ...]]]) -> None:
        self.draft = draft
        self._base = base
        self._shape_of = {  # variables that name a leaf's shape: `(= s (shape x))`
            s: x
            for s, x in equations(draft.pattern.guards, "shape")
            if x not in draft.pattern.bindings
        }

    def repair(self, guard: tuple[Expr, ...], evaluator: Evaluator, repairs: Forced) -> bool:
        """Record in `repairs` what would make a failed condition hold; False if nothing would."""
        name = head(guard)
        try:
            if name == "=":
                for a, b in ((guard[1], guard[2]), (guard[2], guard[1])):
                    if (
                        head(a) in ("shape", "dtype")
                        and isinstance(a, tuple)
                        and isinstance(a[1], Sym)
                        and a[1].name not in self.draft.pattern.bindings
                    ):
                        target = repairs.shapes if head(a) == "shape" else repairs.dtypes
                        target[a[1].name] = evaluator.value(b)
                        return True
                    solved = self._solve(a, evaluator.value(b), evaluator)
                    if solved is not None:
                        repairs.values[solved[0]] = solved[1]
                        return True
            if name in self._base:
                return self._pick_row(guard, evaluator, repairs)
            bound = _float_bound(guard, self.draft.pattern.sorts)
            if bound is not None:
                repairs.values[bound[0]] = bound[1]
                return True
            if (
                name in ("<", "<=")
                and isinstance(guard[2], Lit)
                and not isinstance(guard[2].value, str)
                and guard[2].value <= 0
            ):
                return self._make_symbolic(guard[1], evaluator, repairs)
            if name in (">", ">=") and head(guard[1]) == "numel" and isinstance(guard[2], Lit):
                return self._make_large(guard[1], guard[2].value, evaluator, repairs)
            close = _closeness(guard)
            if close is not None:
                solved = self._solve(close[0], evaluator.value(close[1]), evaluator)
                if solved is not None:
                    repairs.values[solved[0]] = solved[1]
                    return True
        except Unknown:
            return False
        return False

    def _make_symbolic(self, expr: Expr, evaluator: Evaluator, repairs: Forced) -> bool:
        """Repair `(< E 0)` by making a size symbolic (sizes are negative only when symbolic).

        The size is a size variable, a size of a leaf's shape or one of a `Sizes`.
        """
        name = head(expr)
        if isinstance(expr, Sym) and expr.name not in self.draft.values:
            repairs.values[expr.name] = SYMBOLIC
            return True
        if not isinstance(expr, tuple) or not isinstance(expr[1], Sym):
            return False
        vector = expr[1].name
        if name == "numel" and vector not in self.draft.values:
            value = evaluator.value(expr[1])
            repairs.values[vector] = (SYMBOLIC, *value[1:])
            return True
        leaf = self._shape_of.get(vector)
        if name == "vec-get" and leaf is not None and leaf in self.draft.hints:
            index = evaluator.value(expr[2])
            default = self.draft.hints[leaf].shape
            shape: list[Dim] = list(self.draft.forced.shapes.get(leaf, default))
            if 0 <= index < len(shape):
                shape[index] = sym("n1")
                repairs.shapes[leaf] = tuple(shape)
                return True
        return False

    def _make_large(self, expr: Expr, bound: Any, evaluator: Evaluator, repairs: Forced) -> bool:
        """Repair `(> (numel v) N)` by making the first size of the shape variable v large enough.

        Only shapes of rank 2 or more: a vector of one size may be what a `Sizes` holds, whose
        values would become a million sizes.
        """
        if not isinstance(expr, tuple) or not isinstance(expr[1], Sym):
            return False
        vector = expr[1].name
        value = evaluator.value(expr[1])
        if vector in self.draft.values or len(value) < 2 or not isinstance(bound, int):
            return False
        rest = math.prod(value[1:])
        if rest <= 0:
            return False
        repairs.values[vector] = (bound // rest + 1, *value[1:])
        return True

    def _pick_row(self, guard: tuple[Expr, ...], evaluator: Evaluator, repairs: Forced) -> bool:
        """Force a base-fact relation's variables to a random row that fits the known ones."""
        known: list[Any] = []
        for arg in guard[1:]:
            try:
                known.append(evaluator.value(arg))
            except Unknown:
                known.append(None)
        rows = [
            r
            for r in sorted(self._base[str(guard[0])], key=repr)
            if all(
                isinstance(a, Sym) or k is None or k == v
                for a, k, v in zip(guard[1:], known, r, strict=True)
            )
            and all(not isinstance(v, str) or v not in DType.__members__ or v in _DTYPES for v in r)
        ]
        if not rows:
            return False
        row = self.draft.sampling.choose(rows)
        for arg, value in zip(guard[1:], row, strict=True):
            if isinstance(arg, Sym) and arg.name not in self.draft.values:
                repairs.values[arg.name] = value
            elif head(arg) == "dtype" and isinstance(arg, tuple) and isinstance(arg[1], Sym):
                repairs.dtypes[arg[1].name] = value
        return True

    def _solve(self, expr: Expr, target: Any, evaluator: Evaluator) -> tuple[str, Any] | None:
        """A variable of `expr` and the value that makes `expr` equal `target`, if simple."""
        if isinstance(expr, Sym):
            return None if expr.name in self.draft.values else (expr.name, target)
        name = head(expr)
        if not isinstance(expr, tuple) or name not in ("*", "+", "-", "/", "to-f64"):
            return None
        if name == "to-f64":
            return self._solve(expr[1], round(target), evaluator)
        a, b = expr[1], expr[2]
        for unknown, known, first in ((a, b, True), (b, a, False)):
            try:
                k = evaluator.value(known)
            except Unknown:
                continue
            if name == "+":
                return self._solve(unknown, target - k, evaluator)
            if name == "-":
                return self._solve(unknown, target + k if first else k - target, evaluator)
            if name == "*" and k:
                return self._solve(unknown, target / k, evaluator)
            if name == "/" and first:
                return self._solve(unknown, target * k, evaluator)
        return None


def _float_bound(guard: tuple[Expr, ...], sorts: dict[str, str]) -> tuple[str, float] | None:
    """`(<= v K)` and the like over an f64 variable v: v and a value that meets the bound."""
    name = head(guard)
    if name not in ("<", "<=", ">", ">=") or len(guard) != 3:
        return None
    var, limit = guard[1], guard[2]
    if not isinstance(var, Sym) or sorts.get(var.name) != "f64" or not isinstance(limit, Lit):
        return None
    if not isinstance(limit.value, float):
        return None
    if name == "<":
        return var.name, math.nextafter(limit.value, -math.inf)
    if name == ">":
        return var.name, math.nextafter(limit.value, math.inf)
    return var.name, limit.value


def _closeness(guard: tuple[Expr, ...]) -> tuple[Expr, Expr] | None:
    """`(< (abs (- E K)) eps)` as (E, K), or None."""
    if head(guard) != "<" or head(guard[1]) != "abs":
        return None
    inner = guard[1][1]  # type: ignore[index]
    if head(inner) == "-" and isinstance(inner, tuple):
        return inner[1], inner[2]
    return None


_BASE_CACHE: dict[int, dict[str, set[tuple[Any, ...]]]] = {}


def base_facts(book: Rulebook) -> dict[str, set[tuple[Any, ...]]]:
    """The base-fact-only relations as sets of value rows."""
    if id(book) not in _BASE_CACHE:
        evaluator = Evaluator({}, {}, lambda v: ((), ""), {})
        producers = {a for r in book.rules for a in (head(x) for x in r.actions) if a}
        _BASE_CACHE[id(book)] = {
            name: {tuple(evaluator.value(e) for e in row) for row in rows}
            for name, rows in book.base_facts.items()
            if name not in producers
        }
    return _BASE_CACHE[id(book)]
