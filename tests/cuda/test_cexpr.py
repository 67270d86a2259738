"""Scalar bodies as CUDA C: the statements, literals and types generated."""

from __future__ import annotations

import pytest

from knopt.cuda.cexpr import ScalarCode, expr_dtype, literal, used_loads
from knopt.errors import CodegenError
from knopt.ir.dtype import DType
from knopt.ir.op import Binary, Unary
from knopt.ir.program import Acc, BinaryE, CastE, ClampE, Const, Load, UnaryE, WhereE


def test_body_becomes_one_statement_per_operation_with_shared_subterms() -> None:
    shared = BinaryE(Binary.ADD, Load(0), Load(1))
    body = BinaryE(Binary.MUL, UnaryE(Unary.RELU, shared), shared)
    code = ScalarCode([DType.F32, DType.F32], ["x0", "x1"])
    result = code.emit(body)
    assert code.lines == [
        "const float t0 = kn::b_add<float>(x0, x1);",
        "const float t1 = kn::u_relu(t0);",
        "const float t2 = kn::b_mul<float>(t1, t0);",
    ]
    assert result == "t2"


def test_half_types_compute_in_float_and_casts_round() -> None:
    code = ScalarCode([DType.F16], ["x0"])
    code.emit(CastE(UnaryE(Unary.EXP, Load(0)), DType.BF16))
    assert code.lines[-1] == "const float t1 = kn::cvt<float>(kn::cvt<__nv_bfloat16>(t0));"


def test_where_clamp_and_comparisons_have_their_types() -> None:
    body = WhereE(
        BinaryE(Binary.LESS, Load(0), Const(0.0, DType.F32)), ClampE(Load(0), -1.0, 2.0), Acc()
    )
    code = ScalarCode([DType.F32], ["x0"], acc=DType.F32, acc_name="a")
    code.emit(body)
    assert code.lines[0].startswith("const bool t0 = kn::b_less<float>(x0, 0.0f)")
    assert "kn::clamp_<float>(x0, -1.0f, 2.0f)" in code.lines[1]
    assert code.lines[2] == "const float t2 = (t0 ? t1 : a);"


def test_integer_clamp_bounds_round_inwards() -> None:
    code = ScalarCode([DType.I32], ["x0"])
    code.emit(ClampE(Load(0), -2.5, 3.5))
    assert "((int)-2LL), ((int)3LL)" in code.lines[0]


def test_literals() -> None:
    assert literal(float("inf"), DType.F32) == "KN_INF_F"
    assert literal(float("-inf"), DType.F64) == "(-KN_INF_D)"
    assert literal(float("nan"), DType.F16) == "KN_NAN_F"
    assert literal(0.1, DType.F32) == "0.10000000149011612f"
    assert literal(-(2**63), DType.I64) == "((long long)(-9223372036854775807LL - 1))"
    assert literal(True, DType.BOOL) == "true"
    assert literal(70000.0, DType.F16) == "KN_INF_F"  # f16 has no 70000


def test_acc_outside_an_epilogue_is_a_codegen_error() -> None:
    with pytest.raises(CodegenError):
        expr_dtype(Acc(), [DType.F32])


def test_used_loads() -> None:
    assert used_loads(BinaryE(Binary.ADD, Load(2), UnaryE(Unary.NEG, Load(0)))) == {0, 2}
