"""S-expressions of egglog rule files: read with source spans, written back as text.

Lists are tuples (hashable, so patterns can be compared and unified); symbols are `Sym`;
literals are `Lit`, which keeps its source text so that a rule written back reads as before.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from knopt.errors import RuleFileError


@dataclass(frozen=True)
class Sym:
    """A symbol: a variable, a constructor, a function or a keyword."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Lit:
    """A literal (i64, f64, String or bool), compared by value."""

    value: int | float | str | bool
    text: str = field(default="", compare=False)

    def __str__(self) -> str:
        return self.text or format_literal(self.value)


Expr = Sym | Lit | tuple["Expr", ...]


@dataclass(frozen=True)
class Form:
    """A top-level form and where its text is in the file."""

    expr: Expr
    start: int
    end: int


_TOKEN = re.compile(r'\s+|;[^\n]*|(\()|(\))|("(?:[^"\\]|\\.)*")|([^\s()";]+)')
_INT = re.compile(r"[-+]?\d+")
_FLOAT = re.compile(r"[-+]?(\d+\.\d*([eE][-+]?\d+)?|\d+[eE][-+]?\d+|inf|NaN)")


def format_literal(value: int | float | str | bool) -> str:
    """A literal as egglog writes it (floats always with a point or an exponent)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        text = repr(value)
        return text if any(c in text for c in ".en") else text + ".0"
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _atom(text: str) -> Sym | Lit:
    if _INT.fullmatch(text):
        return Lit(int(text), text)
    if _FLOAT.fullmatch(text):
        return Lit(float(text), text)
    if text in ("true", "false"):
        return Lit(text == "true", text)
    return Sym(text)


def _tokens(text: str, name: str) -> Iterator[tuple[int, str, Expr | None]]:
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise RuleFileError(f"{name}: cannot read the text at offset {pos}")
        pos = match.end()
        if match[1]:
            yield match.start(), "(", None
        elif match[2]:
            yield match.start(), ")", None
        elif match[3]:
            body = match[3][1:-1].replace('\\"', '"').replace("\\\\", "\\")
            yield match.start(), "atom", Lit(body, match[3])
        elif match[4]:
            yield match.start(), "atom", _atom(match[4])


def read_forms(text: str, name: str = "<text>") -> list[Form]:
    """The top-level forms of a rule file, with their spans.

    Raises:
        RuleFileError: If the parentheses do not balance.
    """
    forms: list[Form] = []
    stack: list[tuple[int, list[Expr]]] = []
    for start, kind, atom in _tokens(text, name):
        if kind == "(":
            stack.append((start, []))
        elif kind == ")":
            if not stack:
                raise RuleFileError(f"{name}: unbalanced ')' at offset {start}")
            begin, items = stack.pop()
            expr = tuple(items)
            if stack:
                stack[-1][1].append(expr)
            else:
                forms.append(Form(expr, begin, start + 1))
        elif stack:
            assert atom is not None
            stack[-1][1].append(atom)
        else:
            assert atom is not None
            forms.append(Form(atom, start, start + len(str(atom))))
    if stack:
        raise RuleFileError(f"{name}: {len(stack)} unclosed '(' at the end")
    return forms


def to_text(expr: Expr) -> str:
    """An expression as egglog text."""
    if isinstance(expr, tuple):
        return "(" + " ".join(to_text(e) for e in expr) + ")"
    return str(expr)


def head(expr: Expr) -> str | None:
    """The name a list starts with, or None."""
    if isinstance(expr, tuple) and expr and isinstance(expr[0], Sym):
        return expr[0].name
    return None
