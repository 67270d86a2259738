"""Evaluating a rule's primitive conditions in Python, on the values of an instance's variables.

That way an instance can be repaired before egglog sees it.

Only what Python knows is evaluated: arithmetic, comparisons, vectors, the `shape` and
`dtype` of built tensors and relations that hold base facts only (`is-float`...). Anything
else (`numel`, `body-size`, relations the analyses compute) raises `Unknown`, and egglog
decides.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

from knopt.ir.graph import Value
from knopt.testing.rulecheck.sexpr import Expr, Lit, Sym, head


class Unknown(Exception):
    """The expression needs something Python does not know."""


def _vec_set(v: tuple[Any, ...], i: int, x: Any) -> tuple[Any, ...]:
    if not 0 <= i < len(v):
        raise Unknown(f"vec-set index {i} out of range")
    return (*v[:i], x, *v[i + 1 :])


def _vec_get(v: tuple[Any, ...], i: int) -> Any:
    if not 0 <= i < len(v):
        raise Unknown(f"vec-get index {i} out of range")
    return v[i]


def _divide(a: Any, b: Any) -> Any:
    if b == 0:
        raise Unknown("division by zero")
    if isinstance(a, int) and isinstance(b, int):
        return int(a / b)
    return a / b


def _numel_from(shape: tuple[int, ...], start: int = 0) -> int:
    rest = shape[start:]
    return -1 if any(d < 0 for d in rest) else math.prod(rest)


_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "numel": _numel_from,  # typing.egg's analyses, written out: -1 for symbolic sizes
    "numel-from": _numel_from,
    "+": operator.add,
    "-": lambda a, b=None: -a if b is None else a - b,
    "*": operator.mul,
    "/": _divide,
    "%": operator.mod,
    "^": lambda a, b: math.pow(a, b) if a >= 0 or float(b).is_integer() else math.nan,
    "abs": abs,
    "neg": operator.neg,
    "max": max,
    "min": min,
    "to-f64": float,
    "to-i64": int,
    "vec-of": lambda *xs: tuple(xs),
    "vec-empty": lambda: (),
    "vec-length": len,
    "vec-get": _vec_get,
    "vec-set": _vec_set,
    "vec-push": lambda v, x: (*v, x),
    "vec-range": lambda n: tuple(range(n)),
}
_PREDICATES: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt,
    ">": operator.gt,
    "<=": operator.le,
    ">=": operator.ge,
    "=": operator.eq,
    "!=": operator.ne,
}


class Evaluator:
    """Evaluates expressions over an instance's variables.

    Args:
        values: Each attribute variable's value.
        tensors: Each tensor variable's IR value.
        codes: A tensor's `shape` and `dtype` as egglog sees them.
        base_facts: Rows of the relations that hold base facts only.
    """

    def __init__(
        self,
        values: Mapping[str, Any],
        tensors: Mapping[str, Value],
        codes: Callable[[Value], tuple[tuple[int, ...], str]],
        base_facts: Mapping[str, set[tuple[Any, ...]]],
    ) -> None:
        self.values = values
        self.tensors = tensors
        self.codes = codes
        self.base_facts = base_facts

    def value(self, expr: Expr) -> Any:
        """The value of an expression.

        Raises:
            Unknown: If it needs something Python does not know.
        """
        if isinstance(expr, Lit):
            return expr.value
        if isinstance(expr, Sym):
            if expr.name in self.values:
                return self.values[expr.name]
            if expr.name in self.tensors:
                return self.tensors[expr.name]
            raise Unknown(f"variable {expr.name} has no value")
        name = head(expr)
        assert isinstance(expr, tuple)
        if len(expr) == 1 and name is not None and name not in _FUNCTIONS:
            return name  # an enum member
        if name in ("shape", "dtype"):
            tensor = self.value(expr[1])
            if not isinstance(tensor, Value):
                raise Unknown(f"({name} ...) of something that is not a built tensor")
            shape, dtype = self.codes(tensor)
            return shape if name == "shape" else dtype
        if name in _FUNCTIONS:
            args = [self.value(e) for e in expr[1:]]
            try:
                return _FUNCTIONS[name](*args)
            except (TypeError, ValueError, OverflowError) as err:
                raise Unknown(f"({name} ...) failed: {err}") from err
        raise Unknown(f"({name} ...) is computed by egglog")

    def holds(self, expr: Expr) -> bool:
        """Whether a condition holds.

        Raises:
            Unknown: If it needs something Python does not know.
        """
        name = head(expr)
        assert isinstance(expr, tuple)
        if name in _PREDICATES:
            a, b = (self.value(e) for e in expr[1:])
            if isinstance(a, Value) or isinstance(b, Value):
                same = a is b
                return same if name == "=" else not same if name == "!=" else _raise()
            return _PREDICATES[name](a, b)
        if name is not None and name in self.base_facts:
            return tuple(self.value(e) for e in expr[1:]) in self.base_facts[name]
        raise Unknown(f"({name} ...) is computed by egglog")


def _raise() -> bool:
    raise Unknown("tensors compare only for equality")
