"""Importer of onnxruntime's weight-only quantized MatMul, `com.microsoft.MatMulNBits`.

This is what onnxruntime's 4-bit weight quantizer (`MatMulNBitsQuantizer`) writes by default:
`Y = A @ dequantize(B).T + bias`, where B holds the weight transposed, `[N, K]`, quantized in
blocks of `block_size` consecutive elements along K, each block with its own scale and zero
point:

- B is uint8 `[N, k_blocks, blob_size]`, `blob_size = block_size * bits / 8`; the codes of one
  byte are packed low bits first (4-bit: element 2i in the low nibble, 2i + 1 in the high one).
  K is padded with zeros up to `k_blocks * block_size`.
- scales have A's type, `[N, k_blocks]` (or flat).
- zero points are either packed like B, uint8 `[N, ceil(k_blocks * bits / 8)]`, or unpacked in a
  float type, `[N, k_blocks]`; absent, every zero point is `2^(bits - 1)`.
- the weight is `(code - zero_point) * scale`.

The import keeps B packed as a constant and unpacks it in the graph (shifts and masks of the
uint8 bytes, a cast, the scale multiply, a MatMul), so the int4 bytes stay what is stored and the
optimizer can recognise the pattern as a weight-only int4 GEMM (#14).

Arithmetic: codes and zero points are small integers, exact in float32; `(code - zero_point)`
is exact for packed zero points and rounds once for float ones; the weight rounds once at the
scale multiply; the product accumulates in float32 and is cast back to A's type, as onnxruntime's
CPU kernel does for float32 and float16 inputs (equal within float32 summation order).

`accuracy_level` (0 unset, 1 fp32, 2 fp16, 3 bf16, 4 int8) is the *lowest* precision the model
allows for A inside the product. knopt reads it and always computes at full precision, like
level 0: onnxruntime's CPU provider at level 4 quantizes each block of A to int8 on processors
with integer dot-product instructions, so its result differs from the full-precision one by
about the int8 rounding of A (under 1% of the output's magnitude), and from machine to machine.

The deprecated `g_idx` input (act-order GPTQ) is refused.
"""

from __future__ import annotations

import onnx

from knopt.ir.dtype import DType
from knopt.ir.graph import Value
from knopt.ir.op import Binary
from knopt.onnx.context import ImportContext, OnnxValue, importer
from knopt.onnx.ops.common import matmul

MS = "com.microsoft"
BITS = (2, 4, 8)
_FLOATS = frozenset({DType.F32, DType.F16, DType.BF16})


def unpack_codes(ctx: ImportContext, packed: Value, bits: int) -> Value:
    """uint8 bytes `[..., n]` unpacked into their `bits`-wide codes `[..., n * 8 / bits]`.

    Codes are packed low bits first, as MatMulNBits stores B and its zero points.
    """
    b = ctx.builder
    if bits == 8:
        return packed
    mask = b.constant((1 << bits) - 1, DType.U8)
    parts = []
    for shift in range(0, 8, bits):
        part = packed
        if shift:
            part = b.binary(Binary.SHIFT_RIGHT, part, b.constant(shift, DType.U8))
        if shift + bits < 8:  # the top code has no bits above it to clear
            part = b.binary(Binary.BITWISE_AND, part, mask)
        parts.append(b.view(part, (*packed.shape, 1)))
    codes = b.concat(parts, axis=packed.rank)
    return b.view(codes, (*packed.shape[:-1], packed.shape[-1] * len(parts)))


def _per_block(ctx: ImportContext, v: Value, n: int, blocks: int, what: str) -> Value:
    """A scale or unpacked zero point `[N, k_blocks]` (or flat) as `[N, k_blocks, 1]`."""
    if v.shape not in ((n, blocks), (n * blocks,)):
        raise ctx.fail(f"{what} must be [{n}, {blocks}] (N, k_blocks), got {list(v.shape)}")
    return ctx.builder.view(v, (n, blocks, 1))


