"""Unfolding a rule's query: derived atoms replaced by the queries of the rules that make them.

`unfold` replaces atoms that only other rules make true (relations such as `gelu-core` or
`operand`, and kernel terms such as `(KElem b)`) by the query of a rule that makes them,
chosen at random and unified with the atom: backward chaining, as in Prolog. The rules it used
are the dependencies that must run before the checked rule can fire.

Facts computed by the saturated analyses (`shape`, `folds`, `varies`, `numel`...) are never
unfolded: the instance either has them or not, and egglog tells.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from knopt.testing.choices import Choices, choose_weighted
from knopt.testing.rulecheck.pattern import IR_CONSTRUCTORS, LEAVES, SATURATED, merge, substitute
from knopt.testing.rulecheck.rulebook import Rule, Rulebook
from knopt.testing.rulecheck.sexpr import Expr, Lit, Sym, head

# ---- producers ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Producer:
    rule: Rule | None  # None for a base fact
    heads: tuple[Expr, ...]  # the atoms it makes true, each as `(R args)` or `(= x (K ...))`
    query: tuple[Expr, ...]


def _heads(rule: Rule) -> Iterator[Expr]:
    for action in rule.actions:
        name = head(action)
        if name == "union":
            assert isinstance(action, tuple)
            _, a, b = action
            yield (Sym("="), a, b)
            yield (Sym("="), b, a)
        elif name == "set":
            assert isinstance(action, tuple)
            yield (Sym("="), action[2], action[1])
        elif name not in (None, "let", "delete", "subsume", "panic"):
            yield action


def producers(book: Rulebook) -> dict[str, list[_Producer]]:
    """For each relation and constructor name: the rules and base facts that make one."""
    found: dict[str, list[_Producer]] = {}
    for name, rows in book.base_facts.items():
        for row in rows:
            found.setdefault(name, []).append(_Producer(None, ((Sym(name), *row),), ()))
    for rule in book.rules:
        heads = {_oriented(book, atom) for atom in _heads(rule)}
        for atom in sorted(heads, key=repr):
            key = _atom_key(book, atom)
            if key is not None:
                found.setdefault(key, []).append(_Producer(rule, (atom,), rule.query))
        for index, term in enumerate(_scalar_terms(book, rule.actions)):
            made = (Sym("="), Sym(f"knopt-made-{index}"), term)
            found.setdefault(str(head(term)), []).append(_Producer(rule, (made,), rule.query))
    return found


def _scalar_terms(book: Rulebook, exprs: tuple[Expr, ...]) -> Iterator[Expr]:
    """The scalar-body terms (sort S) that actions build, outermost first."""
    for expr in exprs:
        if not isinstance(expr, tuple) or not expr:
            continue
        signature = book.signatures.get(head(expr) or "")
        if (
            signature is not None
            and signature.kind == "constructor"
            and signature.out == "S"
            and signature.args
        ):
            yield expr
        yield from _scalar_terms(book, expr[1:])


def _keyed_term(book: Rulebook, term: Expr, deep: bool = False) -> str | None:
    name = head(term)
    signature = book.signatures.get(name or "")
    if signature is None or name is None:
        return None
    if signature.kind == "constructor" and signature.out == "T" and name not in IR_CONSTRUCTORS:
        return name  # a kernel term
    if deep and signature.kind == "constructor" and signature.out == "S" and signature.args:
        return name  # a scalar body, which fusion-facts rules make
    if signature.kind == "function" and name not in ("shape", "dtype"):
        return name  # a function row (types are never unfolded: every tensor has one)
    return None


def _atom_key(book: Rulebook, atom: Expr, deep: bool = False) -> str | None:
    """The relation, function or kernel constructor an atom asserts, if `unfold` handles it."""
    name = head(atom)
    if name == "=":
        assert isinstance(atom, tuple)
        return _keyed_term(book, atom[2], deep) or _keyed_term(book, atom[1], deep)
    signature = book.signatures.get(name or "")
    if signature is not None and signature.kind == "relation":
        return name
    return None


def _oriented(book: Rulebook, atom: Expr) -> Expr:
    """An `=` atom with its keyed term on the right, as producers' heads are written."""
    if head(atom) == "=" and isinstance(atom, tuple) and _keyed_term(book, atom[2], True) is None:
        return (atom[0], atom[2], atom[1])
    return atom


