"""IntMatMul on the int8 tensor cores: cuBLASLt's IMMA GEMM between a prologue and the epilogue.

cuBLASLt multiplies signed int8 only, without zero points (knopt/cuda/intgemm.py). For
`sum_k (a - za)(b - zb)` with a per-tensor `za` and a constant weight `b` whose zero point is
per output column:

- uint8 operands become int8 by subtracting 128 (the prologue flips the top bit of the
  activations; the weight is flipped while planning), which moves their zero points by 128
  too: `a' - za' = a - za`;
- the weight is transposed and stored as `[N, K]` while planning (the "TN" form);
- `sum (a' - za')(b' - zb') = D - za' * colsum'[n] - zb'[n] * rowsum[m]` with `D = a' @ b'`,
  `colsum'[n] = sum_k b'[k, n] - K zb'[n]` (a constant) and `rowsum[m] = sum_k a'[m, k]`
  (the prologue's, needed only if some zb' is not 0): exact in int32, and written as the
  first ops of the epilogue kernel, in place of its accumulator. A constant `za'` is folded
  into the constant column term while planning (`za' * colsum'[n]`, a load less and a product
  less an element).

Everything else (a weight computed at run time, per-row or per-k zero points, sizes cuBLASLt
cannot take) runs the general path (knopt/cuda/gen/quantized.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from knopt.cuda.context import LoweringContext
from knopt.cuda.gen.constants import add_constant, constant_array
from knopt.cuda.gen.library import contiguous
from knopt.cuda.int8_epilogue import EPILOGUE_THREADS, PROLOGUE, prologue_source
from knopt.cuda.layout import Layout, contiguous_strides
from knopt.cuda.steps import Buf, Gemm, Launch, Operand
from knopt.ir.dtype import DType
from knopt.ir.op import Binary
from knopt.ir.program import BinaryE, CastE, Const, Expr, Kernel, Load

FLIP = 128  # uint8 codes less 128 are int8 codes
NULL = np.uint64(0)  # an absent pointer argument


@dataclass(frozen=True)
class Int8Weight:
    """A constant IntMatMul weight made ready for IMMA.

    Attributes:
        codes: int8 `[N, K]`: the weight transposed (and flipped from uint8).
        zeros: int32 `[N]`: its zero points, moved as the codes were.
        offsets: int32 `[N]`: `sum_k codes[n, k] - K zeros[n]`.
    """

    codes: np.ndarray
    zeros: np.ndarray
    offsets: np.ndarray


def int8_weight(b: np.ndarray, zb: np.ndarray) -> Int8Weight | None:
    """The IMMA form of a constant weight `b` `[..., K, N]` and its zero points, or None.

    None when the batch holds different matrices, or a zero point varies along K.
    """
    lead = (0,) * (b.ndim - 2)
    if any(b.strides[:-2]) and not np.all(b == b[lead]):  # batches of other matrices
        return None
    first = zb[lead]  # [K, N]
    if (any(zb.strides[:-2]) and not np.all(zb == first)) or not np.all(first == first[:1]):
        return None
    shift = FLIP if b.dtype == np.uint8 else 0
    codes = (b[lead].T.astype(np.int32) - shift).astype(np.int8)
    zeros = first[0].astype(np.int32) - shift
    k = codes.shape[1]
    offsets = codes.astype(np.int64).sum(axis=1) - k * zeros.astype(np.int64)
    return Int8Weight(np.ascontiguousarray(codes), zeros, offsets.astype(np.int32))


def imma_sizes_fit(n: int, k: int) -> bool:
    """Whether cuBLASLt's IMMA kernels take N and K (knopt.cuda.intgemm.check_sizes)."""
    return n % 4 == 0 and k % 4 == 0


@dataclass(frozen=True)
class Accumulator:
    """The exact int32 product as an epilogue expression, and the tensors it reads.

    Attributes:
        expr: Reads the kernel's inputs (unused) and then `inputs`, in that order.
        inputs: Plan tensors, as views of the output's shape.
    """

    expr: Expr
    inputs: tuple[int, ...]