def _zero_points(
    ctx: ImportContext, zero_points: Value | None, n: int, blocks: int, bits: int
) -> Value:
    """The zero points in float32, `[N, k_blocks, 1]` (or one scalar when absent)."""
    b = ctx.builder
    if zero_points is None:
        return b.constant(float(1 << (bits - 1)), DType.F32)
    if zero_points.dtype is not DType.U8:
        if zero_points.dtype not in _FLOATS:
            raise ctx.fail(f"zero points must be uint8 or float, got {zero_points.dtype.short}")
        return b.cast(_per_block(ctx, zero_points, n, blocks, "zero points"), DType.F32)
    width = -(-blocks * bits // 8)
    if zero_points.shape not in ((n, width), (n * width,)):
        raise ctx.fail(
            f"packed zero points must be [{n}, {width}] (N, ceil(k_blocks * bits / 8)), "
            f"got {list(zero_points.shape)}"
        )
    codes = unpack_codes(ctx, b.view(zero_points, (n, width)), bits)
    codes = b.slice(codes, axis=1, start=0, stop=blocks)  # the last byte may be half used
    return b.cast(b.view(codes, (n, blocks, 1)), DType.F32)


def _check_attributes(ctx: ImportContext, k: int, n: int, bits: int, block: int) -> None:
    if bits not in BITS:
        raise ctx.fail(f"bits={bits} is not supported ({', '.join(map(str, BITS))})")
    if block < 16 or block & (block - 1):
        raise ctx.fail(f"block_size={block} must be a power of two of at least 16")
    if k < 1 or n < 1:
        raise ctx.fail(f"K={k} and N={n} must be positive")


@importer("MatMulNBits", domain=MS)
def _matmul_nbits(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    a, packed, scales, zero_points, g_idx, bias = ctx.inputs(node, count=(3, 6))
    attrs = ctx.attributes(node)
    k, n = attrs.int("K"), attrs.int("N")
    bits, block = attrs.int("bits", 4), attrs.int("block_size")
    attrs.int("accuracy_level", 0)  # a permission to compute A at lower precision: unused
    if attrs.int("weight_prepacked", 0):
        raise ctx.fail("weight_prepacked B (a CUDA provider's own layout) is not supported")
    _check_attributes(ctx, k, n, bits, block)
    if g_idx is not None:
        raise ctx.fail("the deprecated g_idx input (act-order) is not supported")
    if a.dtype not in _FLOATS or scales.dtype is not a.dtype:
        raise ctx.fail(
            f"A and scales must share a float type, got {a.dtype.short}, {scales.dtype.short}"
        )
    b = ctx.builder
    blocks = -(-k // block)
    if packed.dtype is not DType.U8 or packed.shape != (n, blocks, block * bits // 8):
        raise ctx.fail(
            f"B must be uint8 [{n}, {blocks}, {block * bits // 8}] (N, k_blocks, blob_size), "
            f"got {packed.dtype.short} {list(packed.shape)}"
        )
    codes = b.cast(unpack_codes(ctx, packed, bits), DType.F32)  # [N, k_blocks, block]
    centered = b.sub(codes, _zero_points(ctx, zero_points, n, blocks, bits))
    factor = b.cast(_per_block(ctx, scales, n, blocks, "scales"), DType.F32)
    weight = b.view(b.mul(centered, factor), (n, blocks * block))
    weight = b.permute(b.slice(weight, axis=1, start=0, stop=k), (1, 0))  # [K, N]
    if a.shape[-1] != k:
        raise ctx.fail(f"A's last dimension is {a.shape[-1]}, but K={k}")
    y = matmul(ctx, b.cast(a, DType.F32), weight)
    if bias is not None:
        if bias.shape != (n,):
            raise ctx.fail(f"bias must be [{n}], got {list(bias.shape)}")
        y = b.add(y, b.cast(bias, DType.F32))
    return [b.cast(y, a.dtype)]
