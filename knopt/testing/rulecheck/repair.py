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

DRAWN_DTYPES = frozenset(  # the types a repair may pick (no float8 nor float4)
    {"F32", "F64", "F16", "I8", "I16", "I32", "I64", "U8", "U16", "BOOL", "U4", "I4"}
)
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
        attributes = {
            a.name
            for call in draft.pattern.bindings.values()
            for a in call.args
            if isinstance(a, Sym)
        }
        self._aliases = {  # shape variables that name nothing else: solved, they reshape a leaf
            s: x for s, x in self._shape_of.items() if s not in attributes
        }
        self._sizes: list[Dim] = []  # the leading sizes of leaves given a rank
        self.reshaped = False  # a leaf's shape was repaired: values read from it are stale
        self._defined = {  # what conditions `(= v E)` define variables as
            g[1].name: g[2]
            for g in draft.pattern.guards
            if head(g) == "=" and isinstance(g, tuple) and isinstance(g[1], Sym)
        }

    def repair(self, guard: tuple[Expr, ...], evaluator: Evaluator, repairs: Forced) -> bool:
        """Record in `repairs` what would make a failed condition hold; False if nothing would."""
        name = head(guard)
        try:
            if name == "=":
                sides = ((guard[1], guard[2]), (guard[2], guard[1]))
                for a, b in sorted(sides, key=lambda side: self._forced_already(side[0])):
                    if (
                        head(a) in ("shape", "dtype")
                        and isinstance(a, tuple)
                        and isinstance(a[1], Sym)
                        and a[1].name not in self.draft.pattern.bindings
                    ):
                        target = repairs.shapes if head(a) == "shape" else repairs.dtypes
                        target[a[1].name] = evaluator.value(b)
                        return True
                    if self._rank(a, evaluator.value(b), repairs):
                        return True
                    solved = self._solve(a, evaluator.value(b), evaluator)
                    if solved is not None and solved[0] in self._aliases:
                        if not _is_shape(solved[1]):
                            continue
                        self._reshape(self._aliases[solved[0]], solved[1], repairs)
                        return True
                    if solved is not None:
                        repairs.values[solved[0]] = solved[1]
                        self._pin(b, repairs)
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

    def _forced_already(self, expr: Expr) -> bool:
        """Whether `expr` is a variable an earlier repair forced.

        The other side is solved first: forcing it back would undo that repair.
        """
        return isinstance(expr, Sym) and expr.name in self.draft.forced.values

    def _leaf_shaped(self, expr: Expr) -> str | None:
        """The leaf whose shape `expr` is: `s` of `(= s (shape x))`, or `(shape x)`."""
        if isinstance(expr, Sym):
            return self._shape_of.get(expr.name)
        if head(expr) == "shape" and isinstance(expr, tuple) and isinstance(expr[1], Sym):
            leaf = expr[1].name
            return leaf if leaf not in self.draft.pattern.bindings else None
        return None

    def _rank(self, expr: Expr, rank: Any, repairs: Forced) -> bool:
        """Repair `(= N (vec-length s))`, s a leaf's shape, by giving the leaf rank N."""
        if head(expr) != "vec-length" or not isinstance(expr, tuple) or not isinstance(rank, int):
            return False
        leaf = self._leaf_shaped(expr[1])
        if leaf is None or leaf not in self.draft.values or not 0 <= rank <= 6:
            return False
        if not self._sizes:  # leaves given a rank share leading sizes, as operands do
            for other in self._shape_of.values():
                shape = list(self.draft.values[other].shape) if other in self.draft.values else []
                self._sizes = shape if len(shape) > len(self._sizes) else self._sizes
        while len(self._sizes) < rank:
            self._sizes.append(self.draft.sampling.dim())
        self._reshape(leaf, tuple(self._sizes[:rank]), repairs)
        return True

    def _reshape(self, leaf: str, shape: tuple[Dim, ...], repairs: Forced) -> None:
        """Force a leaf's shape; the values computed from its old shape are stale now."""
        repairs.shapes[leaf] = shape
        self.reshaped = True

    def _pin(self, expr: Expr, repairs: Forced) -> None:
        """Keep the shapes of the leaves that `expr` reads as they are.

        A value computed from them was forced, and a new proposal of theirs would not fit it.
        """
        stack, seen = [expr], set()
        while stack:
            current = stack.pop()
            leaf = self._leaf_shaped(current)
            if leaf is not None and leaf in self.draft.values:
                shape = self.draft.values[leaf].shape
                if all(isinstance(d, int) for d in shape):
                    repairs.shapes.setdefault(leaf, shape)
            if isinstance(current, Sym) and current.name not in seen:
                seen.add(current.name)
                if current.name in self._defined:
                    stack.append(self._defined[current.name])
            elif isinstance(current, tuple):
                stack.extend(current[1:])

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
            and all(
                not isinstance(v, str) or v not in DType.__members__ or v in DRAWN_DTYPES for v in r
            )
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
        if not isinstance(expr, tuple) or name not in ("*", "+", "-", "/", "to-f64", "vec-get"):
            return None
        if name == "vec-get":  # one element of a vector: the vector with that element set
            vector, index = expr[1], evaluator.value(expr[2])
            value = evaluator.value(vector)
            if not isinstance(value, tuple) or not 0 <= index < len(value):
                return None
            changed = _with_element(value, index, target)
            return None if changed is None else self._solve(vector, changed, evaluator)
        if name == "to-f64":
            return self._solve(expr[1], round(target), evaluator)
        a, b = expr[1], expr[2]
        for unknown, known, first in ((a, b, True), (b, a, False)):
            try:
                k = evaluator.value(known)
            except Unknown:
                continue
            wanted = _inverse(name, target, k, first)
            solved = None if wanted is None else self._solve(unknown, wanted, evaluator)
            if solved is not None:  # else the other operand may be the variable
                return solved
        return None


def _is_shape(value: Any) -> bool:
    """Whether `value` can be a leaf's static shape: positive integer sizes."""
    return isinstance(value, tuple) and all(isinstance(d, int) and d >= 1 for d in value)


def _with_element(vector: tuple[Any, ...], index: int, value: Any) -> tuple[Any, ...] | None:
    """`vector` with `value` at `index`; None for a permutation.

    The sizes a permutation moved would no longer fit: drawing again does better.
    """
    if sorted(vector) == list(range(len(vector))):
        return None
    return (*vector[:index], value, *vector[index + 1 :])


def _inverse(name: str | None, target: Any, k: Any, first: bool) -> Any:
    """The operand `x` with `x op k` (or `k op x`, not `first`) equal to `target`, or None.

    Integers stay integers: a size times 2 is 16 for a size of 8, and for no size 17/2.
    """
    if name == "+":
        return target - k
    if name == "-":
        return target + k if first else k - target
    if name == "*" and k:
        if isinstance(target, int) and isinstance(k, int):
            return target // k if target % k == 0 else None
        return target / k
    if name == "/" and first:
        return target * k
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
