"""ONNX export of the elementwise kinds: one entry per `Unary` and `Binary` member.

Most kinds are one standard op. The rest are written with standard ops where the chosen opset
lacks them (GELU before opset 20) or where ONNX's op means something else (float `Mod` must
be `fmod`, `BitShift` takes unsigned integers only).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from knopt.ir.dtype import DType
from knopt.ir.op import Binary, Unary
from knopt.onnx.emitter import Emitter

UnaryExporter = Callable[[Emitter, str, DType], str]
BinaryExporter = Callable[[Emitter, str, str, DType], str]

_SQRT_2_OVER_PI = float(np.sqrt(2.0 / np.pi))
_GELU_OPSET = 20  # Gelu joined the default domain in opset 20


def _unary_op(op_type: str, **attrs: Any) -> UnaryExporter:
    return lambda em, x, dtype: em.op(op_type, [x], **attrs)


def _rsqrt(em: Emitter, x: str, dtype: DType) -> str:
    return em.op("Reciprocal", [em.op("Sqrt", [x])])


def _silu(em: Emitter, x: str, dtype: DType) -> str:
    return em.op("Mul", [x, em.op("Sigmoid", [x])])


def _gelu(em: Emitter, x: str, dtype: DType) -> str:
    if em.opset >= _GELU_OPSET:
        return em.op("Gelu", [x])
    # x * (1 + erf(x / sqrt 2)) / 2, in the order onnxruntime's GeluFusion recognises (it
    # needs the Div, not a Mul by 1 / sqrt 2).
    root2 = em.op("Div", [x, em.scalar(np.sqrt(2.0), dtype)])
    one_plus = em.op("Add", [em.op("Erf", [root2]), em.scalar(1.0, dtype)])
    return em.op("Mul", [em.op("Mul", [x, one_plus]), em.scalar(0.5, dtype)])


def _gelu_tanh(em: Emitter, x: str, dtype: DType) -> str:
    if em.opset >= _GELU_OPSET:
        return em.op("Gelu", [x], approximate="tanh")
    # x/2 * (1 + tanh(sqrt(2 / pi) x * (1 + 0.044715 x^2))): the spelling onnxruntime's
    # FastGeluFusion recognises at any opset (its x^3 spelling needs Pow from before opset
    # 15), with operands in the order knopt's rules read back as GELU.
    inner = em.op("Mul", [em.op("Mul", [x, em.scalar(0.044715, dtype)]), x])
    scaled = em.op("Mul", [x, em.scalar(_SQRT_2_OVER_PI, dtype)])
    tanh = em.op("Tanh", [em.op("Mul", [scaled, em.op("Add", [inner, em.scalar(1.0, dtype)])])])
    one_plus = em.op("Add", [tanh, em.scalar(1.0, dtype)])
    return em.op("Mul", [em.op("Mul", [x, em.scalar(0.5, dtype)]), one_plus])


UNARY_EXPORTERS: dict[Unary, UnaryExporter] = {
    Unary.NEG: _unary_op("Neg"),
    Unary.ABS: _unary_op("Abs"),
    Unary.SIGN: _unary_op("Sign"),
    Unary.EXP: _unary_op("Exp"),
    Unary.LOG: _unary_op("Log"),
    Unary.SQRT: _unary_op("Sqrt"),
    Unary.RSQRT: _rsqrt,
    Unary.RECIPROCAL: _unary_op("Reciprocal"),
    Unary.SIN: _unary_op("Sin"),
    Unary.COS: _unary_op("Cos"),
    Unary.TAN: _unary_op("Tan"),
    Unary.ASIN: _unary_op("Asin"),
    Unary.ACOS: _unary_op("Acos"),
    Unary.ATAN: _unary_op("Atan"),
    Unary.SINH: _unary_op("Sinh"),
    Unary.COSH: _unary_op("Cosh"),
    Unary.ASINH: _unary_op("Asinh"),
    Unary.ACOSH: _unary_op("Acosh"),
    Unary.ATANH: _unary_op("Atanh"),
    Unary.TANH: _unary_op("Tanh"),
    Unary.ERF: _unary_op("Erf"),
    Unary.FLOOR: _unary_op("Floor"),
    Unary.CEIL: _unary_op("Ceil"),
    Unary.ROUND: _unary_op("Round"),
    Unary.RELU: _unary_op("Relu"),
    Unary.SIGMOID: _unary_op("Sigmoid"),
    Unary.SOFTPLUS: _unary_op("Softplus"),
    Unary.GELU: _gelu,
    Unary.GELU_TANH: _gelu_tanh,
    Unary.SILU: _silu,
    Unary.HARD_SIGMOID: _unary_op("HardSigmoid", alpha=1 / 6, beta=0.5),
    Unary.HARD_SWISH: _unary_op("HardSwish"),
    Unary.NOT: _unary_op("Not"),
    Unary.BITWISE_NOT: _unary_op("BitwiseNot"),
    Unary.IS_NAN: _unary_op("IsNaN"),
    Unary.IS_INF: _unary_op("IsInf"),
}


def _binary_op(op_type: str, **attrs: Any) -> BinaryExporter:
    return lambda em, a, b, dtype: em.op(op_type, [a, b], **attrs)


def _mod(em: Emitter, a: str, b: str, dtype: DType) -> str:
    if dtype.is_int:
        return em.op("Mod", [a, b], fmod=0)
    # ONNX requires fmod=1 for floats. The result takes the divisor's sign (Python %):
    # a non-zero remainder whose sign differs from the divisor's moves by one divisor.
    remainder = em.op("Mod", [a, b], fmod=1)
    zero = em.scalar(0, dtype)
    nonzero = em.op("Not", [em.op("Equal", [remainder, zero])])
    signs_differ = em.op("Xor", [em.op("Less", [remainder, zero]), em.op("Less", [b, zero])])
    moved = em.op("Add", [remainder, b])
    return em.op("Where", [em.op("And", [nonzero, signs_differ]), moved, remainder])


_UNSIGNED = {
    DType.I8: DType.U8,
    DType.I16: DType.U16,
    DType.I32: DType.U32,
    DType.I64: DType.U64,
}


def _shift(direction: str) -> BinaryExporter:
    def export(em: Emitter, a: str, b: str, dtype: DType) -> str:
        unsigned = _UNSIGNED.get(dtype)
        if unsigned is None:
            return em.op("BitShift", [a, b], direction=direction)
        # BitShift takes unsigned integers: shift the same bits as unsigned. A right shift of
        # a negative number must bring in ones (numpy's arithmetic shift): ~((~a) >> b).
        amount = em.op("Cast", [b], to=int(unsigned))

        def logical(x: str) -> str:
            shifted = em.op(
                "BitShift", [em.op("Cast", [x], to=int(unsigned)), amount], direction=direction
            )
            return em.op("Cast", [shifted], to=int(dtype))

        if direction == "LEFT":
            return logical(a)
        negative = em.op("Less", [a, em.scalar(0, dtype)])
        from_negative = em.op("BitwiseNot", [logical(em.op("BitwiseNot", [a]))])
        return em.op("Where", [negative, from_negative, logical(a)])

    return export


BINARY_EXPORTERS: dict[Binary, BinaryExporter] = {
    Binary.ADD: _binary_op("Add"),
    Binary.SUB: _binary_op("Sub"),
    Binary.MUL: _binary_op("Mul"),
    Binary.DIV: _binary_op("Div"),
    Binary.POW: _binary_op("Pow"),
    Binary.MIN: _binary_op("Min"),
    Binary.MAX: _binary_op("Max"),
    Binary.MOD: _mod,
    Binary.FMOD: _binary_op("Mod", fmod=1),
    Binary.EQUAL: _binary_op("Equal"),
    Binary.LESS: _binary_op("Less"),
    Binary.LESS_EQUAL: _binary_op("LessOrEqual"),
    Binary.GREATER: _binary_op("Greater"),
    Binary.GREATER_EQUAL: _binary_op("GreaterOrEqual"),
    Binary.AND: _binary_op("And"),
    Binary.OR: _binary_op("Or"),
    Binary.XOR: _binary_op("Xor"),
    Binary.BITWISE_AND: _binary_op("BitwiseAnd"),
    Binary.BITWISE_OR: _binary_op("BitwiseOr"),
    Binary.BITWISE_XOR: _binary_op("BitwiseXor"),
    Binary.SHIFT_LEFT: _shift("LEFT"),
    Binary.SHIFT_RIGHT: _shift("RIGHT"),
}
