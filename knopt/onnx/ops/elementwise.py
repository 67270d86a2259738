"""Importers of elementwise ONNX ops: arithmetic, comparisons, logic and activations."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx

from knopt.ir.dtype import DType
from knopt.ir.graph import Value
from knopt.ir.op import Binary, Unary
from knopt.onnx.context import ImportContext, Known, OnnxValue, importer
from knopt.onnx.ops.common import scalar_like

_UNARY = {
    "Neg": Unary.NEG,
    "Abs": Unary.ABS,
    "Sign": Unary.SIGN,
    "Exp": Unary.EXP,
    "Log": Unary.LOG,
    "Sqrt": Unary.SQRT,
    "Reciprocal": Unary.RECIPROCAL,
    "Sin": Unary.SIN,
    "Cos": Unary.COS,
    "Tan": Unary.TAN,
    "Asin": Unary.ASIN,
    "Acos": Unary.ACOS,
    "Atan": Unary.ATAN,
    "Sinh": Unary.SINH,
    "Cosh": Unary.COSH,
    "Asinh": Unary.ASINH,
    "Acosh": Unary.ACOSH,
    "Atanh": Unary.ATANH,
    "Tanh": Unary.TANH,
    "Erf": Unary.ERF,
    "Floor": Unary.FLOOR,
    "Ceil": Unary.CEIL,
    "Round": Unary.ROUND,
    "Relu": Unary.RELU,
    "Sigmoid": Unary.SIGMOID,
    "Softplus": Unary.SOFTPLUS,
    "Not": Unary.NOT,
    "BitwiseNot": Unary.BITWISE_NOT,
    "IsNaN": Unary.IS_NAN,
}

_BINARY = {
    "Add": Binary.ADD,
    "Sub": Binary.SUB,
    "Mul": Binary.MUL,
    "Div": Binary.DIV,
    "Pow": Binary.POW,
    "Equal": Binary.EQUAL,
    "Less": Binary.LESS,
    "LessOrEqual": Binary.LESS_EQUAL,
    "Greater": Binary.GREATER,
    "GreaterOrEqual": Binary.GREATER_EQUAL,
    "And": Binary.AND,
    "Or": Binary.OR,
    "Xor": Binary.XOR,
    "BitwiseAnd": Binary.BITWISE_AND,
    "BitwiseOr": Binary.BITWISE_OR,
    "BitwiseXor": Binary.BITWISE_XOR,
}


def _unary_importer(kind: Unary):
    def run(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
        (x,) = ctx.inputs(node, count=1)
        ctx.attributes(node)
        return [ctx.builder.unary(kind, x)]

    return run


def _binary_importer(kind: Binary):
    def run(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
        a, b = ctx.inputs(node, count=2)
        attrs = ctx.attributes(node)
        if attrs.has("broadcast") or attrs.has("axis"):
            raise ctx.fail("legacy broadcast attributes (opset < 7) are not supported")
        if kind is Binary.POW and b.dtype is not a.dtype:
            b = ctx.builder.cast(b, a.dtype)
        return [ctx.builder.binary(kind, a, b)]

    return run


for _name, _kind in _UNARY.items():
    importer(_name)(_unary_importer(_kind))
for _name, _bkind in _BINARY.items():
    importer(_name)(_binary_importer(_bkind))


@importer("Mod")
def _mod(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    a, b = ctx.inputs(node, count=2)
    fmod = ctx.attributes(node).int("fmod", 0)
    return [ctx.builder.binary(Binary.FMOD if fmod else Binary.MOD, a, b)]


@importer("BitShift")
def _bit_shift(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    a, b = ctx.inputs(node, count=2)
    direction = ctx.attributes(node).string("direction")
    kinds = {"LEFT": Binary.SHIFT_LEFT, "RIGHT": Binary.SHIFT_RIGHT}
    if direction not in kinds:
        raise ctx.fail(f"BitShift direction '{direction}' is not LEFT or RIGHT")
    return [ctx.builder.binary(kinds[direction], a, b)]


@importer("IsInf")
def _is_inf(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    attrs = ctx.attributes(node)
    negative, positive = attrs.int("detect_negative", 1), attrs.int("detect_positive", 1)
    b = ctx.builder
    inf = b.unary(Unary.IS_INF, x)
    if negative and positive:
        return [inf]
    if not negative and not positive:
        return [b.scalar(False, DType.BOOL, x.shape)]
    side = b.binary(Binary.GREATER if positive else Binary.LESS, x, scalar_like(ctx, x, 0))
    return [b.binary(Binary.AND, inf, side)]


def _variadic(kind: Binary):
    def run(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
        values = ctx.inputs(node, count=(1, None))
        values = [v for v in values if v is not None]
        ctx.attributes(node)
        result = values[0]
        for v in values[1:]:
            result = ctx.builder.binary(kind, result, v)
        return [result]

    return run


importer("Sum")(_variadic(Binary.ADD))
importer("Max")(_variadic(Binary.MAX))
importer("Min")(_variadic(Binary.MIN))


@importer("Mean")
def _mean(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (total,) = _variadic(Binary.ADD)(ctx, node)
    count = scalar_like(ctx, total, len([n for n in node.input if n]))
    return [ctx.builder.binary(Binary.DIV, total, count)]


@importer("Where")
def _where(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    condition, x, y = ctx.inputs(node, count=3)
    ctx.attributes(node)
    return [ctx.builder.where(condition, x, y)]


@importer("Identity")
def _identity(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    ctx.inputs(node, count=1)
    ctx.attributes(node)
    return [ctx.lookup(node.input[0])]


# float8 types that saturate: out-of-range values (and infinities) become the largest finite.
_SATURATING = frozenset({DType.F8E4M3FN, DType.F8E4M3FNUZ, DType.F8E5M2, DType.F8E5M2FNUZ})


def cast_to(ctx: ImportContext, x: Value, dtype: DType, saturate: bool = True) -> Value:
    """ONNX Cast of `x` to `dtype`: to float8, `saturate` clamps to the finite range first."""
    if saturate and dtype in _SATURATING and x.dtype.is_float and x.dtype is not dtype:
        info = ml_dtypes.finfo(dtype.numpy)
        x = ctx.builder.clamp(x, lo=float(info.min), hi=float(info.max))
    return ctx.builder.cast(x, dtype)


@importer("Cast")
def _cast(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    attrs = ctx.attributes(node)
    dtype = DType.from_onnx(attrs.int("to"), ctx.where)
    saturate = bool(attrs.int("saturate", 1)) if ctx.opset >= 19 else True
    return [cast_to(ctx, x, dtype, saturate)]


@importer("CastLike")
def _cast_like(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x, like = ctx.inputs(node, count=2)
    saturate = bool(ctx.attributes(node).int("saturate", 1)) if ctx.opset >= 19 else True
    return [cast_to(ctx, x, like.dtype, saturate)]


@importer("Dropout")
def _dropout(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue | None]:
    x, _, training = ctx.inputs(node, count=(1, 3))
    attrs = ctx.attributes(node)
    attrs.skip("ratio", "seed")
    if attrs.int("is_test", 1) == 0 and ctx.opset < 7:
        raise ctx.fail("training-mode Dropout is not supported")
    if training is not None:
        mode = ctx.known_input(node, 2, "training_mode")
        ratio = ctx.known_input(node, 1, "ratio") if mode is not None and bool(mode) else None
        if mode is not None and bool(mode) and (ratio is None or float(ratio) != 0.0):
            raise ctx.fail("training-mode Dropout is random; knopt runs inference only")
    mask = ctx.builder.scalar(True, DType.BOOL, x.shape)
    return [x, mask]


# ---- activations with parameters -----------------------------------------------------


def _const(ctx: ImportContext, x: Value, value: float) -> Value:
    return scalar_like(ctx, x, value)


@importer("LeakyRelu")
def _leaky_relu(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    alpha = ctx.attributes(node).float("alpha", 0.01)
    b = ctx.builder
    negative = b.binary(Binary.LESS, x, _const(ctx, x, 0))
    return [b.where(negative, b.mul(x, _const(ctx, x, alpha)), x)]


@importer("PRelu")
def _prelu(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x, slope = ctx.inputs(node, count=2)
    ctx.attributes(node)
    b = ctx.builder
    negative = b.binary(Binary.LESS, x, _const(ctx, x, 0))
    return [b.where(negative, b.mul(x, slope), x)]


@importer("Elu")
def _elu(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    alpha = ctx.attributes(node).float("alpha", 1.0)
    return [_elu_of(ctx, x, alpha)]


def _elu_of(ctx: ImportContext, x: Value, alpha: float) -> Value:
    b = ctx.builder
    negative = b.binary(Binary.LESS, x, _const(ctx, x, 0))
    expm1 = b.sub(b.unary(Unary.EXP, x), _const(ctx, x, 1))
    return b.where(negative, b.mul(expm1, _const(ctx, x, alpha)), x)


@importer("Celu")
def _celu(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    alpha = ctx.attributes(node).float("alpha", 1.0)
    b = ctx.builder
    expm1 = b.sub(b.unary(Unary.EXP, b.div(x, _const(ctx, x, alpha))), _const(ctx, x, 1))
    negative = b.binary(Binary.LESS, x, _const(ctx, x, 0))
    return [b.where(negative, b.mul(expm1, _const(ctx, x, alpha)), x)]


@importer("Selu")
def _selu(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    attrs = ctx.attributes(node)
    alpha = attrs.float("alpha", 1.67326319217681884765625)
    gamma = attrs.float("gamma", 1.05070102214813232421875)
    return [ctx.builder.mul(_elu_of(ctx, x, alpha), _const(ctx, x, gamma))]


@importer("ThresholdedRelu")
def _thresholded_relu(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    alpha = ctx.attributes(node).float("alpha", 1.0)
    b = ctx.builder
    above = b.binary(Binary.GREATER, x, _const(ctx, x, alpha))
    return [b.where(above, x, _const(ctx, x, 0))]


@importer("HardSigmoid")
def _hard_sigmoid(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    attrs = ctx.attributes(node)
    alpha, beta = attrs.float("alpha", 0.2), attrs.float("beta", 0.5)
    b = ctx.builder
    linear = b.add(b.mul(x, _const(ctx, x, alpha)), _const(ctx, x, beta))
    return [b.clamp(linear, lo=0.0, hi=1.0)]


@importer("HardSwish")
def _hard_swish(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    ctx.attributes(node)
    return [ctx.builder.unary(Unary.HARD_SWISH, x)]


@importer("Softsign")
def _softsign(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    ctx.attributes(node)
    b = ctx.builder
    return [b.div(x, b.add(b.unary(Unary.ABS, x), _const(ctx, x, 1)))]


@importer("Mish")
def _mish(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    ctx.attributes(node)
    b = ctx.builder
    return [b.mul(x, b.unary(Unary.TANH, b.unary(Unary.SOFTPLUS, x)))]


@importer("Gelu", since=20)
def _gelu(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    approximate = ctx.attributes(node).string("approximate", "none")
    kinds = {"none": Unary.GELU, "tanh": Unary.GELU_TANH}
    if approximate not in kinds:
        raise ctx.fail(f"Gelu approximate='{approximate}' is not 'none' or 'tanh'")
    return [ctx.builder.unary(kinds[approximate], x)]


@importer("Swish", since=24)
def _swish(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    alpha = ctx.attributes(node).float("alpha", 1.0)
    b = ctx.builder
    if alpha == 1.0:
        return [b.unary(Unary.SILU, x)]
    return [b.mul(x, b.unary(Unary.SIGMOID, b.mul(x, _const(ctx, x, alpha))))]


@importer("Clip")
def _clip(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    attrs = ctx.attributes(node)
    if ctx.opset < 11:
        (x,) = ctx.inputs(node, count=1)
        lo = attrs.float("min", float(np.finfo(np.float32).min))
        hi = attrs.float("max", float(np.finfo(np.float32).max))
        return [ctx.builder.clamp(x, lo=lo, hi=hi)]
    x, lo_value, hi_value = ctx.inputs(node, count=(1, 3))
    lo_known = ctx.known_number(node, 1, "min") if _is_known(ctx, node, 1) else None
    hi_known = ctx.known_number(node, 2, "max") if _is_known(ctx, node, 2) else None
    b = ctx.builder
    if (lo_value is None or lo_known is not None) and (hi_value is None or hi_known is not None):
        lo = lo_known if lo_known is not None else -np.inf
        hi = hi_known if hi_known is not None else np.inf
        return [b.clamp(x, lo=lo, hi=hi)]
    result = x
    if lo_value is not None:
        result = b.binary(Binary.MAX, result, lo_value)
    if hi_value is not None:
        result = b.binary(Binary.MIN, result, hi_value)
    return [result]


def _is_known(ctx: ImportContext, node: onnx.NodeProto, index: int) -> bool:
    return (
        index < len(node.input)
        and bool(node.input[index])
        and isinstance(ctx.lookup(node.input[index]), Known)
    )


@importer("Shrink", since=9)
def _shrink(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    attrs = ctx.attributes(node)
    bias, lambd = attrs.float("bias", 0.0), attrs.float("lambd", 0.5)
    b = ctx.builder
    below = b.binary(Binary.LESS, x, _const(ctx, x, -lambd))
    above = b.binary(Binary.GREATER, x, _const(ctx, x, lambd))
    shrunk = b.where(above, b.sub(x, _const(ctx, x, bias)), _const(ctx, x, 0))
    return [b.where(below, b.add(x, _const(ctx, x, bias)), shrunk)]
