"""The importer of ONNX Det: Gaussian elimination with partial pivoting, unrolled.

For a static matrix size `n`, elimination is `n` steps of elementwise work on the whole batch.
Each step picks the row with the largest pivot (an `ArgReduce`), swaps it in with `Where`s over
one-hot row masks (exact: values are selected, never blended), and eliminates below it. The
determinant is the product of the pivots, negated once per swap, as LAPACK's `getrf` computes it.
"""

from __future__ import annotations

import numpy as np
import onnx

from knopt.ir.graph import Value
from knopt.ir.op import Binary, Reduction, Unary
from knopt.onnx.context import ImportContext, OnnxValue, importer
from knopt.onnx.ops.common import scalar_like


def _row(ctx: ImportContext, a: Value, selector: Value) -> Value:
    """The row of `a [..., n, n]` picked by a one-hot `[..., n, 1]` selector, as `[..., 1, n]`."""
    b = ctx.builder
    picked = b.where(selector, a, scalar_like(ctx, a, 0))
    return b.reduce(Reduction.SUM, picked, axes=[a.rank - 2])


@importer("Det", since=11)
def _det(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    ctx.attributes(node)
    n = x.shape[-1]
    if not isinstance(n, int) or x.shape[-2] != n or not x.dtype.is_float:
        raise ctx.fail(f"Det needs square float matrices of static size, got {x.type}")
    b = ctx.builder
    rank = x.rank
    rows = b.constant(np.arange(n, dtype=np.int64).reshape(n, 1))
    a, sign = x, scalar_like(ctx, x, 1)
    det = None
    for k in range(n):
        below = b.binary(Binary.GREATER_EQUAL, rows, b.constant(np.array(k, np.int64)))
        magnitude = b.where(below, b.unary(Unary.ABS, a), scalar_like(ctx, a, -1))
        column = b.slice(magnitude, axis=rank - 1, start=k, stop=k + 1)  # [..., n, 1]
        pivot_row = b.arg_reduce(column, axis=rank - 2)  # [..., 1, 1]
        is_pivot = b.binary(Binary.EQUAL, rows, pivot_row)
        is_k = b.constant((np.arange(n) == k).reshape(n, 1))
        top, chosen = _row(ctx, a, is_k), _row(ctx, a, is_pivot)
        a = b.where(is_k, chosen, b.where(is_pivot, top, a))
        stayed = b.binary(Binary.EQUAL, pivot_row, b.constant(np.array(k, np.int64)))
        sign = b.where(stayed, sign, b.unary(Unary.NEG, sign))
        pivot = b.slice(chosen, axis=rank - 1, start=k, stop=k + 1)  # [..., 1, 1]
        det = pivot if det is None else b.mul(det, pivot)
        factors = b.div(b.slice(a, axis=rank - 1, start=k, stop=k + 1), pivot)  # [..., n, 1]
        lower = b.binary(Binary.GREATER, rows, b.constant(np.array(k, np.int64)))
        a = b.where(lower, b.sub(a, b.mul(factors, chosen)), a)
    assert det is not None
    return [b.view(b.mul(det, sign), x.shape[:-2])]
