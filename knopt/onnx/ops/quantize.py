"""Importers of ONNX quantization ops.

They are (Dynamic)QuantizeLinear, DequantizeLinear and the integer and QLinear forms of MatMul
and Conv.

All follow the ONNX reference implementation: integer products accumulate in int32, requantizing
scales the int32 result in float64 (as numpy promotes `int32 * float32`), rounds half to even and
saturates to the target's range.
"""

from __future__ import annotations

import ml_dtypes
import onnx

from knopt.ir.dtype import DType
from knopt.ir.graph import Value
from knopt.ir.op import Binary, Reduction, Unary
from knopt.onnx.context import ImportContext, OnnxValue, importer
from knopt.onnx.ops.common import axis_of, matmul, scalar_like
from knopt.onnx.ops.elementwise import cast_to
from knopt.onnx.ops.nn import window_attributes

_FLOAT8 = frozenset({DType.F8E4M3FN, DType.F8E4M3FNUZ, DType.F8E5M2, DType.F8E5M2FNUZ})
_QUANTIZED = frozenset(
    {DType.U8, DType.I8, DType.U16, DType.I16, DType.U4, DType.I4, DType.U2, DType.I2}
    | _FLOAT8
    | {DType.F4E2M1}
)


def _range(dtype: DType) -> tuple[float, float]:
    info = ml_dtypes.iinfo(dtype.numpy)
    return float(info.min), float(info.max)


def per_axis(ctx: ImportContext, v: Value, x: Value, axis: int, block: int = 0) -> Value:
    """A scale or zero point shaped to broadcast against `x`: scalar, per axis or per block."""
    b = ctx.builder
    if v.rank == 0:
        return v
    if v.rank == 1 and v.shape[0] == 1:
        return b.view(v, ())
    axis = axis_of(ctx, axis, x.rank)
    if not block:
        if v.rank != 1:
            raise ctx.fail(f"a per-axis scale or zero point must be 1-D, got {v.type}")
        return b.view(v, tuple(v.shape[0] if i == axis else 1 for i in range(x.rank)))
    # Blocked: every entry covers `block` consecutive elements of `axis` (the last may be short).
    count = v.shape[axis]
    grown = b.view(v, (*v.shape[: axis + 1], 1, *v.shape[axis + 1 :]))
    spread = b.broadcast(grown, (*v.shape[: axis + 1], block, *v.shape[axis + 1 :]))
    merged = b.view(spread, (*v.shape[:axis], count * block, *v.shape[axis + 1 :]))
    return b.slice(merged, axis=axis, start=0, stop=x.shape[axis])


def quantize_scaled(
    ctx: ImportContext, scaled: Value, zero_point: Value | None, dtype: DType, saturate: bool
) -> Value:
    """`x / scale` (already divided) rounded, shifted by the zero point and saturated."""
    b = ctx.builder
    if dtype in _FLOAT8:
        return cast_to(ctx, scaled, dtype, saturate)
    if dtype is DType.F4E2M1:
        if zero_point is not None:
            scaled = b.add(scaled, b.cast(zero_point, scaled.dtype))
        return b.cast(scaled, dtype)  # float4 has no infinities: the cast saturates
    # Saturate while still a float: an infinity or a value beyond int32 (a -inf attention mask)
    # has no int32 to pass through. NaN becomes the lowest value, as onnxruntime gives.
    wide = scaled if scaled.dtype in (DType.F32, DType.F64) else b.cast(scaled, DType.F32)
    whole = b.unary(Unary.ROUND, wide)
    if zero_point is not None:
        whole = b.add(whole, b.cast(zero_point, wide.dtype))
    lo, hi = _range(dtype)
    bounded = b.clamp(whole, lo=lo, hi=hi)
    lowest = b.constant(lo, wide.dtype)
    bounded = b.where(b.unary(Unary.IS_NAN, bounded), lowest, bounded)
    return b.cast(b.cast(bounded, DType.I32), dtype)


