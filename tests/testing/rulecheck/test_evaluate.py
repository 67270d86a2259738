"""Evaluating rule conditions in Python."""

from __future__ import annotations

import pytest

from knopt.ir import DType, GraphBuilder, Value
from knopt.ir.shape import static_dims
from knopt.testing.rulecheck.evaluate import Evaluator, Unknown
from knopt.testing.rulecheck.sexpr import Expr, read_forms


def _expr(text: str) -> Expr:
    (form,) = read_forms(text)
    return form.expr


def _static_type(value: Value) -> tuple[tuple[int, ...], str]:
    dims = static_dims(value.shape)
    assert dims is not None
    return dims, value.dtype.name


def _evaluator() -> Evaluator:
    g = GraphBuilder()
    x = g.input("x", (2, 3), DType.F32)
    return Evaluator(
        {"a": 1, "s": (2, 3), "c": 0.7071067},
        {"x": x},
        _static_type,
        {"is-float": {("F32",)}},
    )


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("(- (vec-length s) 1)", 1),
        ("(vec-of a)", (1,)),
        ("(vec-get (shape x) a)", 3),
        ("(vec-set s 0 5)", (5, 3)),
        ("(* 2.0 (to-f64 a))", 2.0),
        ("(numel s)", 6),
        ("(numel-from (vec-of 2 -1000) 1)", -1),
        ("(dtype x)", "F32"),
        ("(abs (- c 1.0))", 0.2928933),
    ],
)
def test_primitive_expressions_evaluate(text: str, value: object) -> None:
    result = _evaluator().value(_expr(text))
    assert result == pytest.approx(value) if isinstance(value, float) else result == value


def test_conditions_hold_or_not() -> None:
    evaluator = _evaluator()
    assert evaluator.holds(_expr("(< (abs (- c 0.7071067811865476)) 1e-6)"))
    assert not evaluator.holds(_expr("(= s (vec-of 3 2))"))
    assert evaluator.holds(_expr("(is-float (dtype x))"))
    assert evaluator.holds(_expr("(= x x)"))


@pytest.mark.parametrize("text", ["(body-size b)", "(< (numel-from z 0) 0)", "(vec-get s 9)"])
def test_what_python_does_not_know_is_unknown(text: str) -> None:
    with pytest.raises(Unknown):
        evaluator = _evaluator()
        expr = _expr(text)
        evaluator.holds(expr) if text.startswith("(<") else evaluator.value(expr)
