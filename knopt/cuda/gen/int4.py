"""Int4MatMul on the tensor cores: the W4A16 kernels (knopt/cuda/w4a16.py) as plan launches.

They take float16 or bfloat16 activations (a program narrowed to fp16 or bf16,
knopt/cuda/precision.py), the weight in MatMulNBits' packed layout, which Int4MatMul's
operands already are, and sizes they can tile (`W4A16.check`). `W4A16.plan` picks the GEMV or
the GEMM and its K split for `SMS` multiprocessors: any count is correct, only the split
changes. (Its third route, dequantizing into a cuBLASLt GEMM at large M, needs a cuBLASLt
handle while planning; a plan here has none.)
"""

from __future__ import annotations

import numpy as np

from knopt.cuda.context import LoweringContext
from knopt.cuda.gen.constants import add_constant
from knopt.cuda.gen.library import contiguous
from knopt.cuda.steps import Buf, Launch
from knopt.cuda.w4a16 import BLOCK_SIZES, W4A16
from knopt.errors import CodegenError
from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.program import Kernel

SMS = 132  # an H200's multiprocessors
HALF_TYPES = frozenset({DType.F16, DType.BF16})
NULL = np.uint64(0)  # an absent pointer argument


def w4a16_format(
    ctx: LoweringContext, kernel: Kernel, operands: tuple[np.ndarray, ...]
) -> W4A16 | None:
    """The W4A16 format that takes this Int4MatMul, or None (then it runs dequantized)."""
    op = kernel.op
    assert isinstance(op, ops.Int4MatMul)
    a = kernel.inputs[0]
    dtype = ctx.dtype(a)
    if dtype not in HALF_TYPES or op.block not in BLOCK_SIZES:
        return None
    k = ctx.tensor(a).shape[-1]
    rows = int(np.prod(ctx.tensor(kernel.output).shape[:-1]))
    form = W4A16(dtype, op.block)
    try:
        form.check(rows, operands[0].shape[0], k)
    except CodegenError:
        return None
    return form


def emit_w4a16(
    ctx: LoweringContext,
    kernel: Kernel,
    form: W4A16,
    operands: tuple[np.ndarray, ...],
    y: int,
) -> None:
    """Append the launch computing `y` `[..., N]` (contiguous) with a W4A16 kernel."""
    a = contiguous(ctx, kernel.inputs[0])
    k = ctx.tensor(a).shape[-1]
    n = operands[0].shape[0]
    m = int(np.prod(ctx.tensor(y).shape[:-1]))
    b, s, z = (
        _as_constant(ctx, tid, array, dtype)
        for tid, array, dtype in zip(
            kernel.inputs[1:4], operands, (DType.U8, form.dtype, DType.U8), strict=True
        )
    )
    plan = form.plan(m, n, k, SMS)
    assert not plan.workspace, "the GEMV and GEMM routes need no workspace"
    args = (Buf(a), Buf(b), Buf(s), Buf(z), NULL, Buf(y), np.int32(m), np.int32(n), np.int32(k))
    source = form.kernel_source(plan.config)
    ctx.emit(Launch(plan.kernel, source, plan.grid, (plan.threads, 1, 1), args))


def _as_constant(ctx: LoweringContext, tid: int, array: np.ndarray, dtype: DType) -> int:
    """`tid` itself when it is a dense constant of `dtype`, else a dense copy of its value."""
    if ctx.layout(tid).is_contiguous and ctx.dtype(tid) is dtype:
        return tid
    return add_constant(ctx, array, dtype)