@importer("QuantizeLinear", since=10)
def _quantize_linear(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x, scale, zero_point = ctx.inputs(node, count=(2, 3))
    attrs = ctx.attributes(node)
    axis = attrs.int("axis", 1) if ctx.opset >= 13 else 1
    saturate = bool(attrs.int("saturate", 1)) if ctx.opset >= 19 else True
    block = attrs.int("block_size", 0) if ctx.opset >= 21 else 0
    dtype = DType.U8
    if ctx.opset >= 21 and attrs.has("output_dtype"):
        dtype = DType.from_onnx(attrs.int("output_dtype"), ctx.where)
    if zero_point is not None:
        dtype = zero_point.dtype
    if dtype not in _QUANTIZED:
        raise ctx.fail(f"cannot quantize to {dtype.short}")
    b = ctx.builder
    if ctx.opset >= 23 and attrs.has("precision"):
        precision = DType.from_onnx(attrs.int("precision"), ctx.where)
        x, scale = b.cast(x, precision), b.cast(scale, precision)
    elif scale.dtype is not x.dtype:
        x, scale = b.cast(x, DType.F32), b.cast(scale, DType.F32)
    scaled = b.div(x, per_axis(ctx, scale, x, axis, block))
    zp = None if zero_point is None else per_axis(ctx, zero_point, x, axis, block)
    return [quantize_scaled(ctx, scaled, zp, dtype, saturate)]


@importer("DequantizeLinear", since=10)
def _dequantize_linear(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x, scale, zero_point = ctx.inputs(node, count=(2, 3))
    attrs = ctx.attributes(node)
    axis = attrs.int("axis", 1) if ctx.opset >= 13 else 1
    block = attrs.int("block_size", 0) if ctx.opset >= 21 else 0
    dtype = scale.dtype
    if ctx.opset >= 23 and attrs.has("output_dtype") and attrs.int("output_dtype"):
        dtype = DType.from_onnx(attrs.int("output_dtype"), ctx.where)
    b = ctx.builder
    shifted = b.cast(x, DType.F32)
    if zero_point is not None and x.dtype not in _FLOAT8 | {DType.F4E2M1}:
        shifted = b.sub(shifted, b.cast(per_axis(ctx, zero_point, x, axis, block), DType.F32))
    factor = b.cast(per_axis(ctx, scale, x, axis, block), DType.F32)
    return [b.cast(b.mul(shifted, factor), dtype)]


@importer("DynamicQuantizeLinear", since=11)
def _dynamic_quantize_linear(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    ctx.attributes(node)
    b = ctx.builder
    axes = list(range(x.rank))
    zero = scalar_like(ctx, x, 0)
    high = b.view(b.binary(Binary.MAX, b.reduce(Reduction.MAX, x, axes=axes), zero), ())
    low = b.view(b.binary(Binary.MIN, b.reduce(Reduction.MIN, x, axes=axes), zero), ())
    span = b.where(b.binary(Binary.EQUAL, high, low), scalar_like(ctx, x, 1), b.sub(high, low))
    scale = b.div(span, scalar_like(ctx, x, 255))
    start = b.clamp(b.sub(zero, b.div(low, scale)), lo=0, hi=255)
    zero_point = b.unary(Unary.ROUND, start)
    y = b.add(b.unary(Unary.ROUND, b.div(x, scale)), zero_point)
    return [
        b.cast(b.clamp(y, lo=0, hi=255), DType.U8),
        scale,
        b.cast(zero_point, DType.U8),
    ]


def centered(ctx: ImportContext, x: Value, zero_point: Value | None) -> Value:
    """`x - zero_point` in int32."""
    b = ctx.builder
    wide = b.cast(x, DType.I32)
    return wide if zero_point is None else b.sub(wide, b.cast(zero_point, DType.I32))


def requantize(
    ctx: ImportContext, acc: Value, factor: Value, zero_point: Value | None, dtype: DType
) -> Value:
    """An int32 accumulator scaled (in float64), shifted, rounded and saturated to `dtype`."""
    b = ctx.builder
    y = b.mul(b.cast(acc, DType.F64), b.cast(factor, DType.F64))
    if zero_point is not None:
        y = b.add(y, b.cast(zero_point, DType.F64))
    lo, hi = _range(dtype)
    return b.cast(b.clamp(b.unary(Unary.ROUND, y), lo=lo, hi=hi), dtype)


@importer("MatMulInteger", since=10)
def _matmul_integer(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    a, w, a_zero, w_zero = ctx.inputs(node, count=(2, 4))
    ctx.attributes(node)
    return [matmul(ctx, centered(ctx, a, a_zero), centered(ctx, w, w_zero))]


@importer("QLinearMatMul", since=10)
def _qlinear_matmul(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    a, a_scale, a_zero, w, w_scale, w_zero, y_scale, y_zero = ctx.inputs(node, count=8)
    ctx.attributes(node)
    b = ctx.builder
    acc = matmul(ctx, centered(ctx, a, a_zero), centered(ctx, w, w_zero))
    factor = b.div(b.mul(a_scale, w_scale), y_scale)
    return [requantize(ctx, acc, factor, y_zero, y_zero.dtype)]


def _integer_conv(
    ctx: ImportContext, node: onnx.NodeProto, x: Value, w: Value, w_zero: Value | None
) -> Value:
    """The int32 convolution of centered `x` with `w` minus its (per-channel) zero point."""
    b = ctx.builder
    attrs = ctx.attributes(node)
    kernel = attrs.ints("kernel_shape", [int(d) for d in w.shape[2:]])  # type: ignore[arg-type]
    strides, pads, dilations = window_attributes(ctx, attrs, x, kernel)
    weights = b.cast(w, DType.I32)
    if w_zero is not None:
        if w_zero.rank == 1 and w_zero.shape[0] != 1:
            w_zero = b.view(w_zero, (w_zero.shape[0], *(1,) * (w.rank - 1)))
        weights = b.sub(weights, b.cast(w_zero, DType.I32))
    return b.conv(
        x,
        weights,
        strides=strides,
        pads=tuple(pads),
        dilations=dilations,
        groups=attrs.int("group", 1),
    )


@importer("ConvInteger", since=10)
def _conv_integer(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x, w, x_zero, w_zero = ctx.inputs(node, count=(2, 4))
    return [_integer_conv(ctx, node, centered(ctx, x, x_zero), w, w_zero)]


@importer("QLinearConv", since=10)
def _qlinear_conv(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x, x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero, bias = ctx.inputs(node, count=(8, 9))
    b = ctx.builder
    acc = _integer_conv(ctx, node, centered(ctx, x, x_zero), w, w_zero)
    if bias is not None:
        acc = b.add(acc, b.view(b.cast(bias, DType.I32), (bias.shape[0], *(1,) * (acc.rank - 2))))
    if w_scale.rank == 1 and w_scale.shape[0] != 1:
        w_scale = b.view(w_scale, (w_scale.shape[0], *(1,) * (acc.rank - 2)))
    factor = b.div(b.mul(x_scale, w_scale), y_scale)
    return [requantize(ctx, acc, factor, y_zero, y_zero.dtype if y_zero is not None else x.dtype)]
