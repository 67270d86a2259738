"""Moves for quantized arithmetic: the integer product ops, and QDQ spellings of models.

The QDQ moves spell quantization as knopt's importer does (knopt/onnx/ops/quantize.py and
nbits.py), so that the rules of rules/quantize.egg fire in drawn graphs. Quantizing rounds,
so only exact values are quantized; what the integer products make is dequantized again
(inexact), and nothing downstream rounds it.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from knopt.ir.dtype import DType
from knopt.ir.graph import Value
from knopt.ir.op import INT4_BLOCKS, Binary, Unary
from knopt.testing.generator import GraphGen, static_shape

EIGHT_BIT = (DType.U8, DType.I8)


def _codes(gen: GraphGen, shape: tuple[int, ...], dtype: DType) -> Value:
    """A constant of random 8-bit codes (every value possible)."""
    info = ml_dtypes.iinfo(dtype.numpy)
    array = gen.rng.integers(info.min, int(info.max) + 1, shape).astype(dtype.numpy)
    return gen.builder.constant(array)


def _zero(gen: GraphGen, dtype: DType) -> Value:
    """A scalar zero point: 0 (symmetric), or any value of the type."""
    info = ml_dtypes.iinfo(dtype.numpy)
    value = 0 if gen.boolean(0.3) else gen.integer(int(info.min), int(info.max))
    return gen.builder.constant(np.array(value, dtype=dtype.numpy))


def _scale(gen: GraphGen) -> float:
    return float(gen.choose((0.02, 0.0625, 0.1, 0.0137)))


def _dequantized(gen: GraphGen, q: Value, zero: Value, scale: Value) -> Value:
    """`(q - zero) * scale` as the importer spells DequantizeLinear."""
    g = gen.builder
    shifted = g.sub(g.cast(q, gen.main), g.cast(zero, gen.main))
    return g.mul(shifted, scale)


def int_products(gen: GraphGen) -> Value | None:
    """IntMatMul or IntConv of 8-bit inputs and constants, dequantized by a float scale."""
    g = gen.builder
    ta, tb = gen.choose(EIGHT_BIT), gen.choose(EIGHT_BIT)
    if gen.boolean():
        m, k, n = gen.dim(), gen.dim(), gen.dim()
        lead = gen.shape(gen.integer(0, 1))
        a = gen.input((*lead, m, k), ta)
        b = _codes(gen, (k, n), tb)
        if lead:
            b = g.broadcast(b, (*lead, k, n))
        acc = g.int_matmul(a, b, _zero(gen, ta), _zero(gen, tb))
    else:
        channels, out = gen.integer(1, 3), gen.integer(1, 3)
        x = gen.input((gen.integer(1, 2), channels, *gen.shape(2)), ta)
        kernel = (gen.integer(1, 2), gen.integer(1, 2))
        if any(d < k for d, k in zip(static_shape(x)[2:], kernel, strict=True)):
            return None
        w = _codes(gen, (out, channels, *kernel), tb)
        pads = ((gen.integer(0, 1), 0), (0, gen.integer(0, 1)))
        acc = g.int_conv(
            x, w, _zero(gen, ta), _zero(gen, tb), strides=(1, 1), pads=pads, dilations=(1, 1)
        )
    return gen.add(g.mul(g.cast(acc, gen.main), gen.splat(_scale(gen))))


def int4_matmul(gen: GraphGen) -> Value | None:
    """Int4MatMul of a float value with random packed codes, scales and zero points."""
    g = gen.builder
    x = gen.float_value(min_rank=2)
    k = static_shape(x)[-1]
    n, block = gen.dim(), gen.choose(INT4_BLOCKS[:2])
    blocks = math.ceil(k / block)
    packed = _codes(gen, (n, blocks, block // 2), DType.U8)
    scales = gen.constant((n, blocks), positive=True)
    zeros = _codes(gen, (n, math.ceil(blocks / 2)), DType.U8)
    return gen.add(g.int4_matmul(x, packed, g.mul(scales, gen.splat(0.05)), zeros, block=block))


def _round_to_codes(gen: GraphGen, x: Value, scale: Value, zero: Value, dtype: DType) -> Value:
    """QuantizeLinear as the importer spells it (saturating, NaN to the lowest code)."""
    g = gen.builder
    info = ml_dtypes.iinfo(dtype.numpy)
    whole = g.add(g.unary(Unary.ROUND, g.div(x, scale)), g.cast(zero, x.dtype))
    bounded = g.clamp(whole, lo=float(info.min), hi=float(info.max))
    lowest = g.constant(np.array(info.min, dtype=x.dtype.numpy))
    bounded = g.where(g.unary(Unary.IS_NAN, bounded), lowest, bounded)
    return g.cast(g.cast(bounded, DType.I32), dtype)


def qdq_matmul(gen: GraphGen) -> Value | None:
    """A QDQ MatMul: quantized activations times a dequantized 8-bit weight, with a bias."""
    g = gen.builder
    entry = gen.pick("float", exact=True, min_rank=2)
    if entry is None:
        return None
    x = entry.value
    ta, tb = gen.choose(EIGHT_BIT), gen.choose(EIGHT_BIT)
    zx, sx = _zero(gen, ta), gen.splat(_scale(gen))
    xd = _dequantized(gen, _round_to_codes(gen, x, sx, zx, ta), zx, sx)
    k, n = static_shape(x)[-1], gen.dim()
    w = _codes(gen, (k, n), tb)
    if gen.boolean():  # per output channel
        zw = g.constant(gen.rng.integers(0, 3, (n,)).astype(tb.numpy))
        sw = g.mul(gen.constant((n,), positive=True), gen.splat(0.01))
    else:
        zw, sw = _zero(gen, tb), gen.splat(_scale(gen))
    wd = _dequantized(gen, w, zw, sw)
    if x.rank > 2:
        wd = g.broadcast(wd, (*x.shape[:-2], k, n))
    y = g.matmul(xd, wd)
    if gen.boolean():
        y = g.add(y, gen.constant((n,)))
    return gen.add(y)


def matmul_integer(gen: GraphGen) -> Value | None:
    """MatMulInteger as the importer spells it: int32 products of centered 8-bit operands."""
    g = gen.builder
    ta, tb = gen.choose(EIGHT_BIT), gen.choose(EIGHT_BIT)
    m, k, n = gen.dim(), gen.dim(), gen.dim()
    a = gen.input((m, k), ta)
    centered_a = g.sub(g.cast(a, DType.I32), g.cast(_zero(gen, ta), DType.I32))
    w = _codes(gen, (k, n), tb)
    centered_w = g.sub(g.cast(w, DType.I32), g.cast(_zero(gen, tb), DType.I32))
    acc = g.matmul(centered_a, centered_w)
    return gen.add(g.binary(Binary.MUL, g.cast(acc, gen.main), gen.splat(_scale(gen))))