def _free_tensors(book: Rulebook, atom: Expr, bound: set[str]) -> bool:
    """Whether the atom names a tensor variable that no constructor term binds."""
    assert isinstance(atom, tuple)
    items = atom[2][1:] if head(atom) == "=" and isinstance(atom[2], tuple) else atom[1:]
    signature = book.signatures.get((head(atom[2]) if head(atom) == "=" else head(atom)) or "")
    if signature is None:
        return False
    return any(
        isinstance(a, Sym) and sort == "T" and a.name not in bound
        for a, sort in zip(items, signature.args, strict=False)
    )


def is_unfoldable(
    book: Rulebook,
    index: dict[str, list[_Producer]],
    atom: Expr,
    bound: set[str] = frozenset(),  # type: ignore[assignment]
    deep: bool = False,
) -> bool:
    """Whether `unfold` should explain `atom` by a rule that makes it.

    Atoms that rules outside the saturated analyses make always are. Analysis facts are when
    `deep` is set (a query over no tensor at all) or when they name a tensor that nothing
    binds yet: `(identity-below p i)` alone says little, its producer `(Permute x p s)` says
    what to build.
    """
    key = _atom_key(book, _oriented(book, atom), deep)
    if key is None:
        return False
    options = index.get(key, [])
    if any(p.rule is not None and p.rule.ruleset not in SATURATED for p in options):
        return True
    if not any(p.rule is not None for p in options):
        return False
    return deep or _free_tensors(book, _oriented(book, atom), bound)


def _bound(book: Rulebook, goals: list[Expr]) -> set[str]:
    found = set()
    for goal in goals:
        if head(goal) == "=" and isinstance(goal, tuple):
            for var, term in ((goal[1], goal[2]), (goal[2], goal[1])):
                signature = book.signatures.get(head(term) or "")
                if (
                    isinstance(var, Sym)
                    and signature is not None
                    and signature.kind == "constructor"
                ):
                    found.add(var.name)
    return found


# ---- unfolding -------------------------------------------------------------------------------


def _rename(expr: Expr, suffix: str) -> Expr:
    if isinstance(expr, Sym):
        return Sym(expr.name + suffix)
    if isinstance(expr, tuple) and expr:
        return (expr[0], *(_rename(e, suffix) for e in expr[1:]))
    return expr


def _unify(
    h: Expr,
    a: Expr,
    mine: set[str],
    subst: dict[str, Expr],
    extra: list[Expr],
    is_term: Callable[[Expr], bool],
) -> bool:
    """Unify a producer's head argument `h` (variables in `mine`) with a target argument `a`.

    Constructor terms unify structurally; anything else that must be equal (a primitive
    expression such as `(+ i 1)` against `(vec-length q)`) becomes an equality atom.
    """
    if isinstance(h, Sym) and h.name in mine:
        if h.name in subst:
            extra.append((Sym("="), subst[h.name], a))
        else:
            subst[h.name] = a
        return True
    if isinstance(a, Sym):
        extra.append((Sym("="), a, h))
        return True
    if isinstance(h, Lit) and isinstance(a, Lit):
        return h == a
    if is_term(h) and is_term(a):
        assert isinstance(h, tuple) and isinstance(a, tuple)
        if head(h) != head(a) or len(h) != len(a):
            return False
        return all(
            _unify(x, y, mine, subst, extra, is_term) for x, y in zip(h[1:], a[1:], strict=True)
        )
    if is_term(h) or is_term(a):
        return False
    extra.append((Sym("="), a, h))
    return True


def _variables(expr: Expr) -> Iterator[str]:
    if isinstance(expr, Sym):
        yield expr.name
    elif isinstance(expr, tuple):
        for item in expr[1:]:
            yield from _variables(item)


def _apply(book: Rulebook, producer: _Producer, atom: Expr, suffix: str) -> list[Expr] | None:
    """The producer's query, renamed and unified so that it makes `atom` true, or None."""
    heads = [_rename(h, suffix) for h in producer.heads]
    query = [_rename(q, suffix) for q in producer.query]
    mine = {v for e in (*heads, *query) for v in _variables(e)}
    for candidate in heads:
        if head(candidate) != head(atom) or not isinstance(candidate, tuple):
            continue
        assert isinstance(atom, tuple)
        if len(candidate) != len(atom):
            continue
        subst: dict[str, Expr] = {}
        extra: list[Expr] = []

        def is_term(expr: Expr) -> bool:  # constructors and function rows unify by structure
            return head(expr) in book.signatures

        pairs = zip(candidate[1:], atom[1:], strict=True)
        if all(_unify(h, a, mine, subst, extra, is_term) for h, a in pairs):
            return [substitute(e, subst) for e in (*extra, *query)]
    return None


