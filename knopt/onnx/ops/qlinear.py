"""Importers of the com.microsoft QLinear* ops that onnxruntime's static quantizer writes.

`quantize_static(..., quant_format=QuantFormat.QOperator)` keeps Conv and MatMul as the standard
QLinearConv and QLinearMatMul, but writes element-wise ops, pools, Concat, Softmax and Gemm as
onnxruntime contrib ops. They have no specification beyond onnxruntime's CPU kernels (MLAS), so
each importer follows its kernel's float32 arithmetic in the kernel's order: integer sums and
products, a float32 scale, round half to even, saturate. Ops whose kernel dequantizes, computes
in float and quantizes (pools, activations, Concat) are imported that way. On the x86 kernels
the results are equal to onnxruntime's, not merely within a quantization step.
"""

from __future__ import annotations

from collections.abc import Callable

import ml_dtypes
import onnx

from knopt.ir.dtype import DType
from knopt.ir.graph import Value
from knopt.ir.op import Binary, PoolKind, Reduction, Unary
from knopt.ir.shape import numel
from knopt.onnx.context import ImportContext, OnnxValue, importer
from knopt.onnx.ops.common import axis_of
from knopt.onnx.ops.nn import window_attributes
from knopt.onnx.ops.quantize import centered, per_axis, quantize_scaled

MS = "com.microsoft"
_EIGHT_BIT = frozenset({DType.U8, DType.I8})


def _dequantized(ctx: ImportContext, x: Value, scale: Value, zero_point: Value | None) -> Value:
    """`scale * (x - zero_point)` in float32."""
    b = ctx.builder
    if x.dtype not in _EIGHT_BIT:
        raise ctx.fail(f"quantized input must be uint8 or int8, got {x.dtype.short}")
    shifted = b.cast(centered(ctx, x, zero_point), DType.F32)
    return b.mul(b.cast(scale, DType.F32), shifted)


def _quantized(
    ctx: ImportContext, y: Value, scale: Value, zero_point: Value | None, dtype: DType
) -> Value:
    """Float32 `y` quantized: `y / scale` rounded, plus the zero point, saturated."""
    scaled = ctx.builder.div(y, ctx.builder.cast(scale, DType.F32))
    return quantize_scaled(ctx, scaled, zero_point, dtype, saturate=True)


def _output_type(x: Value, zero_point: Value | None) -> DType:
    return zero_point.dtype if zero_point is not None else x.dtype


def _rounded(ctx: ImportContext, y: Value, dtype: DType) -> Value:
    """Float32 `y` (zero point included) rounded half to even and saturated to `dtype`.

    NaN (from an infinite scale, as a calibrated -inf attention mask gets) becomes the lowest
    value, as MLAS's float-to-int conversion and saturating packs give.
    """
    b = ctx.builder
    info = ml_dtypes.iinfo(dtype.numpy)
    bounded = b.clamp(b.unary(Unary.ROUND, y), lo=info.min, hi=info.max)
    lowest = b.constant(info.min, DType.F32)
    return b.cast(b.where(b.unary(Unary.IS_NAN, bounded), lowest, bounded), dtype)


def _as_f32(ctx: ImportContext, v: Value | None) -> Value:
    b = ctx.builder
    return b.constant(0.0, DType.F32) if v is None else b.cast(v, DType.F32)


def _requantized(
    ctx: ImportContext, acc: Value, factor: Value, zero_point: Value | None, dtype: DType
) -> Value:
    """An integer accumulator scaled and shifted in float32, as MlasRequantizeOutput does."""
    y = ctx.builder.add(ctx.builder.mul(_as_f32(ctx, acc), factor), _as_f32(ctx, zero_point))
    return _rounded(ctx, y, dtype)


