"""Quantizations written as QuantizeLinear and DequantizeLinear.

The importer writes QuantizeLinear out as its formula (`x / scale` rounded half to even, plus
the zero point, NaN taken to the lowest code, saturated to 8 bits) and DequantizeLinear as
`(q - zero) * scale`. rules/quantize.egg shortens a quantization that is dequantized at once
to a float spelling of `q - zero` (the rounding saturated to the 8-bit range less the zero
point) times a scale, and the optimizer moves the saturation, the NaN test and the zero point
around, and the division by the scale into a product (or into the weights of a Conv or MatMul
before it). The patterns here read every such spelling:

- the rounding, saturated to an 8-bit type's range and cast to it: QuantizeLinear;
- `(q - zero) * scale` of an 8-bit q, or `q * scale - zero * scale`: DequantizeLinear;
- the float spelling times a scale: QuantizeLinear then DequantizeLinear.

The value rounded is `x / scale` (QuantizeLinear's own division, kept), or anything else divided
by 1: a product `x * c` stays a Mul before the quantization, exactly what the optimizer made of
the division (`x / s` and `x * (1 / s)` round apart at ties). Except where x is made by an op
onnxruntime fuses with the quantization after it (`QUANTIZED_OPS`: its QDQ node groups, which
`knopt.onnx.export_qdq` completes): there c becomes the quantization's scale, `1 / c`. A Mul
between the op and its QuantizeLinear would keep onnxruntime from fusing them (the op would run
in float, then the Mul), and the fused integer kernel rounds in its own way anyway. A sum over
axes times c is written as their mean, quantized with the scale `1 / (c N)`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.graph import Node, Value
from knopt.ir.op import Binary, Reduction, Unary
from knopt.onnx.export_fused import Patterns, is_binary, mean, operand_pairs, splat
from knopt.onnx.writer import Rep, Writer

_QUANTIZED = {DType.I8: (-128.0, 127.0), DType.U8: (0.0, 255.0)}
_LEVELS = 255.0  # an 8-bit range spans 255 steps

# Ops whose output quantization onnxruntime fuses into the op or moves across it (its QDQ
# node-group selectors: QLinearConv, QGemm, QLinearMatMul, QLinearAdd, QLinearMul,
# QLinearConcat, QLinearAveragePool, QLinearGlobalAveragePool, QLinearSigmoid,
# QLinearSoftmax, QLinearWhere, and MaxPool, Reshape, Transpose and Resize run on the codes).
QUANTIZED_OPS = frozenset(
    {
        "Add",
        "AveragePool",
        "Concat",
        "Conv",
        "Gemm",
        "GlobalAveragePool",
        "MatMul",
        "MaxPool",
        "Mul",
        "Reshape",
        "Resize",
        "Sigmoid",
        "Softmax",
        "Transpose",
        "Where",
    }
)


@dataclass(frozen=True)
class _Rounding:
    """`clamp(round(x) + zero, lo, hi)`, NaN taken to lo: the codes of a quantization."""

    x: Value
    rounding: Node  # the ROUND node
    zero: float
    lo: float
    hi: float


def _unary_of(value: Value, kind: Unary) -> Value | None:
    op = value.producer.op
    if isinstance(op, ops.UnaryOp) and op.kind is kind:
        return value.producer.inputs[0]
    return None


def _nan_to(w: Writer, value: Value) -> tuple[Value, float] | None:
    """(a, k) when `value` is `where(isnan(a), k, a)`."""
    select = value.producer
    if not isinstance(select.op, ops.Where):
        return None
    condition, replacement, a = select.inputs
    k = splat(w, replacement)
    if _unary_of(condition, Unary.IS_NAN) is not a or k is None:
        return None
    return a, k


def _rounding(w: Writer, value: Value) -> _Rounding | None:
    """The codes `value` holds, whichever order the NaN test and the saturation come in."""
    bounded, nan = value, None
    if (found := _nan_to(w, value)) is not None:
        bounded, nan = found
    clamp = bounded.producer.op
    if not isinstance(clamp, ops.Clamp):
        return None
    shifted = bounded.producer.inputs[0]
    if nan is None and (found := _nan_to(w, shifted)) is not None:
        shifted, nan = found[0], min(max(found[1], clamp.lo), clamp.hi)  # clamped after
    if nan != clamp.lo:
        return None
    rounded, zero = shifted, 0.0
    if is_binary(shifted.producer, Binary.ADD):
        for candidate, shift in operand_pairs(shifted.producer):
            if _unary_of(candidate, Unary.ROUND) is not None and splat(w, shift) is not None:
                rounded, zero = candidate, splat(w, shift) or 0.0
    x = _unary_of(rounded, Unary.ROUND)
    if x is None or x.dtype is not DType.F32:
        return None
    return _Rounding(x, rounded.producer, zero, clamp.lo, clamp.hi)


def _divided(w: Writer, rounding: _Rounding) -> tuple[str, float]:
    """The ONNX value a quantization divides, and by what (see the module docstring)."""
    x, reader = rounding.x, rounding.rounding
    if is_binary(x.producer, Binary.DIV) and (scale := splat(w, x.producer.inputs[1])):
        return w.exact(x.producer.inputs[0]), scale
    if is_binary(x.producer, Binary.MUL) and w.only_read_by(x, reader):
        for y, factor in operand_pairs(x.producer):
            c = splat(w, factor)
            if c is None or not c > 0 or not math.isfinite(1 / c):
                continue
            if (averaged := _averaged(w, y, x.producer, c)) is not None:
                return averaged
            name = w.rep(y).name
            producer = w.em.producer(name) if name is not None else None
            if producer is not None and producer.op_type in QUANTIZED_OPS:
                return w.exact(y), float(np.float32(1 / c))
    return w.exact(x), 1.0


def _averaged(w: Writer, total: Value, reader: Node, c: float) -> tuple[str, float] | None:
    """A sum of N elements times c: their mean, divided by `1 / (c N)`."""
    reduce = total.producer
    op = reduce.op
    if not isinstance(op, ops.Reduce) or op.kind is not Reduction.SUM:
        return None
    (x,) = reduce.inputs
    count = math.prod(x.shape[a] for a in op.axes)
    if not w.only_read_by(total, reader) or not isinstance(count, int) or count == 0:
        return None
    return mean(w, x, op.axes), float(np.float32(1 / (c * count)))


def _quantize_linear(w: Writer, node: Node) -> Rep | None:
    """The codes saturated to an 8-bit type's range, cast to it: QuantizeLinear.

    Exact: QuantizeLinear rounds half to even as ROUND does, adds the zero point, saturates and
    takes NaN to the lowest code, as the Where does.
    """
    op = node.op
    if not isinstance(op, ops.Cast) or op.dtype not in _QUANTIZED:
        return None
    (wide,) = node.inputs
    if isinstance(wide.producer.op, ops.Cast) and wide.producer.op.dtype is DType.I32:
        wide = wide.producer.inputs[0]  # the importer's spelling goes through int32
    rounding = _rounding(w, wide)
    if rounding is None or (rounding.lo, rounding.hi) != _QUANTIZED[op.dtype]:
        return None
    lo, hi = _QUANTIZED[op.dtype]
    if rounding.zero != round(rounding.zero) or not lo <= rounding.zero <= hi:
        return None
    x, scale = _divided(w, rounding)
    args = [x, w.em.scalar(scale, DType.F32), w.em.scalar(rounding.zero, op.dtype)]
    return w.output(node, w.em.op("QuantizeLinear", args))


def _fake_quantized(w: Writer, node: Node) -> Rep | None:
    """`clamp(round(x), lo, hi) * scale` with NaN taken to lo, over 256 levels: Q then DQ.

    The bounds are the 8-bit type's less the zero point, so `lo` gives the zero point (of int8
    or uint8, whichever is smaller). The scale is one number, or varies along one axis (a
    per-channel scale of the next op folded in): DequantizeLinear's `axis`. Exact:
    QuantizeLinear saturates to [lo + zero, hi + zero] and takes NaN to the lowest code;
    DequantizeLinear subtracts the zero point again and scales.
    """
    if not is_binary(node, Binary.MUL):
        return None
    for codes, factor in operand_pairs(node):
        scales = _scales(w, factor, node.output.rank)
        rounding = _rounding(w, codes)
        if scales is None or rounding is None or rounding.hi - rounding.lo != _LEVELS:
            continue
        if rounding.zero != 0:
            continue
        # Either type spells the range; the smaller zero point is the exporter's usual choice.
        dtype = min(_QUANTIZED, key=lambda t: abs(_QUANTIZED[t][0] - rounding.lo))
        zero = _QUANTIZED[dtype][0] - rounding.lo
        lo, hi = _QUANTIZED[dtype]
        if zero != round(zero) or not lo <= zero <= hi:
            continue
        scale, axis = scales
        zero_point = w.em.scalar(zero, dtype)
        x, divisor = _divided(w, rounding)
        q = w.em.op("QuantizeLinear", [x, w.em.scalar(divisor, DType.F32), zero_point])
        if axis is not None:
            zero_point = w.em.constant(np.full(scale.shape, zero, dtype.numpy))
        args = [q, w.em.constant(scale), zero_point]
        return w.output(node, w.em.op("DequantizeLinear", args, axis=axis))
    return None


def _scales(w: Writer, factor: Value, rank: int) -> tuple[np.ndarray, int | None] | None:
    """A dequantization's scale: (one positive number, None) or (a vector, the axis it is on)."""
    rep = w.rep(factor)
    if rep.array is None or rep.array.dtype != np.float32 or not np.all(rep.array > 0):
        return None
    if rep.array.size == 1:
        return rep.array.reshape(()), None
    varying = [a for a, size in enumerate(rep.shape) if size != 1]
    if len(varying) != 1 or len(rep.shape) > rank:
        return None
    return rep.array.reshape(-1), rank - len(rep.shape) + varying[0]


