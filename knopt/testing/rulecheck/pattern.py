"""A rule's query as something to build: tensor terms to construct, conditions to meet.

`flatten` splits query atoms (after `unfold.unfold` has explained the derived ones) into
constructor bindings (`var -> Call`), relation facts left for egglog, and primitive conditions
(`guards`) that Python can evaluate and repair. `merge` resolves equalities first, and says
when two terms clash.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from knopt.opt.terms import DECODERS
from knopt.testing.rulecheck.rulebook import Rulebook
from knopt.testing.rulecheck.sexpr import Expr, Lit, Sym, head

SATURATED = frozenset({"analysis", "fold"})  # rulesets whose facts an instance has or lacks
# Built as leaves: inputs, constants, and opaque ops (built without inputs: rules see none).
LEAVES = frozenset({"Input", "Constant", "Splat", "Opaque"})
IR_CONSTRUCTORS = frozenset(DECODERS) | LEAVES
PRIMITIVE_CALLS = frozenset({"vec-of", "vec-empty"})


@dataclass(frozen=True)
class Call:
    """A constructor applied to arguments: variables (`Sym`), values, or tuples of variables."""

    name: str
    args: tuple[Any, ...]


@dataclass
class Pattern:
    """A flattened query.

    Attributes:
        bindings: Each bound variable's constructor term (tensor and scalar-body sorts).
        facts: Relation atoms left for egglog, with flattened arguments.
        guards: Primitive conditions and function lookups, as expressions over variables.
        sorts: Each variable's sort.
        deps: The rules `unfold` used (they must run before the checked rule).
    """

    bindings: dict[str, Call] = field(default_factory=dict)
    facts: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)
    guards: list[Expr] = field(default_factory=list)
    sorts: dict[str, str] = field(default_factory=dict)
    deps: set[str] = field(default_factory=set)


def substitute(expr: Expr, subst: dict[str, Expr]) -> Expr:
    """`expr` with variables replaced by `subst` (transitively)."""
    if isinstance(expr, Sym):
        seen = 0
        while isinstance(expr, Sym) and expr.name in subst and seen < 50:
            expr = subst[expr.name]
            seen += 1
        return expr if isinstance(expr, Sym) else substitute(expr, subst)
    if isinstance(expr, tuple) and expr:
        return (expr[0], *(substitute(e, subst) for e in expr[1:]))
    return expr


# ---- flattening ------------------------------------------------------------------------------


def merge(book: Rulebook, atoms: list[Expr]) -> list[Expr] | None:
    """Resolve equalities between variables and between terms; None if two terms clash.

    `(= a b)` of two variables makes them one; a variable bound to two terms of the same
    constructor makes their arguments equal; different constructors (or literals) clash.
    """
    subst: dict[str, Expr] = {}
    bound: dict[str, Expr] = {}
    rest: list[Expr] = []
    queue = list(atoms)
    while queue:
        atom = substitute(queue.pop(0), subst)
        if head(atom) != "=" or not isinstance(atom, tuple):
            rest.append(atom)
            continue
        a, b = atom[1], atom[2]
        if isinstance(b, Sym) and not isinstance(a, Sym):
            a, b = b, a
        if isinstance(a, Sym) and isinstance(b, Sym):
            if a != b:
                subst[b.name] = a
                if b.name in bound:  # both were bound: their terms must agree too
                    queue.append((Sym("="), a, bound.pop(b.name)))
            continue
        if isinstance(a, Lit) and isinstance(b, Lit):
            if a != b:
                return None
            continue
        if isinstance(a, Sym) and _is_term(book, b) and not _is_op(b):
            rest.append(atom)  # a kernel term or a scalar body: a class may hold several
            continue
        if isinstance(a, Sym) and _is_term(book, b):
            if a.name not in bound:
                bound[a.name] = b
                rest.append(atom)
                continue
            a = substitute(bound[a.name], subst)
        if _is_term(book, a) and _is_term(book, b):
            assert isinstance(a, tuple) and isinstance(b, tuple)
            if head(a) != head(b) or len(a) != len(b):
                return None
            queue.extend((Sym("="), x, y) for x, y in zip(a[1:], b[1:], strict=True) if x != y)
            continue
        rest.append(atom)
    return [substitute(a, subst) for a in rest]


def _is_op(expr: Expr) -> bool:
    return head(expr) in IR_CONSTRUCTORS


def _is_term(book: Rulebook, expr: Expr) -> bool:
    signature = book.signatures.get(head(expr) or "")
    return signature is not None and signature.kind == "constructor"


class _Flattener:
    def __init__(self, book: Rulebook, pattern: Pattern) -> None:
        self.book = book
        self.pattern = pattern
        self.fresh = itertools.count()

    def var(self, sort: str) -> Sym:
        name = f"_t{next(self.fresh)}"
        self.pattern.sorts[name] = sort
        return Sym(name)

    def bind(self, name: str, expr: tuple[Expr, ...]) -> None:
        signature = self.book.signatures[str(expr[0])]
        args = tuple(self.arg(e, s) for e, s in zip(expr[1:], signature.args, strict=True))
        call = Call(str(expr[0]), args)
        self.pattern.sorts[name] = signature.out
        self.pattern.bindings[name] = call

    def arg(self, expr: Expr, sort: str) -> Any:
        """An argument at a position of `sort`: a variable, a value, or a tuple of variables."""
        if isinstance(expr, Sym):
            self.pattern.sorts.setdefault(expr.name, sort)
            return expr
        if isinstance(expr, Lit):
            return expr.value
        name = head(expr)
        assert isinstance(expr, tuple)
        signature = self.book.signatures.get(name or "")
        if signature is not None and signature.kind == "constructor":
            if not signature.args and signature.out in self.book.enums:
                return name
            var = self.var(signature.out)
            self.bind(var.name, expr)
            return var
        if name == "vec-empty":
            return ()
        element = self.book.containers.get(sort, "")
        if name == "vec-of" and element == "T":
            return tuple(self.arg(e, "T") for e in expr[1:])
        if name == "vec-of" and all(isinstance(e, Lit) for e in expr[1:]):
            return tuple(e.value for e in expr[1:] if isinstance(e, Lit))
        var = self.var(sort)
        self.pattern.guards.append((Sym("="), var, self.expr(expr)))
        return var

    def expr(self, expr: Expr) -> Expr:
        """A guard expression with constructor terms inside replaced by variables."""
        if not isinstance(expr, tuple) or not expr:
            return expr
        signature = self.book.signatures.get(head(expr) or "")
        if signature is not None and signature.kind == "constructor" and signature.args:
            return self.arg(expr, signature.out)
        if signature is not None:  # a function or relation: its arguments' sorts are known
            for item, sort in zip(expr[1:], signature.args, strict=False):
                if isinstance(item, Sym):
                    self.pattern.sorts.setdefault(item.name, sort)
        return (expr[0], *(self.expr(e) for e in expr[1:]))

    def atom(self, atom: Expr) -> None:
        name = head(atom)
        assert isinstance(atom, tuple)
        signature = self.book.signatures.get(name or "")
        if name == "=":
            a, b = atom[1], atom[2]
            if isinstance(b, Sym) and not isinstance(a, Sym):
                a, b = b, a
            if isinstance(a, Sym) and self._is_term(b):
                assert isinstance(b, tuple)
                self.bind(a.name, b)
                return
        if signature is not None and signature.kind == "relation":
            args = tuple(self.arg(e, s) for e, s in zip(atom[1:], signature.args, strict=True))
            self.pattern.facts.append((str(name), args))
        elif signature is not None and signature.kind == "constructor" and signature.args:
            self.bind(self.var(signature.out).name, atom)
        else:
            self.pattern.guards.append(self.expr(atom))

    def _is_term(self, expr: Expr) -> bool:
        signature = self.book.signatures.get(head(expr) or "")
        return signature is not None and signature.kind == "constructor" and bool(signature.args)


def flatten(book: Rulebook, atoms: list[Expr], deps: set[str]) -> Pattern | None:
    """The pattern of unfolded query atoms; None if they cannot hold together."""
    merged = merge(book, atoms)
    if merged is None:
        return None
    pattern = Pattern(deps=set(deps))
    flattener = _Flattener(book, pattern)
    for atom in merged:
        flattener.atom(atom)
    for name, call in pattern.bindings.items():
        if call.name not in IR_CONSTRUCTORS and pattern.sorts.get(name) == "T":
            return None  # a kernel term that unfolding could not explain
    return pattern
