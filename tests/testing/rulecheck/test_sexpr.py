"""Reading rule files as s-expressions and writing them back."""

from __future__ import annotations

import math

import pytest

from knopt.errors import RuleFileError
from knopt.testing.rulecheck.sexpr import Lit, Sym, format_literal, head, read_forms, to_text

TEXT = """;; a comment
(rewrite (Clamp x -inf 6.0) x ; trailing comment
         :when ((>= 1e-6 0.0)) :name "a \\"quoted\\" name")
(relation r (T))
"""


def test_forms_keep_their_spans_and_literals() -> None:
    forms = read_forms(TEXT)
    assert [head(f.expr) for f in forms] == ["rewrite", "relation"]
    first = forms[0]
    assert TEXT[first.start : first.end].startswith("(rewrite")
    assert TEXT[first.start : first.end].endswith('name")')
    clamp = first.expr[1]  # type: ignore[index]
    assert clamp == (Sym("Clamp"), Sym("x"), Lit(-math.inf), Lit(6.0))
    name = first.expr[-1]  # type: ignore[index]
    assert name == Lit('a "quoted" name')


def test_text_round_trips_through_the_reader() -> None:
    for form in read_forms(TEXT):
        again = read_forms(to_text(form.expr))
        assert [f.expr for f in again] == [form.expr]


def test_floats_are_written_as_floats() -> None:
    assert format_literal(2.0) == "2.0"
    assert format_literal(1e-6) == "1e-06"
    assert format_literal(-math.inf) == "-inf"
    assert format_literal(True) == "true"
    assert format_literal(3) == "3"


@pytest.mark.parametrize("text", ["(rewrite (a b)", "(a))"])
def test_unbalanced_parentheses_are_an_error_naming_the_file(text: str) -> None:
    with pytest.raises(RuleFileError, match=r"my\.egg"):
        read_forms(text, "my.egg")