def emit_imma(ctx: LoweringContext, kernel: Kernel, weight: Int8Weight) -> Accumulator:
    """Append the prologue and the int8 GEMM of an IntMatMul; return its exact accumulator."""
    a = contiguous(ctx, kernel.inputs[0])
    out_shape = ctx.tensor(kernel.output).shape
    rows = int(np.prod(out_shape[:-1]))
    n, k = weight.codes.shape
    needs_sums = bool(np.any(weight.zeros))
    flip = ctx.dtype(a) is DType.U8
    a8 = ctx.new_tensor((rows, k), DType.I8) if flip else a
    sums = ctx.new_tensor((rows,), DType.I32) if needs_sums else None
    if flip or needs_sums:
        args = (
            Buf(a),
            Buf(a8) if flip else NULL,
            Buf(sums) if sums is not None else NULL,
            np.int32(k),
            np.int32(int(flip)),
        )
        grid, block = (rows, 1, 1), (EPILOGUE_THREADS, 1, 1)
        ctx.emit(Launch(PROLOGUE, prologue_source(), grid, block, args))
    d = ctx.new_tensor((rows, n), DType.I32)
    w = add_constant(ctx, weight.codes, DType.I8)
    ctx.emit(
        Gemm(
            Operand(a8, rows, k, k, 1, 0),
            Operand(w, k, n, 1, k, 0),
            Operand(d, rows, n, n, 1, 0),
            1,
            DType.I8,
            ctx.precision,
        )
    )
    return _accumulator(ctx, kernel, d, weight, sums)


def _across(
    ctx: LoweringContext, tensor: int, shape: tuple[int, ...], strides: tuple[int, ...]
) -> int:
    """A view of `tensor`'s buffer with `shape` and `strides` (in elements)."""
    t = ctx.tensor(tensor)
    return ctx.add_tensor(t.dtype, Layout(shape, strides, t.layout.offset), t.buffer)


def _accumulator(
    ctx: LoweringContext, kernel: Kernel, d: int, weight: Int8Weight, sums: int | None
) -> Accumulator:
    out_shape = ctx.tensor(kernel.output).shape
    rank = len(out_shape)
    per_column = (0,) * (rank - 1) + (1,)
    per_row = (*contiguous_strides(out_shape[:-1]), 0)
    base = len(kernel.inputs)
    inputs = [_across(ctx, d, out_shape, contiguous_strides(out_shape))]
    acc: Expr = Load(base)
    a_zero = kernel.inputs[2]
    zero = _constant_zero(ctx, a_zero)
    if zero is None:  # computed at run time: za' * colsum'[n] for each element
        offsets = add_constant(ctx, weight.offsets, DType.I32)
        inputs.append(_across(ctx, offsets, out_shape, per_column))
        inputs.append(_across(ctx, a_zero, out_shape, (0,) * rank))  # one element
        zero_expr: Expr = CastE(Load(base + 2), DType.I32)
        if ctx.dtype(a_zero) is DType.U8:
            zero_expr = BinaryE(Binary.SUB, zero_expr, Const(FLIP, DType.I32))
        acc = BinaryE(Binary.SUB, acc, BinaryE(Binary.MUL, zero_expr, Load(base + 1)))
    elif zero:
        # Folded while planning, exactly: int32 products wrap as the kernel's would.
        folded = (zero * weight.offsets.astype(np.int64)).astype(np.int32)
        inputs.append(_across(ctx, add_constant(ctx, folded, DType.I32), out_shape, per_column))
        acc = BinaryE(Binary.SUB, acc, Load(base + 1))
    if sums is not None:
        zeros = add_constant(ctx, weight.zeros, DType.I32)
        at = base + len(inputs)
        inputs.append(_across(ctx, zeros, out_shape, per_column))
        inputs.append(_across(ctx, sums, out_shape, per_row))
        acc = BinaryE(Binary.SUB, acc, BinaryE(Binary.MUL, Load(at), Load(at + 1)))
    return Accumulator(acc, tuple(inputs))


def _constant_zero(ctx: LoweringContext, a_zero: int) -> int | None:
    """The activations' zero point za' (moved as their codes were), where it is a constant."""
    array = constant_array(ctx, a_zero)
    if array is None or array.size == 0:
        return None
    shift = FLIP if ctx.dtype(a_zero) is DType.U8 else 0
    return int(array[(0,) * array.ndim]) - shift