@importer("QLinearAdd", domain=MS)
def _qlinear_add(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    a, a_scale, a_zero, c, c_scale, c_zero, y_scale, y_zero = ctx.inputs(node, count=(7, 8))
    ctx.attributes(node)
    b = ctx.builder
    # MLAS's float32 kernel, in its order: y = (fixed + a * ra) + c * rc with ra = a_scale /
    # y_scale, rc = c_scale / y_scale and fixed = y_zero - (ra * a_zero + rc * c_zero).
    ratio_a, ratio_c = b.div(a_scale, y_scale), b.div(c_scale, y_scale)
    shift = b.add(b.mul(ratio_a, _as_f32(ctx, a_zero)), b.mul(ratio_c, _as_f32(ctx, c_zero)))
    fixed = b.sub(_as_f32(ctx, y_zero), shift)
    y = b.add(b.add(fixed, b.mul(_as_f32(ctx, a), ratio_a)), b.mul(_as_f32(ctx, c), ratio_c))
    return [_rounded(ctx, y, _output_type(a, y_zero))]


@importer("QLinearMul", domain=MS)
def _qlinear_mul(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    a, a_scale, a_zero, c, c_scale, c_zero, y_scale, y_zero = ctx.inputs(node, count=(7, 8))
    ctx.attributes(node)
    b = ctx.builder
    # MLAS: the exact integer product of the centered operands, scaled in float32.
    product = b.mul(centered(ctx, a, a_zero), centered(ctx, c, c_zero))
    ratio = b.div(b.mul(a_scale, c_scale), y_scale)
    return [_requantized(ctx, product, ratio, y_zero, _output_type(a, y_zero))]


def _unary(ctx: ImportContext, node: onnx.NodeProto, fn: Callable[[Value], Value]) -> Value:
    x, x_scale, x_zero, y_scale, y_zero = ctx.inputs(node, count=(4, 5))
    y = fn(_dequantized(ctx, x, x_scale, x_zero))
    return _quantized(ctx, y, y_scale, y_zero, _output_type(x, y_zero))


@importer("QLinearSigmoid", domain=MS)
def _qlinear_sigmoid(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    ctx.attributes(node)
    return [_unary(ctx, node, lambda v: ctx.builder.unary(Unary.SIGMOID, v))]


@importer("QLinearLeakyRelu", domain=MS)
def _qlinear_leaky_relu(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    alpha = ctx.attributes(node).float("alpha", 0.01)
    b = ctx.builder

    def leaky(v: Value) -> Value:
        negative = b.binary(Binary.LESS, v, b.constant(0.0, DType.F32))
        return b.where(negative, b.mul(v, b.constant(alpha, DType.F32)), v)

    return [_unary(ctx, node, leaky)]


def _channels_first(ctx: ImportContext, node: onnx.NodeProto) -> None:
    if ctx.attributes(node).int("channels_last", 0):
        raise ctx.fail("channels_last=1 is not supported; quantize the NCHW model instead")


@importer("QLinearGlobalAveragePool", domain=MS)
def _qlinear_global_average_pool(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x, x_scale, x_zero, y_scale, y_zero = ctx.inputs(node, count=5)
    _channels_first(ctx, node)
    b = ctx.builder
    axes = list(range(2, x.rank))
    count = numel([x.shape[a] for a in axes])
    if not isinstance(count, int):
        raise ctx.fail_symbolic("a mean over symbolic sizes is not supported")
    # MLAS sums the centered integers and requantizes by x_scale / (y_scale * count).
    total = b.reduce(Reduction.SUM, centered(ctx, x, x_zero), axes=axes)
    factor = b.div(x_scale, b.mul(y_scale, b.constant(count, DType.F32)))
    return [_requantized(ctx, total, factor, y_zero, _output_type(x, y_zero))]


@importer("QLinearAveragePool", domain=MS)
def _qlinear_average_pool(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x, x_scale, x_zero, y_scale, y_zero = ctx.inputs(node, count=(4, 5))
    _channels_first(ctx, node)
    attrs = ctx.attributes(node)
    kernel = attrs.ints("kernel_shape")
    strides, pads, dilations = window_attributes(ctx, attrs, x, kernel, dilations_ok=False)
    y = ctx.builder.pool(
        PoolKind.AVG,
        _dequantized(ctx, x, x_scale, x_zero),
        kernel=kernel,
        strides=strides,
        pads=tuple(pads),
        dilations=dilations,
        ceil_mode=bool(attrs.int("ceil_mode", 0)),
        count_include_pad=bool(attrs.int("count_include_pad", 0)),
    )
    return [_quantized(ctx, y, y_scale, y_zero, _output_type(x, y_zero))]


@importer("QLinearConcat", domain=MS)
def _qlinear_concat(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    y_scale, y_zero, *rest = ctx.inputs(node, count=(5, None))
    if len(rest) % 3:
        raise ctx.fail("QLinearConcat takes (input, scale, zero point) triples after Y's")
    axis = ctx.attributes(node).int("axis")
    b = ctx.builder
    parts = []
    for x, x_scale, x_zero in zip(rest[0::3], rest[1::3], rest[2::3], strict=True):
        # Requantized through float32, as onnxruntime's per-input lookup tables are built.
        y = _dequantized(ctx, x, x_scale, x_zero)
        parts.append(_quantized(ctx, y, y_scale, y_zero, y_zero.dtype))
    return [b.concat(parts, axis=axis_of(ctx, axis, parts[0].rank))]


@importer("QGemm", domain=MS)
def _qgemm(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    a, a_scale, a_zero, w, w_scale, w_zero, c, y_scale, y_zero = ctx.inputs(node, count=(6, 9))
    attrs = ctx.attributes(node)
    alpha = attrs.float("alpha", 1.0)
    b = ctx.builder
    if attrs.int("transA", 0):
        a = b.permute(a, (1, 0))
    if attrs.int("transB", 0):
        w = b.permute(w, (1, 0))
    if w_zero is not None:
        w_zero = per_axis(ctx, w_zero, w, 1)
    acc = b.matmul(centered(ctx, a, a_zero), centered(ctx, w, w_zero))
    if c is not None:
        acc = b.add(acc, b.cast(c, DType.I32))
    # The kernel's per-column factor is alpha * a_scale * b_scale (/ y_scale), in float32.
    factor = b.mul(b.mul(b.constant(alpha, DType.F32), a_scale), per_axis(ctx, w_scale, w, 1))
    if y_scale is not None:
        factor = b.div(factor, y_scale)
    if y_zero is None:  # onnxruntime writes float32 whenever Y has no zero point
        return [b.mul(b.cast(acc, DType.F32), factor)]
    return [_requantized(ctx, acc, factor, y_zero, y_zero.dtype)]


@importer("QLinearSoftmax", domain=MS)
def _qlinear_softmax(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x, x_scale, _, y_scale, y_zero = ctx.inputs(node, count=(4, 5))
    attrs = ctx.attributes(node)
    opset = attrs.int("opset")
    axis = axis_of(ctx, attrs.int("axis", -1 if opset >= 13 else 1), x.rank)
    b = ctx.builder
    shape = x.shape
    if opset < 13:  # the old Softmax: the input flattened to 2-D at `axis`
        x = b.view(x, (numel(shape[:axis]), numel(shape[axis:])))
        axis = 1
    if x.dtype not in _EIGHT_BIT:
        raise ctx.fail(f"quantized input must be uint8 or int8, got {x.dtype.short}")
    # onnxruntime's kernel: e_i = exp((x_i - max x) * x_scale) (its table's extra constant
    # factor cancels), y_i = round(e_i * floor(1 / y_scale) / sum e) + y_zero. The zero point
    # of x drops out of x_i - max x, and floor(1 / y_scale) is what the kernel multiplies by.
    wide = b.cast(x, DType.I32)
    peak = b.reduce(Reduction.MAX, wide, axes=[axis])
    exps = b.unary(
        Unary.EXP, b.mul(b.cast(b.sub(wide, peak), DType.F32), b.cast(x_scale, DType.F32))
    )
    total = b.reduce(Reduction.SUM, exps, axes=[axis])
    inverse = b.unary(Unary.FLOOR, b.div(b.constant(1.0, DType.F32), y_scale))
    y = b.div(b.mul(exps, inverse), total)
    quantized = quantize_scaled(ctx, y, y_zero, _output_type(x, y_zero), saturate=True)
    return [b.view(quantized, shape)]
