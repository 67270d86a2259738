"""Building IR graphs whose terms match a `Pattern`: random instances of a rule's left side.

One attempt samples top-down (each constructor's sampler proposes its attributes and the
types of its tensor arguments, from the type its result should have), builds bottom-up with
the `GraphBuilder` (which types every node with `Op.infer`, rejecting what does not fit),
then reads the terms back as egglog will see them and evaluates the rule's conditions.
Conditions that fail but name a variable (`(= axes (vec-of a))`, `(= s (shape x))`,
`(< (abs (- c 0.707)) 1e-6)`) are repaired: the variable is forced to the value the condition
wants and the attempt is made again, a few rounds at most.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from knopt.errors import InvalidGraphError
from knopt.ir.builder import GraphBuilder
from knopt.ir.dtype import DType
from knopt.ir.graph import Graph, Value
from knopt.ir.shape import Dim, sym
from knopt.opt.rebuild import DECODERS
from knopt.opt.terms import TermTables, graph_commands
from knopt.testing.arrays import random_array
from knopt.testing.choices import SeededChoices
from knopt.testing.evaluate import Evaluator, Unknown
from knopt.testing.pattern import LEAVES, Pattern
from knopt.testing.rulebook import Rulebook
from knopt.testing.sampler import DERIVED, SAMPLERS, Hint, Sampling
from knopt.testing.sexpr import Expr, Lit, Sym, head

CONSTANT_FACTS = frozenset({"folds", "coef"})  # a leaf in one of these is made a constant
_SAME_TYPE = frozenset({"BinaryOp", "Where"})  # operands of one shape (and mostly one dtype)
_INDEXED = {"Gather": 2, "Scatter": 3}  # ops with an index operand, and where their axis is
_DTYPES = frozenset({"F32", "F64", "F16", "I8", "I16", "I32", "I64", "U8", "BOOL"})
_TRIES = 16  # proposals drawn for an op whose operand is typed already, until one fits


SYMBOLIC = -1000  # what a repair sets a size to that must be symbolic (terms.py's sentinel)


class _Shim:
    """What `DECODERS` needs of a rebuilder: sizes are integers, negative ones symbolic."""

    def size(self, code: int) -> Dim:
        return code if code >= 0 else sym(f"n{-code}")

    def shape(self, codes: tuple[int, ...]) -> tuple[Dim, ...]:
        return tuple(self.size(c) for c in codes)


@dataclass
class Forced:
    """Values that repairs fixed for the next attempt."""

    values: dict[str, Any] = field(default_factory=dict)
    shapes: dict[str, tuple[Dim, ...]] = field(default_factory=dict)  # of leaves, maybe symbolic
    dtypes: dict[str, str] = field(default_factory=dict)


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


class _Attempt:
    def __init__(self, book: Rulebook, pattern: Pattern, seed: int, forced: Forced) -> None:
        self.book = book
        self.pattern = pattern
        self.sampling = Sampling(SeededChoices(seed))
        self.rng = np.random.default_rng(seed)
        self.forced = forced
        self.assign: dict[str, Any] = dict(forced.values)
        self.hints: dict[str, Hint] = {}
        self.attrs: dict[str, dict[int, Any]] = {}
        self.parts: dict[str, list[str]] = {}  # a Concat's parts, when its TVec is a variable
        self.values: dict[str, Value] = {}
        self.constants = {
            a.name
            for name, args in pattern.facts
            if name in CONSTANT_FACTS
            for a in args
            if isinstance(a, Sym)
        }
        for element, vector in _equations(pattern.guards, "vec-get"):
            if element in self.constants:  # (folds e) with (= e (vec-get parts i)): parts fold
                self.constants.add(vector)
        self.builder = GraphBuilder("instance")
        self.inputs = 0
        self._base = _base_facts(book)
        self._shape_of = {  # variables that name a leaf's shape: `(= s (shape x))`
            s: x for s, x in _equations(pattern.guards, "shape") if x not in pattern.bindings
        }

    # ---- structure ---------------------------------------------------------------------

    def tensor_args(self, var: str) -> Iterator[tuple[int, Any]]:
        call = self.pattern.bindings.get(var)
        if call is None:
            return
        signature = self.book.signatures[call.name]
        for i, (arg, sort) in enumerate(zip(call.args, signature.args, strict=True)):
            if sort in ("T", "TVec"):
                yield i, arg

    def children(self, var: str) -> list[str]:
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
        sorts = self.pattern.sorts
        tensors = {v for v, s in sorts.items() if s == "T"}
        used = {
            c for v in self.pattern.bindings if sorts.get(v) == "T" for c in self.children_names(v)
        }
        return sorted(tensors - used)

    def children_names(self, var: str) -> list[str]:
        names: list[str] = []
        for _, arg in self.tensor_args(var):
            if isinstance(arg, tuple):
                names.extend(a.name for a in arg)
            else:
                names.append(arg.name)
        return names

    # ---- sampling ----------------------------------------------------------------------

    def known(self, arg: Any) -> tuple[bool, Any]:
        if isinstance(arg, Sym):
            return (arg.name in self.assign), self.assign.get(arg.name)
        return True, arg

    def visit(self, var: str, hint: Hint) -> None:
        if var in self.hints:
            return
        if var in self.forced.dtypes:  # forced shapes are of leaves: `leaf` applies them
            hint = Hint(hint.shape, DType[self.forced.dtypes[var]], hint.bound)
        self.hints[var] = hint
        call = self.pattern.bindings.get(var)
        if call is None:
            return
        signature = self.book.signatures[call.name]
        derived = DERIVED.get(call.name, frozenset())
        fixed = {}
        for i, (arg, sort) in enumerate(zip(call.args, signature.args, strict=True)):
            if sort not in ("T", "TVec") and i not in derived:
                ok, value = self.known(arg)
                if ok:
                    fixed[i] = value
        attrs, child_hints = SAMPLERS[call.name](self.sampling, hint, fixed)
        for _ in range(_TRIES):  # an operand another root typed already: propose to fit it
            if self.fits(var, child_hints):
                break
            attrs, child_hints = SAMPLERS[call.name](self.sampling, hint, fixed)
        self.attrs[var] = attrs
        for i, value in attrs.items():
            arg = call.args[i]
            if isinstance(arg, Sym) and arg.name not in self.assign:
                self.assign[arg.name] = value
        for i, arg in self.tensor_args(var):
            wanted = child_hints.get(i)
            if wanted is None:
                continue
            if isinstance(wanted, list):
                names = (
                    [a.name for a in arg]
                    if isinstance(arg, tuple)
                    else self.parts.setdefault(
                        arg.name, [f"{arg.name}#{k}" for k in range(len(wanted))]
                    )
                )
                for name, part in zip(names, wanted, strict=False):
                    self.visit(name, part)
            else:
                self.visit(arg.name, wanted)

    def fits(self, var: str, child_hints: dict[int, Hint | list[Hint]]) -> bool:
        """Whether a proposal agrees with the operands of `var` that are typed already."""
        for i, arg in self.tensor_args(var):
            wanted = child_hints.get(i)
            if isinstance(wanted, Hint) and isinstance(arg, Sym):
                known = self.hints.get(arg.name)
                if known is not None and (known.shape, known.dtype) != (wanted.shape, wanted.dtype):
                    return False
        return True

    def below(self, var: str) -> set[str]:
        """`var` and every variable its bindings reach."""
        found: set[str] = set()
        stack = [var]
        while stack:
            current = stack.pop()
            if current not in found:
                found.add(current)
                stack.extend(self.children(current))
        return found

    def sample(self) -> None:
        """Propose types top-down from each root.

        Roots that share an operand (two matmuls of one input, as multi-pattern rules match)
        take the type of the first such root, so that their proposals can agree on it.
        """
        reached: list[tuple[set[str], Hint]] = []
        for root in self.roots():
            below = self.below(root)
            hint = next((h for seen, h in reached if seen & below), None)
            if hint is None:
                hint = Hint(self.sampling.shape(), self.sampling.dtype())
            reached.append((below, hint))
            self.visit(root, hint)

    # ---- building ----------------------------------------------------------------------

    def leaf(self, var: str) -> Value:
        hint = self.hints.get(var) or Hint(self.sampling.shape(), DType.F32)
        call = self.pattern.bindings.get(var)
        shape: tuple[Dim, ...] = hint.shape
        if var in self.hints:  # a sampled leaf takes the shape a repair forced, if any
            shape = self.forced.shapes.get(var, shape)
        dtype = hint.dtype
        if call is not None:
            attrs = self.attrs.get(var, {})
            shape, dtype = tuple(attrs.get(1, shape)), DType[attrs.get(2, dtype.name)]
        if hint.bound is not None:
            data = self.rng.integers(-hint.bound, hint.bound, _sizes(shape)).astype(dtype.numpy)
            return self.builder.constant(data)
        vector = var.split("#")[0]  # a Concat's part `xs#k` folds when `xs` does
        kind = (
            call.name
            if call is not None
            else ("Constant" if var in self.constants or vector in self.constants else "Input")
        )
        if kind == "Input":
            self.inputs += 1
            return self.builder.input(f"in{self.inputs}", shape, dtype)
        if kind == "Splat" or (kind == "Constant" and call is None and self.sampling.boolean(0.2)):
            value = self.attrs.get(var, {}).get(0, self.sampling.value())
            return self.builder.constant(np.full(_sizes(shape), value, dtype.numpy))
        return self.builder.constant(random_array(self.rng, _sizes(shape), dtype))

    def build(self, var: str) -> Value:
        """Build `var` and what it needs: operands that are not leaves first, then the leaves.

        The leaves come after the other operands because an elementwise op's leaves take the
        type of its built operands; the op comes last.
        """
        stack = [(var, 0)]
        while stack:
            current, stage = stack.pop()
            if current in self.values:
                continue
            call = self.pattern.bindings.get(current)
            if call is None or call.name in LEAVES:
                self.values[current] = self.leaf(current)
                continue
            kids = [k for k in self.children(current) if k not in self.values]
            if stage == 0:
                stack.append((current, 1))
                stack.extend((k, 0) for k in kids if not self.is_leaf(k))
            elif stage == 1:
                if call.name in _SAME_TYPE:
                    self.adapt_leaves(current, call.name)
                if call.name in _INDEXED:
                    self.bound_indices(current, call.name)
                stack.append((current, 2))
                stack.extend((k, 0) for k in kids)
            else:
                args = tuple(self.attrs.get(current, {}).get(i) for i in range(len(call.args)))
                op = DECODERS[call.name](_Shim(), args)
                inputs = [self.values[k] for k in self.children(current)]
                self.values[current] = self.builder.apply(op, inputs)
        return self.values[var]

    def is_leaf(self, var: str) -> bool:
        call = self.pattern.bindings.get(var)
        return call is None or call.name in LEAVES

    def bound_indices(self, var: str, name: str) -> None:
        """Keep a Gather's or Scatter's index leaf inside the axis of its built data."""
        kids = self.children(var)
        axis = self.attrs.get(var, {}).get(_INDEXED[name])
        if (
            kids[0] not in self.values
            or len(kids) < 2
            or kids[1] in self.values
            or not isinstance(axis, int)
            or not 0 <= axis < self.values[kids[0]].rank
        ):
            return
        size = _size(self.values[kids[0]].shape[axis])
        old = self.hints.get(kids[1])
        if old is not None:
            self.hints[kids[1]] = Hint(old.shape, old.dtype, bound=size)

    def adapt_leaves(self, var: str, name: str) -> None:
        """Give unbuilt leaf operands of an elementwise op the type of a built operand."""
        kids = self.children(var)
        built = [self.values[k] for k in kids if k in self.values]
        if not built:
            return
        model = built[-1]
        for index, kid in enumerate(kids):
            if kid in self.values or kid in self.forced.shapes or not self.is_leaf(kid):
                continue
            dtype = model.dtype
            if name == "Where" and index == 0:
                dtype = DType.BOOL
            elif name == "Where" and model.dtype is DType.BOOL and len(built) == 1:
                dtype = self.hints[kid].dtype if kid in self.hints else dtype
            shape = _sizes(model.shape)
            self.hints[kid] = Hint(
                shape, dtype, self.hints[kid].bound if kid in self.hints else None
            )
            call = self.pattern.bindings.get(kid)
            if call is not None:
                for position, value in ((1, shape), (2, dtype.name)):
                    arg = call.args[position]
                    if isinstance(arg, Sym) and arg.name not in self.forced.values:
                        self.assign[arg.name] = value
                        self.attrs.setdefault(kid, {})[position] = value

    def graph(self) -> Graph:
        for index, root in enumerate(self.roots()):
            self.builder.output(self.build(root), f"r{index}")
        return self.builder.build()

    # ---- checking ----------------------------------------------------------------------

    def check(self, graph: Graph) -> Forced | None:
        """Repairs for the next attempt (empty when the instance matches), None if hopeless."""
        tables = TermTables()
        terms = graph_commands(graph, tables).terms
        position = {id(node): i for i, node in enumerate(graph.nodes)}
        env: dict[str, Any] = dict(self.assign)
        seen: set[str] = set()
        repairs = Forced()
        for var, value in self.values.items():
            call = self.pattern.bindings.get(var)
            if call is None or id(value.producer) not in position:
                continue
            term = terms[position[id(value.producer)]]
            if term.name != call.name:
                return None  # a Constant that came out a Splat, or the other way round
            for i, arg in enumerate(call.args):
                actual = _decode(term.args[i])
                if actual is None or isinstance(arg, tuple):
                    continue
                if not isinstance(arg, Sym):
                    if actual != arg:
                        return None
                elif (
                    i in DERIVED.get(call.name, frozenset())
                    and arg.name in env
                    and env[arg.name] != actual
                ):
                    repairs.values[arg.name] = actual
                elif arg.name not in seen:
                    # What egglog will see (a 0.5 splat of an integer type is 0), not what
                    # was asked for.
                    env[arg.name] = actual
                    seen.add(arg.name)

        def codes(value: Value) -> tuple[tuple[int, ...], str]:
            return tuple(tables.dim(d) for d in value.shape), value.dtype.name

        evaluator = Evaluator(env, self.values, codes, self._base)
        facts: list[Expr] = [
            (Sym(name), *(a if isinstance(a, Sym) else Lit(a) for a in args))
            for name, args in self.pattern.facts
            if name in self._base and not any(isinstance(a, tuple) for a in args)
        ]
        pending = [*self.pattern.guards, *facts]
        while pending:  # conditions in any order: each pass evaluates what it can
            waiting = []
            for guard in pending:
                outcome = self._guard(guard, evaluator, env, repairs)
                if outcome is None:
                    waiting.append(guard)
                elif not outcome:
                    return None
            if len(waiting) == len(pending):
                break
            pending = waiting
        return repairs

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
                if isinstance(a, Sym) and a.name not in env and a.name not in self.values:
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
        return self._repair(guard, evaluator, repairs)

    def _repair(self, guard: tuple[Expr, ...], evaluator: Evaluator, repairs: Forced) -> bool:
        name = head(guard)
        try:
            if name == "=":
                for a, b in ((guard[1], guard[2]), (guard[2], guard[1])):
                    if (
                        head(a) in ("shape", "dtype")
                        and isinstance(a, tuple)
                        and isinstance(a[1], Sym)
                        and a[1].name not in self.pattern.bindings
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
            bound = _float_bound(guard, self.pattern.sorts)
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
        if isinstance(expr, Sym) and expr.name not in self.values:
            repairs.values[expr.name] = SYMBOLIC
            return True
        if not isinstance(expr, tuple) or not isinstance(expr[1], Sym):
            return False
        vector = expr[1].name
        if name == "numel" and vector not in self.values:
            value = evaluator.value(expr[1])
            repairs.values[vector] = (SYMBOLIC, *value[1:])
            return True
        leaf = self._shape_of.get(vector)
        if name == "vec-get" and leaf is not None and leaf in self.hints:
            index = evaluator.value(expr[2])
            shape: list[Dim] = list(self.forced.shapes.get(leaf, self.hints[leaf].shape))
            if 0 <= index < len(shape):
                shape[index] = sym("n1")
                repairs.shapes[leaf] = tuple(shape)
                return True
        return False

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
        row = self.sampling.choose(rows)
        for arg, value in zip(guard[1:], row, strict=True):
            if isinstance(arg, Sym) and arg.name not in self.values:
                repairs.values[arg.name] = value
            elif head(arg) == "dtype" and isinstance(arg, tuple) and isinstance(arg[1], Sym):
                repairs.dtypes[arg[1].name] = value
        return True

    def _solve(self, expr: Expr, target: Any, evaluator: Evaluator) -> tuple[str, Any] | None:
        """A variable of `expr` and the value that makes `expr` equal `target`, if simple."""
        if isinstance(expr, Sym):
            return None if expr.name in self.values else (expr.name, target)
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


def _equations(guards: Iterable[Expr], name: str) -> Iterator[tuple[str, str]]:
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


def _size(dim: Dim) -> int:
    """A size of a built value, as numpy needs it.

    Raises:
        InvalidGraphError: If it is symbolic (`instantiate` then draws again).
    """
    if not isinstance(dim, int):
        raise InvalidGraphError(f"size {dim} is symbolic")
    return dim


def _sizes(shape: Iterable[Dim]) -> tuple[int, ...]:
    """A shape as numpy needs it (see `_size`)."""
    return tuple(_size(d) for d in shape)


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


def _base_facts(book: Rulebook) -> dict[str, set[tuple[Any, ...]]]:
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


def instantiate(book: Rulebook, pattern: Pattern, seed: int, rounds: int = 5) -> Graph | None:
    """A graph whose outputs match the pattern's roots, or None if no attempt fitted."""
    forced = Forced()
    draw = seed * 101
    for _ in range(rounds):
        # The same draw after a repair (only the repaired values change), a new one after a
        # proposal that did not type-check.
        attempt = _Attempt(book, pattern, draw, forced)
        try:
            attempt.sample()
            graph = attempt.graph()
        except (InvalidGraphError, KeyError, IndexError, ValueError, TypeError):
            draw += 1
            continue
        repairs = attempt.check(graph)
        if repairs is None:
            return None
        if not (repairs.values or repairs.shapes or repairs.dtypes):
            return graph
        forced.values.update(repairs.values)
        forced.shapes.update(repairs.shapes)
        forced.dtypes.update(repairs.dtypes)
    return None
