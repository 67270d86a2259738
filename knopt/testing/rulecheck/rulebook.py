"""What a set of rule files declares, and every named rule in them.

The declarations are sorts, constructors, relations, functions and base facts; each rule comes
with its query, its actions and where it sits in its file.

A `rewrite` becomes a rule whose query binds the left side to `knopt-lhs` and whose action
unions it with the right side, so every rule has one shape: query atoms and actions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from knopt.errors import RuleFileError
from knopt.opt.rules import RuleFile
from knopt.testing.rulecheck.sexpr import Expr, Form, Lit, Sym, head, read_forms

LHS = Sym("knopt-lhs")
PRIMITIVE_SORTS = frozenset({"i64", "f64", "bool", "String", "Unit"})


@dataclass(frozen=True)
class Signature:
    """A constructor, function or relation: argument sorts and result sort."""

    name: str
    args: tuple[str, ...]
    out: str
    kind: str  # "constructor", "function" or "relation"


@dataclass(frozen=True)
class Rule:
    """One named rule (a birewrite is two: `name=>` and `name<=`, as egglog names them).

    Attributes:
        query: The atoms to match (a rewrite's left side is `(= knopt-lhs lhs)`).
        actions: What it does when they match.
        form: The rule's text span in its file.
    """

    name: str
    ruleset: str
    query: tuple[Expr, ...]
    actions: tuple[Expr, ...]
    file: str
    form: Form


@dataclass
class Rulebook:
    """Everything the rule files declare."""

    signatures: dict[str, Signature] = field(default_factory=dict)
    enums: dict[str, list[str]] = field(default_factory=dict)  # enum sort -> member names
    containers: dict[str, str] = field(default_factory=dict)  # IVec -> i64, TVec -> T
    base_facts: dict[str, list[tuple[Expr, ...]]] = field(default_factory=dict)
    rules: list[Rule] = field(default_factory=list)

    def enum_of(self, member: str) -> str | None:
        """The enum sort a member name belongs to, if it is one."""
        signature = self.signatures.get(member)
        if signature is not None and not signature.args and signature.out in self.enums:
            return signature.out
        return None

    def rule(self, name: str) -> Rule:
        """The rule called `name`.

        Raises:
            RuleFileError: If there is none.
        """
        for rule in self.rules:
            if rule.name == name:
                return rule
        raise RuleFileError(f"no rule is named '{name}'")


def _options(items: Sequence[Expr]) -> tuple[list[Expr], dict[str, Expr]]:
    """Split `a b :key value ...` into positional items and keyword options."""
    positional: list[Expr] = []
    options: dict[str, Expr] = {}
    index = 0
    while index < len(items):
        item = items[index]
        if isinstance(item, Sym) and item.name == ":subsume":  # a flag without a value
            options[item.name] = item
            index += 1
        elif isinstance(item, Sym) and item.name.startswith(":"):
            options[item.name] = items[index + 1] if index + 1 < len(items) else Sym("")
            index += 2
        else:
            positional.append(item)
            index += 1
    return positional, options


def _name(options: dict[str, Expr]) -> str:
    value = options.get(":name")
    return str(value.value) if isinstance(value, Lit) else ""


def _ruleset(options: dict[str, Expr]) -> str:
    value = options.get(":ruleset")
    return value.name if isinstance(value, Sym) else ""


def _rules(form: Form, file: str) -> list[Rule]:
    """The rules one `rule`, `rewrite` or `birewrite` form adds (a birewrite adds two).

    Raises:
        RuleFileError: If the rule has no `:name`.
    """
    expr = form.expr
    assert isinstance(expr, tuple)
    kind = head(expr)
    positional, options = _options(expr[1:])
    name = _name(options)
    if not name:
        raise RuleFileError(f"{file}: the rule at offset {form.start} has no :name")
    ruleset = _ruleset(options)
    if kind == "rule":
        query, actions = positional
        assert isinstance(query, tuple) and isinstance(actions, tuple)
        return [Rule(name, ruleset, query, actions, file, form)]
    lhs, rhs = positional
    when = options.get(":when", ())
    assert isinstance(when, tuple)
    if kind == "rewrite":
        return [_rewrite(name, ruleset, lhs, rhs, when, file, form)]
    # egglog names a birewrite's two directions `name=>` and `name<=`.
    return [
        _rewrite(f"{name}=>", ruleset, lhs, rhs, when, file, form),
        _rewrite(f"{name}<=", ruleset, rhs, lhs, when, file, form),
    ]


def _rewrite(
    name: str, ruleset: str, lhs: Expr, rhs: Expr, when: tuple[Expr, ...], file: str, form: Form
) -> Rule:
    query = ((Sym("="), LHS, lhs), *when)
    return Rule(name, ruleset, query, ((Sym("union"), LHS, rhs),), file, form)


def _declare(book: Rulebook, expr: tuple[Expr, ...]) -> None:
    kind = head(expr)
    if kind == "datatype":
        _datatype(book, expr[1], expr[2:])
    elif kind == "datatype*":
        for part in expr[1:]:
            assert isinstance(part, tuple)
            if head(part) == "sort":
                _declare(book, part)
            else:
                _datatype(book, part[0], part[1:])
    elif kind == "sort" and len(expr) == 3 and isinstance(expr[2], tuple):
        book.containers[str(expr[1])] = str(expr[2][1])
    elif kind in ("constructor", "function"):
        name, args, out = expr[1], expr[2], expr[3]
        assert isinstance(args, tuple)
        book.signatures[str(name)] = Signature(
            str(name), tuple(str(a) for a in args), str(out), str(kind)
        )
    elif kind == "relation":
        args = expr[2]
        assert isinstance(args, tuple)
        book.signatures[str(expr[1])] = Signature(
            str(expr[1]), tuple(str(a) for a in args), "Unit", "relation"
        )
    elif kind in book.signatures and book.signatures[kind].kind == "relation":
        book.base_facts.setdefault(kind, []).append(expr[1:])


def _datatype(book: Rulebook, sort: Expr, variants: Sequence[Expr]) -> None:
    members = []
    for variant in variants:
        assert isinstance(variant, tuple)
        positional, _ = _options(variant[1:])
        name = str(variant[0])
        book.signatures[name] = Signature(
            name, tuple(str(a) for a in positional), str(sort), "constructor"
        )
        members.append((name, positional))
    if all(not args for _, args in members):
        book.enums[str(sort)] = [name for name, _ in members]


def read_rulebook(files: Sequence[RuleFile]) -> Rulebook:
    """Parse rule files (in load order) into a `Rulebook`.

    Raises:
        RuleFileError: If a file does not read as s-expressions, or a rule is malformed or
            has no name.
    """
    book = Rulebook()
    for rule_file in files:
        for form in read_forms(rule_file.text, rule_file.name):
            expr = form.expr
            if not isinstance(expr, tuple) or not expr:
                continue
            if head(expr) in ("rule", "rewrite", "birewrite"):
                try:
                    book.rules.extend(_rules(form, rule_file.name))
                except (ValueError, AssertionError) as err:
                    raise RuleFileError(
                        f"{rule_file.name}: cannot read the rule at offset {form.start}"
                    ) from err
            else:
                _declare(book, expr)
    return book