def _dequantize_linear(w: Writer, node: Node) -> Rep | None:
    """`(q - zero) * scale` of an 8-bit q, or `q * scale - zero * scale`: DequantizeLinear."""
    product, offset = node, 0.0
    if is_binary(node, Binary.ADD):
        for candidate, shift in operand_pairs(node):
            if is_binary(candidate.producer, Binary.MUL) and (found := splat(w, shift)) is not None:
                product, offset = candidate.producer, found
                break
        else:
            return None
    if not is_binary(product, Binary.MUL):
        return None
    for shifted, factor in operand_pairs(product):
        scale = splat(w, factor)
        if not scale:
            continue
        zero, widened = -offset / scale, shifted
        if product is node and is_binary(shifted.producer, Binary.SUB):
            widened, shift = shifted.producer.inputs
            zero = splat(w, shift) or 0.0
        operands = _dequantized(w, widened, zero)
        if operands is not None:
            args = [operands[0], w.em.scalar(scale, DType.F32), operands[1]]
            return w.output(node, w.em.op("DequantizeLinear", args))
    return None


def _dequantized(w: Writer, widened: Value, zero: float) -> tuple[str, str] | None:
    """The 8-bit value `widened` is cast from, and `zero` as its zero point, if it fits."""
    cast = widened.producer
    if not isinstance(cast.op, ops.Cast) or cast.op.dtype is not DType.F32:
        return None
    (q,) = cast.inputs
    if q.dtype not in _QUANTIZED or zero != round(zero):
        return None
    lo, hi = _QUANTIZED[q.dtype]
    if not lo <= zero <= hi:
        return None
    return w.exact(q), w.em.scalar(zero, q.dtype)


QUANTIZE_PATTERNS: Patterns = {
    ops.BinaryOp: [_dequantize_linear, _fake_quantized],
    ops.Cast: [_quantize_linear],
}
