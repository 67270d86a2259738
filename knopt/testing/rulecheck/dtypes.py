"""Element types a pattern fixes before the first attempt: one type per class of equal types.

Types are equal along elementwise ops, views and casts' targets, and where the conditions say
so (`(= (dtype q) (dtype z))`, `(= d (dtype q))`, `(= (dtype p) (U8))`); base facts over a type
(`(eight-bit d)`, `(four-bit d)`, `(code-range d lo hi)`) narrow a class to their rows. Each
class gets one type that meets all of them, and the tensors and type variables of the class
are forced to it: a proposal then types a nibble mask's operands alike, where repairing one
condition at a time would undo another.
"""

from __future__ import annotations

from typing import Any

from knopt.ir.dtype import DType
from knopt.testing.rulecheck.draft import Forced, vector_parts
from knopt.testing.rulecheck.pattern import Pattern
from knopt.testing.rulecheck.repair import DRAWN_DTYPES
from knopt.testing.rulecheck.rulebook import Rulebook
from knopt.testing.rulecheck.sampler import Sampling
from knopt.testing.rulecheck.sexpr import Expr, Sym, head

# Constructors whose result has the type of their first tensor operand.
_SAME_AS_OPERAND = frozenset({"View", "Broadcast", "Permute", "Slice", "Flip", "Pad", "Clamp"})
_TO_BOOL = frozenset(
    {"LESS", "GREATER", "EQUAL", "LESS_EQUAL", "GREATER_EQUAL", "IS_NAN", "IS_INF"}
)
_PRODUCTS = frozenset({"MatMul", "Conv"})  # float products: operands of the result's type
_TYPE_POSITION = {"Splat": 2, "Input": 2, "Constant": 2, "Cast": 1}  # where a leaf's type is


class _Classes:
    """Union-find over type keys: `("T", var)`, `("D", var)` and `("L", name)`."""

    def __init__(self) -> None:
        self.parent: dict[tuple[str, str], tuple[str, str]] = {}

    def find(self, key: tuple[str, str]) -> tuple[str, str]:
        self.parent.setdefault(key, key)
        while self.parent[key] != key:
            self.parent[key] = self.parent[self.parent[key]]
            key = self.parent[key]
        return key

    def union(self, a: tuple[str, str] | None, b: tuple[str, str] | None) -> None:
        if a is not None and b is not None:
            self.parent[self.find(a)] = self.find(b)


def _key(expr: Any, sorts: dict[str, str]) -> tuple[str, str] | None:
    """The type key of an argument or condition term, if it names a type."""
    if isinstance(expr, str) and expr in DType.__members__:
        return ("L", expr)
    if isinstance(expr, Sym) and sorts.get(expr.name) == "DType":
        return ("D", expr.name)
    if head(expr) == "dtype" and isinstance(expr, tuple) and isinstance(expr[1], Sym):
        return ("T", expr[1].name)
    if isinstance(expr, tuple) and len(expr) == 1 and head(expr) in DType.__members__:
        return ("L", str(head(expr)))  # a type written `(U8)` in a condition
    return None


def _classes(pattern: Pattern) -> _Classes:
    classes = _Classes()
    sorts = pattern.sorts
    parts = vector_parts(pattern)
    for var, call in pattern.bindings.items():
        mine = ("T", var)
        if call.name == "Concat":  # parts written out, or named one by one by conditions
            vector = call.args[0]
            names = [a.name for a in vector] if isinstance(vector, tuple) else []
            if isinstance(vector, Sym):
                names = parts.get(vector.name, [])
            for name in names:
                classes.union(mine, ("T", name))
        position = _TYPE_POSITION.get(call.name)
        if position is not None and position < len(call.args):
            classes.union(mine, _key(call.args[position], sorts))
        operands = [a for a in call.args if isinstance(a, Sym) and sorts.get(a.name) == "T"]
        if call.name in _SAME_AS_OPERAND and operands:
            classes.union(mine, ("T", operands[0].name))
        elif call.name in _PRODUCTS:
            for operand in operands[:2]:
                classes.union(mine, ("T", operand.name))
        elif call.name == "BinaryOp" and len(operands) == 2:
            classes.union(("T", operands[0].name), ("T", operands[1].name))
            if call.args[0] not in _TO_BOOL:
                classes.union(mine, ("T", operands[0].name))
        elif call.name == "UnaryOp" and operands and call.args[0] not in _TO_BOOL:
            classes.union(mine, ("T", operands[0].name))
    for guard in pattern.guards:
        if head(guard) == "=" and isinstance(guard, tuple):
            left, right = _key(guard[1], sorts), _key(guard[2], sorts)
            if left is not None and right is not None:
                classes.union(left, right)
    return classes


def _facts(book: Rulebook, pattern: Pattern) -> list[tuple[str, tuple[Expr, ...]]]:
    """The pattern's base-fact conditions (as facts or as guards), with their arguments."""
    found: list[tuple[str, tuple[Expr, ...]]] = [
        (name, tuple(args)) for name, args in pattern.facts if name in book.base_facts
    ]
    for guard in pattern.guards:
        name = head(guard)
        if name in book.base_facts and isinstance(guard, tuple):
            found.append((str(name), guard[1:]))
    return found


def forced_dtypes(
    book: Rulebook, pattern: Pattern, base: dict[str, set[tuple[Any, ...]]], sampling: Sampling
) -> Forced:
    """Types and type variables forced so that the pattern's type conditions hold together.

    Classes that no literal or base fact constrains are left to the proposals.
    """
    sorts = pattern.sorts
    classes = _classes(pattern)
    allowed: dict[tuple[str, str], set[str]] = {}
    for key in list(classes.parent):
        if key[0] == "L":
            allowed.setdefault(classes.find(key), set()).add(key[1])
    for name, args in _facts(book, pattern):
        rows = base.get(name, set())
        for position, arg in enumerate(args):
            named = _key(arg, sorts)
            if named is None:
                continue
            names = {
                str(row[position])
                for row in rows
                if position < len(row) and str(row[position]) in DRAWN_DTYPES
            }
            root = classes.find(named)
            allowed[root] = allowed[root] & names if root in allowed else names
    chosen = {
        root: DType[sampling.choose(sorted(names))] for root, names in allowed.items() if names
    }
    forced = Forced()
    for key in list(classes.parent):
        dtype = chosen.get(classes.find(key))
        if dtype is None:
            continue
        if key[0] == "T":
            forced.dtypes[key[1]] = dtype.name
        elif key[0] == "D":
            forced.values[key[1]] = dtype.name
    return forced
