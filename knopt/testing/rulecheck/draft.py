"""One attempt at an instance: the state its steps share, and the pattern's structure.

An attempt proposes types top-down (`build.Proposer`), builds the graph bottom-up
(`build.Builder`) and checks the rule's conditions on it (`repair.Checker`); each step reads
and extends the values, hints and attributes gathered here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from knopt.errors import InvalidGraphError
from knopt.ir.builder import GraphBuilder
from knopt.ir.graph import Value
from knopt.ir.shape import Dim
from knopt.testing.choices import SeededChoices
from knopt.testing.rulecheck.pattern import LEAVES, Pattern
from knopt.testing.rulecheck.rulebook import Rulebook
from knopt.testing.rulecheck.sampler import Hint, Sampling
from knopt.testing.rulecheck.sexpr import Expr, Lit, Sym, head

CONSTANT_FACTS = frozenset({"folds", "coef"})  # a leaf in one of these is made a constant


@dataclass
class Forced:
    """Values that repairs fixed for the next attempt."""

    values: dict[str, Any] = field(default_factory=dict)
    shapes: dict[str, tuple[Dim, ...]] = field(default_factory=dict)  # of leaves, maybe symbolic
    dtypes: dict[str, str] = field(default_factory=dict)

    def update(self, repairs: Forced) -> None:
        """Add `repairs`."""
        self.values.update(repairs.values)
        self.shapes.update(repairs.shapes)
        self.dtypes.update(repairs.dtypes)


class Draft:
    """The state of one attempt: assigned variables, type hints, attributes, built values.

    Args:
        book: The declarations and rules of the loaded rule files.
        pattern: The flattened query to instantiate.
        seed: Seed of the attempt's random choices and array contents.
        forced: Values that repairs fixed for this attempt.
    """

    def __init__(self, book: Rulebook, pattern: Pattern, seed: int, forced: Forced) -> None:
        self.book = book
        self.pattern = pattern
        self.sampling = Sampling(SeededChoices(seed))
        self.rng = np.random.default_rng(seed)
        self.forced = forced
        self.assign: dict[str, Any] = dict(forced.values)
        self.hints: dict[str, Hint] = {}
        self.attrs: dict[str, dict[int, Any]] = {}
        self.parts = vector_parts(pattern)  # a Concat's parts, when its TVec is a variable
        self.values: dict[str, Value] = {}
        self.constants = {
            a.name
            for name, args in pattern.facts
            if name in CONSTANT_FACTS
            for a in args
            if isinstance(a, Sym)
        }
        for element, vector in equations(pattern.guards, "vec-get"):
            if element in self.constants:  # (folds e) with (= e (vec-get parts i)): parts fold
                self.constants.add(vector)
        self.builder = GraphBuilder("instance")
        self.inputs = 0

    def tensor_args(self, var: str) -> Iterator[tuple[int, Any]]:
        """The positions and arguments of `var`'s tensor arguments (T or TVec)."""
        call = self.pattern.bindings.get(var)
        if call is None:
            return
        signature = self.book.signatures[call.name]
        for i, (arg, sort) in enumerate(zip(call.args, signature.args, strict=True)):
            if sort in ("T", "TVec"):
                yield i, arg

    def children(self, var: str) -> list[str]:
        """The variables of `var`'s operands, a variable vector's parts one by one."""
        found: list[str] = []
        for _, arg in self.tensor_args(var):
            if isinstance(arg, tuple):
                found.extend(a.name for a in arg)
            elif arg.name in self.parts:
                found.extend(self.parts[arg.name])
            else:
                found.append(arg.name)
        return found

    def roots(self) -> list[str]:
        """The tensor variables that are no other's operand: the instance's outputs."""
        sorts = self.pattern.sorts
        tensors = {v for v, s in sorts.items() if s == "T"}
        used = {c for v in self.pattern.bindings if sorts.get(v) == "T" for c in self.children(v)}
        return sorted(tensors - used)

    def is_leaf(self, var: str) -> bool:
        """Whether `var` is built as a leaf: an input or a constant."""
        call = self.pattern.bindings.get(var)
        return call is None or call.name in LEAVES


def vector_parts(pattern: Pattern) -> dict[str, list[str]]:
    """The parts of tensor vectors that conditions name one by one: `(= (vec-get xs 0) a)`.

    Only vectors whose every part up to the last named one is named are split so.
    """
    named: dict[str, dict[int, str]] = {}
    for guard in pattern.guards:
        if head(guard) != "=" or not isinstance(guard, tuple):
            continue
        for got, part in ((guard[1], guard[2]), (guard[2], guard[1])):
            if (
                head(got) == "vec-get"
                and isinstance(got, tuple)
                and isinstance(got[1], Sym)
                and pattern.sorts.get(got[1].name) == "TVec"
                and isinstance(got[2], Lit)
                and isinstance(got[2].value, int)
                and isinstance(part, Sym)
                and pattern.sorts.get(part.name) == "T"
            ):
                named.setdefault(got[1].name, {})[got[2].value] = part.name
    return {
        vector: [parts[i] for i in range(len(parts))]
        for vector, parts in named.items()
        if set(parts) == set(range(len(parts)))
    }


def equations(guards: Iterable[Expr], name: str) -> Iterator[tuple[str, str]]:
    """The variables `(v, x)` of each guard `(= v (name x ...))`."""
    for guard in guards:
        if head(guard) != "=" or not isinstance(guard, tuple):
            continue
        left, right = guard[1], guard[2]
        if (
            head(right) == name
            and isinstance(right, tuple)
            and isinstance(left, Sym)
            and isinstance(right[1], Sym)
        ):
            yield left.name, right[1].name


def size(dim: Dim) -> int:
    """A size of a built value, as numpy needs it.

    Raises:
        InvalidGraphError: If it is symbolic (`instantiate` then draws again).
    """
    if not isinstance(dim, int):
        raise InvalidGraphError(f"size {dim} is symbolic")
    return dim


def sizes(shape: Iterable[Dim]) -> tuple[int, ...]:
    """A shape as numpy needs it (see `size`)."""
    return tuple(size(d) for d in shape)
