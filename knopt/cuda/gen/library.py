"""MatMul and Conv as library calls (cuBLASLt, cuDNN), fusing the epilogues they offer.

An epilogue the library can take (cuBLASLt: scale, bias, residual, RELU, GELU_TANH; cuDNN: bias,
residual, RELU) goes into the call, with an in-place elementwise kernel as its fallback should
the library decline at plan-building time. Any other epilogue runs as its own elementwise
kernel over the library's result. Dtypes and ranks the libraries lack use direct kernels.

Strict f32 GEMMs run as one 3xTF32 GEMM where `KNOPT_SPLIT_F32` opts in (`gen.split`); a
half-precision MatMul of a few rows by a weight runs as knopt's own GEMV (`gen.gemv`);
convolutions whose output `knopt.cuda.gen.channels_last` stored channels last run so in cuDNN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from knopt.cuda.cexpr import uses_acc
from knopt.cuda.context import LoweringContext
from knopt.cuda.gen import gemv, split
from knopt.cuda.gen.channels_last import is_channels_last, to_channels_last
from knopt.cuda.gen.elementwise import (
    copy_launch,
    elementwise_launch,
    emit_elementwise,
    replace_acc,
)
from knopt.cuda.gen.indexing import broadcast_to
from knopt.cuda.gen.window import conv_direct_launch, emit_conv_direct, emit_matmul_direct
from knopt.cuda.layout import Layout, merge_axes, numel
from knopt.cuda.steps import Conv, Gemm, Launch, Operand
from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.op import Binary, Unary
from knopt.ir.program import Acc, BinaryE, ClampE, Const, Expr, Kernel, Load, UnaryE

GEMM_DTYPES = frozenset({DType.F32, DType.F16, DType.BF16, DType.F64})
CONV_DTYPES = frozenset({DType.F32, DType.F16, DType.BF16})
_GEMM_ACTIVATIONS = {Unary.RELU: "relu", Unary.GELU_TANH: "gelu_tanh"}
BIAS_ALIGNMENT = 16  # bytes
BUFFER_ALIGNMENT = 256  # bytes every planned buffer starts at (knopt.cuda.planner.ALIGNMENT)
INPUT_ALIGNMENT = 16  # bytes an input bound in place is aligned to (knopt.cuda.executor)


@dataclass(frozen=True)
class FusedEpilogue:
    """What of an epilogue a library call applies itself."""

    alpha: float = 1.0
    bias: int | None = None
    residual: int | None = None
    activation: str = ""


def contiguous(ctx: LoweringContext, tid: int) -> int:
    """`tid` itself if dense, else a dense copy of it (appending the copy's launch)."""
    if ctx.layout(tid).is_contiguous:
        return tid
    copy = ctx.new_tensor(ctx.tensor(tid).shape, ctx.dtype(tid))
    launch = copy_launch(ctx, copy, tid)
    if launch is not None:
        ctx.emit(launch)
    return copy


def _add_terms(expr: Expr) -> list[Expr]:
    if isinstance(expr, BinaryE) and expr.kind is Binary.ADD:
        return _add_terms(expr.a) + _add_terms(expr.b)
    return [expr]


def _scale(expr: Expr) -> float | None:
    """The alpha of `Acc`, `Acc * c`, `c * Acc` or `Acc / c`, else None."""
    if isinstance(expr, Acc):
        return 1.0
    if isinstance(expr, BinaryE) and expr.kind in (Binary.MUL, Binary.DIV):
        a, b = expr.a, expr.b
        if expr.kind is Binary.MUL and isinstance(a, Const) and isinstance(b, Acc):
            a, b = b, a
        if isinstance(a, Acc) and isinstance(b, Const) and b.value != 0:
            return float(b.value) if expr.kind is Binary.MUL else 1.0 / float(b.value)
    return None


def _classify_loads(
    ctx: LoweringContext, kernel: Kernel, terms: list[Expr], bias_axis: int
) -> tuple[int | None, int | None] | None:
    """(bias, residual) tensors among the non-Acc terms, or None if a term is neither."""
    out = ctx.tensor(kernel.output)
    bias = residual = None
    for term in terms:
        if not isinstance(term, Load):
            return None
        tid = kernel.inputs[term.index]
        if ctx.dtype(tid) != out.dtype:
            return None
        strides = broadcast_to(ctx.layout(tid), out.shape, ctx.where)
        axis = bias_axis % len(out.shape)
        is_vector = all(s == 0 for i, s in enumerate(strides) if i != axis) and (
            strides[axis] == 1 or out.shape[axis] == 1
        )
        aligned = ctx.layout(tid).offset * out.dtype.itemsize % BIAS_ALIGNMENT == 0
        if is_vector and aligned and bias is None:
            bias = tid
        elif ctx.layout(tid) == out.layout and residual is None:
            residual = tid
        else:
            return None
    return bias, residual


def match_epilogue(ctx: LoweringContext, kernel: Kernel, *, conv: bool) -> FusedEpilogue | None:
    """The library-fusable form of the kernel's epilogue, or None."""
    expr = kernel.epilogue
    if expr is None:
        return FusedEpilogue()
    activation = ""
    if isinstance(expr, UnaryE) and (
        expr.kind is Unary.RELU or (not conv and expr.kind in _GEMM_ACTIVATIONS)
    ):
        activation = _GEMM_ACTIVATIONS[expr.kind]
        expr = expr.x
    elif isinstance(expr, ClampE) and expr.lo == 0 and expr.hi == math.inf:
        activation = "relu"  # clamp.egg writes RELU as a clamp to [0, inf]
        expr = expr.x
    terms = _add_terms(expr)
    with_acc = [t for t in terms if uses_acc(t)]
    if len(with_acc) != 1:
        return None
    alpha = _scale(with_acc[0])
    if alpha is None or (conv and alpha != 1.0):
        return None
    loads = _classify_loads(
        ctx, kernel, [t for t in terms if t is not with_acc[0]], 1 if conv else -1
    )
    if loads is None:
        return None
    bias, residual = loads
    if residual is not None and activation and not conv:
        return None  # cuBLASLt's order of residual and activation is not documented
    return FusedEpilogue(alpha, bias, residual, activation)


def _epilogue_launch(ctx: LoweringContext, kernel: Kernel) -> Launch | None:
    """The in-place kernel applying the epilogue to the output (a library's fallback)."""
    assert kernel.epilogue is not None
    body = replace_acc(kernel.epilogue, len(kernel.inputs))
    return elementwise_launch(ctx, kernel.output, body, [*kernel.inputs, kernel.output])


def _split_epilogue(
    ctx: LoweringContext, kernel: Kernel, shape: tuple[int, ...], dtype: DType
) -> int:
    """A temporary for the main op's result when the epilogue runs as its own kernel.

    It is stored as the kernel's output is (row-major or channels last).
    """
    if kernel.epilogue is None:
        return kernel.output
    layout = ctx.layout(kernel.output)
    if layout.shape != shape or layout.is_contiguous:
        return ctx.new_tensor(shape, dtype)
    buffer = ctx.new_buffer(max(layout.numel, 1) * dtype.itemsize, "arena")
    return ctx.add_tensor(dtype, Layout(layout.shape, layout.strides), buffer)


def _finish_split(ctx: LoweringContext, kernel: Kernel, acc: int) -> None:
    if kernel.epilogue is not None:
        body = replace_acc(kernel.epilogue, len(kernel.inputs))
        emit_elementwise(ctx, kernel.output, body, [*kernel.inputs, acc])


# ---- MatMul ----------------------------------------------------------------------------


def emit_matmul(ctx: LoweringContext, kernel: Kernel) -> None:
    """MatMul through cuBLASLt (epilogue fused where it can be), or a direct kernel."""
    a, b = kernel.inputs[:2]
    out = ctx.tensor(kernel.output)
    dtype = ctx.dtype(a)
    m, k = ctx.tensor(a).shape[-2:]
    n = ctx.tensor(b).shape[-1]
    shape = out.shape
    if dtype not in GEMM_DTYPES or 0 in (m, n, k) or out.layout.numel == 0:
        acc = _split_epilogue(ctx, kernel, shape, dtype)
        emit_matmul_direct(ctx, acc, a, b)
        _finish_split(ctx, kernel, acc)
        return
    fused = match_epilogue(ctx, kernel, conv=False)
    if fused is None or out.dtype != dtype:
        acc = _split_epilogue(ctx, kernel, shape, dtype)
        _emit_gemm(ctx, gemm_step(ctx, a, b, acc, FusedEpilogue()))
        _finish_split(ctx, kernel, acc)
        return
    fallback = _epilogue_launch(ctx, kernel) if kernel.epilogue is not None else None
    _emit_gemm(ctx, gemm_step(ctx, a, b, kernel.output, fused, fallback))


def _emit_gemm(ctx: LoweringContext, step: Gemm) -> None:
    """`step`, or knopt's GEMV computing it with its epilogue where it fits (`gen.gemv`)."""
    ctx.emit(gemv.gemv_launch(step) if gemv.fits(ctx, step) else step)


def _matrix(strides: tuple[int, ...], rows: int, cols: int) -> tuple[int, int] | None:
    """(row_stride, col_stride) cuBLASLt can read, row-major preferred, else None."""
    row, col = strides
    if (col == 1 or cols == 1) and row >= 0 and (rows == 1 or row >= cols):
        return (row if rows > 1 else cols), 1
    if (row == 1 or rows == 1) and col >= 0 and (cols == 1 or col >= rows):
        return 1, (col if cols > 1 else rows)
    return None


def gemm_step(
    ctx: LoweringContext,
    a: int,
    b: int,
    d: int,
    fused: FusedEpilogue,
    fallback: Launch | None = None,
) -> Gemm:
    """The Gemm step for `d = a @ b` (with `fused`), copying operands cuBLASLt cannot read."""
    m, k = ctx.tensor(a).shape[-2:]
    n = ctx.tensor(b).shape[-1]
    batch_shape = ctx.tensor(d).shape[:-2]
    if _matrix(ctx.layout(a).strides[-2:], m, k) is None:
        a = contiguous(ctx, a)
    if _matrix(ctx.layout(b).strides[-2:], k, n) is None:
        b = contiguous(ctx, b)
    dims, strides = _batch_axes(ctx, batch_shape, [a, b, d, fused.residual])
    if len(dims) > 1:  # dense operands always merge their batch axes
        a, b = contiguous(ctx, a), contiguous(ctx, b)
        dims, strides = _batch_axes(ctx, batch_shape, [a, b, d, fused.residual])
    am = _matrix(ctx.layout(a).strides[-2:], m, k)
    bm = _matrix(ctx.layout(b).strides[-2:], k, n)
    batch = numel(batch_shape)
    batch_strides = [st[0] if dims else 0 for st in strides]
    rows = m
    assert am is not None and bm is not None and len(dims) <= 1
    if (
        batch > 1
        and batch_strides[1] == 0
        and am[1] == 1
        and batch_strides[0] == m * am[0]
        and batch_strides[2] == m * n
        and all(s == m * n for s in batch_strides[3:])
    ):
        rows, batch = m * batch, 1  # a shared weight: one tall GEMM instead of a batch
        batch_strides = [0] * len(batch_strides)
    operand_a = Operand(a, rows, k, am[0], am[1], batch_strides[0])
    operand_b = Operand(b, k, n, bm[0], bm[1], batch_strides[1])
    operand_d = Operand(d, rows, n, n, 1, batch_strides[2])
    residual = None
    if fused.residual is not None:
        residual = Operand(fused.residual, rows, n, n, 1, batch_strides[3])
    precision = ctx.precision
    if _use_split(ctx, operand_a, operand_b, batch):
        operand_a = split.split_operand(ctx, operand_a, batch, "a")
        operand_b = split.split_operand(ctx, operand_b, batch, "b")
        precision = "tf32"
    return Gemm(
        operand_a,
        operand_b,
        operand_d,
        batch,
        ctx.dtype(a),
        precision,
        fused.alpha,
        fused.bias,
        residual,
        fused.activation,
        fallback,
        (
            _alignment(ctx, operand_a.tensor),
            _alignment(ctx, operand_b.tensor),
            _alignment(ctx, residual.tensor if residual is not None else d),
            _alignment(ctx, d),
        ),
    )


def _use_split(ctx: LoweringContext, a: Operand, b: Operand, batch: int) -> bool:
    """Whether a strict f32 GEMM runs as 3xTF32 (`knopt.cuda.gen.split`)."""
    if ctx.precision != "f32" or ctx.dtype(a.tensor) is not DType.F32:
        return False
    choice = split.policy()
    if choice != "auto":
        return choice == "always"
    batches = (batch if a.batch_stride else 1, batch if b.batch_stride else 1, batch)
    computed = (
        ctx.tensor(a.tensor).buffer not in ctx.constants,
        ctx.tensor(b.tensor).buffer not in ctx.constants,
    )
    return split.split_pays(a.rows, b.cols, a.cols, batches, computed)


def _alignment(ctx: LoweringContext, tid: int) -> int:
    """Bytes the address of `tid` is surely aligned to (a power of two)."""
    region = ctx.buffers[ctx.tensor(tid).buffer].region
    alignment = INPUT_ALIGNMENT if region == "input" else BUFFER_ALIGNMENT
    start = ctx.layout(tid).offset * ctx.dtype(tid).itemsize
    while start % alignment:
        alignment //= 2
    return alignment


def _batch_axes(
    ctx: LoweringContext, batch_shape: tuple[int, ...], tensors: list[int | None]
) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    layouts = [ctx.layout(t).strides[:-2] for t in tensors if t is not None]
    return merge_axes(batch_shape, layouts)


# ---- Conv ------------------------------------------------------------------------------


def emit_conv(ctx: LoweringContext, kernel: Kernel) -> None:
    """Conv through cuDNN (bias, residual and RELU fused where it can be), or a direct kernel."""
    op = kernel.op
    assert isinstance(op, ops.Conv)
    x, w = kernel.inputs[:2]
    out = ctx.tensor(kernel.output)
    dtype = ctx.dtype(x)
    spatial = len(out.shape) - 2
    if (
        dtype not in CONV_DTYPES
        or not 1 <= spatial <= 3
        or out.layout.numel == 0
        or 0 in ctx.tensor(x).shape
        or 0 in ctx.tensor(w).shape
    ):
        acc = _split_epilogue(ctx, kernel, out.shape, dtype)
        emit_conv_direct(ctx, acc, x, w, op)
        _finish_split(ctx, kernel, acc)
        return
    if is_channels_last(out.layout):  # a convolution region's (knopt.cuda.gen.channels_last)
        x, w = to_channels_last(ctx, x), to_channels_last(ctx, w)
    else:
        x, w = contiguous(ctx, x), contiguous(ctx, w)
    fused = match_epilogue(ctx, kernel, conv=True)
    if fused is None or out.dtype != dtype:
        acc = _split_epilogue(ctx, kernel, out.shape, dtype)
        ctx.emit(conv_step(ctx, op, x, w, acc, FusedEpilogue()))
        _finish_split(ctx, kernel, acc)
        return
    fallback = _epilogue_launch(ctx, kernel) if kernel.epilogue is not None else None
    ctx.emit(conv_step(ctx, op, x, w, kernel.output, fused, fallback))


def conv_step(
    ctx: LoweringContext,
    op: ops.Conv,
    x: int,
    w: int,
    y: int,
    fused: FusedEpilogue,
    fallback: Launch | None = None,
) -> Conv:
    """The Conv step for `y = conv(x, w)` with `fused`."""
    return Conv(
        x,
        w,
        y,
        ctx.tensor(x).shape,
        ctx.tensor(w).shape,
        ctx.tensor(y).shape,
        op.strides,
        op.pads,
        op.dilations,
        op.groups,
        ctx.dtype(x),
        ctx.precision,
        fused.bias,
        fused.residual,
        fused.activation == "relu",
        fallback,
        conv_direct_launch(ctx, y, x, w, op),
        is_channels_last(ctx.layout(y)),
    )