def _makes_leaf(producer: _Producer) -> bool:
    return any(
        head(atom) == "=" and isinstance(atom, tuple) and head(atom[2]) in LEAVES
        for atom in producer.query
    )


def _demanding(producer: _Producer) -> bool:
    """Whether a producer's query asks for a metric of at least some size."""
    return any(
        head(atom) in (">=", ">") and isinstance(atom, tuple) and isinstance(atom[2], Lit)
        for atom in producer.query
    )


def _recursive(book: Rulebook, key: str, producer: _Producer) -> bool:
    return any(_atom_key(book, atom) == key for atom in producer.query)


def unfold(
    book: Rulebook,
    index: dict[str, list[_Producer]],
    atoms: tuple[Expr, ...],
    choices: Choices,
    *,
    exclude: str,
    max_steps: int = 40,
    deep: bool = False,
    recursion: int = 0,
    budget: int = 300,
) -> tuple[list[Expr], set[str]] | None:
    """Replace derived atoms by producers' queries until none are left (None if stuck).

    A depth-first search: producers are tried in a random order that favours simple ones,
    and a choice whose consequences clash later is undone.

    Args:
        book: The declarations and rules of the loaded rule files.
        index: The producers of each derived atom, by key (see `producers`).
        atoms: The query to unfold.
        choices: Where the random order of the producers comes from.
        exclude: The name of the checked rule, which never explains its own query.
        max_steps: How many atoms one branch of the search may unfold.
        deep: Unfold analysis facts too (for a query over no tensor).
        recursion: Prefer producers that need their own relation again this many times
            (a guard such as `(>= (body-size b) 12)` needs a body of 12 ops).
        budget: How many producer applications the search may try.
    """
    counter = itertools.count()
    left = [budget]

    def order(key: str, options: list[_Producer], deeper: bool) -> list[_Producer]:
        # Producers that do not need the same relation again, far more often than all the
        # others together: recursion through `full` would otherwise rarely end.
        strong = 4 * len(options)

        def weight(p: _Producer) -> int:
            if deeper:  # recurse in a line, through producers that do not ask for depth
                linear = sum(_atom_key(book, a) == key for a in p.query) == 1
                return strong if linear and not _demanding(p) else 1
            if _recursive(book, key, p):
                return 1
            # The simplest explanation of a tensor is an input or a constant.
            return strong * (4 if _makes_leaf(p) else 1)

        pool = [(p, weight(p)) for p in options]
        ordered = []
        while pool:
            picked = choose_weighted(choices, pool)
            ordered.append(picked)
            pool = [(p, w) for p, w in pool if p is not picked]
        return ordered

    def search(
        goals: list[Expr], deps: frozenset[str], depth: int, steps: int
    ) -> tuple[list[Expr], set[str]] | None:
        bound = _bound(book, goals)
        # `deep` explains the query's own atoms only; the producers' atoms are explained as
        # usual, or the search wanders through every analysis of the schema.
        position = next(
            (
                i
                for i, a in enumerate(goals)
                if is_unfoldable(book, index, a, bound, deep and a in original)
            ),
            None,
        )
        if position is None:
            return goals, set(deps)
        if steps >= max_steps:
            return None
        atom = _oriented(book, goals[position])
        rest = goals[:position] + goals[position + 1 :]
        key = _atom_key(book, atom, deep) or _atom_key(book, atom)
        assert key is not None
        options = [p for p in index[key] if p.rule is None or p.rule.name != exclude]
        for producer in order(key, options, depth > 0):
            if left[0] <= 0:
                return None
            left[0] -= 1
            found = _apply(book, producer, atom, f"~{next(counter)}")
            # A producer whose query clashes with what is already required (a class that
            # would hold two different ops) is no explanation: try another.
            if found is None or merge(book, rest + found) is None:
                continue
            used = deps
            if producer.rule is not None and producer.rule.ruleset not in SATURATED:
                used = deps | {producer.rule.name}
            result = search(rest + found, used, depth - _recursive(book, key, producer), steps + 1)
            if result is not None:
                return result
        return None

    original = frozenset(atoms)
    return search(list(atoms), frozenset(), recursion, 0)
