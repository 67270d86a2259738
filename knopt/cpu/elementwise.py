"""numpy implementations of the elementwise kinds, one entry per `Unary` and `Binary` member."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy import special

from knopt.ir.op import Binary, Unary

Array = np.ndarray

_SQRT_2_OVER_PI = float(np.sqrt(2.0 / np.pi))


def _sigmoid(x: Array) -> Array:
    # 1 / (1 + e^-x) = (1 + tanh(x / 2)) / 2 cannot overflow, and numpy's tanh is about 5x
    # faster than special.expit. Below -8 the sum cancels (the result is under 3.4e-4), so
    # those elements take e^x / (1 + e^x), which keeps their relative precision.
    if x.dtype.itemsize < 4:  # f16 has too few bits for the cancellation: compute in f32
        return _sigmoid(x.astype(np.float32)).astype(x.dtype)
    half = x.dtype.type(0.5)
    result = half * np.tanh(half * x) + half
    tail = x < -8
    if tail.any():
        e = np.exp(x[tail])
        result[tail] = e / (1 + e)
    return result


def _erf(x: Array) -> Array:
    return special.erf(x).astype(x.dtype, copy=False)  # f16 comes back as f64


def _softplus(x: Array) -> Array:
    return np.logaddexp(x, np.zeros((), x.dtype))


def _gelu(x: Array) -> Array:
    return (0.5 * x * (1.0 + special.erf(x / np.sqrt(2.0)))).astype(x.dtype)


def _gelu_tanh(x: Array) -> Array:
    inner = _SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)
    return (0.5 * x * (1.0 + np.tanh(inner))).astype(x.dtype)


def _hard_sigmoid(x: Array) -> Array:
    return np.clip(x / 6 + 0.5, 0, 1).astype(x.dtype)


def _round(x: Array) -> Array:
    return np.round(x)  # numpy rounds half to even, as ONNX Round does


NUMPY_UNARY: dict[Unary, Callable[[Array], Array]] = {
    Unary.NEG: np.negative,
    Unary.ABS: np.abs,
    Unary.SIGN: np.sign,
    Unary.EXP: np.exp,
    Unary.LOG: np.log,
    Unary.SQRT: np.sqrt,
    Unary.RSQRT: lambda x: (1 / np.sqrt(x)).astype(x.dtype),
    Unary.RECIPROCAL: lambda x: (1 / x).astype(x.dtype),
    Unary.SIN: np.sin,
    Unary.COS: np.cos,
    Unary.TAN: np.tan,
    Unary.ASIN: np.arcsin,
    Unary.ACOS: np.arccos,
    Unary.ATAN: np.arctan,
    Unary.SINH: np.sinh,
    Unary.COSH: np.cosh,
    Unary.ASINH: np.arcsinh,
    Unary.ACOSH: np.arccosh,
    Unary.ATANH: np.arctanh,
    Unary.TANH: np.tanh,
    Unary.ERF: _erf,
    Unary.FLOOR: np.floor,
    Unary.CEIL: np.ceil,
    Unary.ROUND: _round,
    Unary.RELU: lambda x: np.maximum(x, np.zeros((), x.dtype)),
    Unary.SIGMOID: _sigmoid,
    Unary.SOFTPLUS: _softplus,
    Unary.GELU: _gelu,
    Unary.GELU_TANH: _gelu_tanh,
    Unary.SILU: lambda x: (x * _sigmoid(x)).astype(x.dtype),
    Unary.HARD_SIGMOID: _hard_sigmoid,
    Unary.HARD_SWISH: lambda x: (x * _hard_sigmoid(x)).astype(x.dtype),
    Unary.NOT: np.logical_not,
    Unary.BITWISE_NOT: np.invert,
    Unary.IS_NAN: np.isnan,
    Unary.IS_INF: np.isinf,
}


def _int_div(a: Array, b: Array) -> Array:
    if a.dtype.kind not in "iu":  # not signed or unsigned integers (issubdtype is 10x slower)
        return np.divide(a, b)
    # ONNX integer Div truncates toward zero (C semantics); numpy's // floors.
    quotient = np.floor_divide(a, b)
    adjust = (np.remainder(a, b) != 0) & ((a < 0) ^ (b < 0))
    return quotient + adjust.astype(a.dtype)


def _pow(a: Array, b: Array) -> Array:
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":
        return np.power(a, b.astype(a.dtype))
    if b.size == 1:
        exponent = b.reshape(())[()]
        if exponent == 3:  # GELU's cube: within an ulp of powf, 30x faster (onnxruntime too)
            return a * a * a
        # A scalar exponent lets numpy take its exact fast paths (2: square, 0.5: sqrt, ...);
        # libm's powf is 100x slower for them.
        return np.power(a, exponent).astype(a.dtype, copy=False)
    return np.power(a, b).astype(a.dtype)


def _fmod(a: Array, b: Array) -> Array:
    return np.fmod(a, b)


NUMPY_BINARY: dict[Binary, Callable[[Array, Array], Array]] = {
    Binary.ADD: np.add,
    Binary.SUB: np.subtract,
    Binary.MUL: np.multiply,
    Binary.DIV: _int_div,
    Binary.POW: _pow,
    Binary.MIN: np.minimum,
    Binary.MAX: np.maximum,
    Binary.MOD: np.mod,
    Binary.FMOD: _fmod,
    Binary.EQUAL: np.equal,
    Binary.LESS: np.less,
    Binary.LESS_EQUAL: np.less_equal,
    Binary.GREATER: np.greater,
    Binary.GREATER_EQUAL: np.greater_equal,
    Binary.AND: np.logical_and,
    Binary.OR: np.logical_or,
    Binary.XOR: np.logical_xor,
    Binary.BITWISE_AND: np.bitwise_and,
    Binary.BITWISE_OR: np.bitwise_or,
    Binary.BITWISE_XOR: np.bitwise_xor,
    Binary.SHIFT_LEFT: np.left_shift,
    Binary.SHIFT_RIGHT: np.right_shift,
}
