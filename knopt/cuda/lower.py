"""Kernel kinds and IR ops to steps: the CUDA backend's table, one generator per op class.

Every generator takes the context and a kernel whose tensors already have plan tensors (plan
ids equal program ids) and appends steps. Generators that cannot fuse a prologue or epilogue
get them split off here: the prologue becomes an elementwise kernel writing the operand, the
epilogue one reading the op's result as an extra input.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from knopt.cuda.cexpr import expr_dtype, used_loads
from knopt.cuda.context import LoweringContext
from knopt.cuda.gen import attention, data, library, reduce, rowwise, window
from knopt.cuda.gen.elementwise import copy_launch, emit_elementwise, replace_acc
from knopt.cuda.layout import Layout, view_layout
from knopt.errors import CodegenError
from knopt.ir import op as ops
from knopt.ir.op import TensorType
from knopt.opt.program import BinaryE as BinaryExpr
from knopt.opt.program import CastE, ClampE, Expr, Kernel, Load, UnaryE, WhereE

Lowering = Callable[[LoweringContext, Kernel], None]


def _elementwise_op(body: Callable[[ops.Op], Expr]) -> Lowering:
    def lower(ctx: LoweringContext, kernel: Kernel) -> None:
        assert kernel.op is not None
        emit_elementwise(ctx, kernel.output, body(kernel.op), kernel.inputs)

    return lower


def _view_copy(ctx: LoweringContext, kernel: Kernel) -> None:
    # A view op scheduled as a real kernel: read the input through the view's layout.
    assert kernel.op is not None
    (source,) = kernel.inputs
    layout = view_layout(kernel.op, ctx.layout(source))
    if layout is None:
        dense = ctx.new_tensor(ctx.tensor(source).shape, ctx.dtype(source))
        _emit_copy(ctx, dense, source)
        dense_layout = Layout.contiguous(ctx.tensor(source).shape)
        layout = dense_layout.reshape(ctx.tensor(kernel.output).shape)
        assert layout is not None
        source = dense
    viewed = ctx.add_tensor(ctx.dtype(source), layout, ctx.tensor(source).buffer)
    _emit_copy(ctx, kernel.output, viewed)


def _emit_copy(ctx: LoweringContext, out: int, source: int) -> None:
    launch = copy_launch(ctx, out, source)
    if launch is not None:
        ctx.emit(launch)


OP_LOWERINGS: dict[type[ops.Op], Lowering] = {
    ops.Iota: data.emit_iota,
    ops.Sizes: data.emit_sizes,
    ops.View: _view_copy,
    ops.Broadcast: _view_copy,
    ops.Permute: _view_copy,
    ops.Slice: _view_copy,
    ops.Flip: _view_copy,
    ops.Pad: data.emit_pad,
    ops.Concat: data.emit_concat,
    ops.Gather: data.emit_gather,
    ops.Scatter: data.emit_scatter,
    ops.Cast: _elementwise_op(lambda op: CastE(Load(0), op.dtype)),  # type: ignore[attr-defined]
    ops.UnaryOp: _elementwise_op(lambda op: UnaryE(op.kind, Load(0))),  # type: ignore[attr-defined]
    ops.BinaryOp: _elementwise_op(lambda op: BinaryExpr(op.kind, Load(0), Load(1))),  # type: ignore[attr-defined]
    ops.Clamp: _elementwise_op(lambda op: ClampE(Load(0), op.lo, op.hi)),  # type: ignore[attr-defined]
    ops.Where: _elementwise_op(lambda op: WhereE(Load(0), Load(1), Load(2))),
    ops.Reduce: reduce.emit_reduce,
    ops.ArgReduce: reduce.emit_arg_reduce,
    ops.ArgSort: reduce.emit_arg_sort,
    ops.CumSum: reduce.emit_cumsum,
    ops.MatMul: library.emit_matmul,
    ops.Conv: library.emit_conv,
    ops.Pool: window.emit_pool,
    ops.Softmax: rowwise.emit_softmax,
    ops.LayerNorm: rowwise.emit_norm,
    ops.RmsNorm: rowwise.emit_norm,
    ops.Attention: attention.emit_attention,
}

# Ops whose generators fuse a prologue and an epilogue themselves.
FUSING: frozenset[type[ops.Op]] = frozenset(
    {
        ops.Reduce,
        ops.Softmax,
        ops.LayerNorm,
        ops.RmsNorm,
        ops.MatMul,
        ops.Conv,
    }
)

FUSED_KIND_OPS: dict[str, type[ops.Op]] = {
    "reduce": ops.Reduce,
    "softmax": ops.Softmax,
    "layer_norm": ops.LayerNorm,
    "rms_norm": ops.RmsNorm,
    "matmul": ops.MatMul,
    "conv": ops.Conv,
}


def lower_kernel(ctx: LoweringContext, kernel: Kernel) -> None:
    """Append the steps of one (non-view) kernel.

    Raises:
        CodegenError: If the kernel's kind and op disagree or it has no GPU lowering.
    """
    if kernel.kind == "elementwise":
        if kernel.body is None:
            raise CodegenError(f"{ctx.where}: elementwise kernel without a body")
        emit_elementwise(ctx, kernel.output, kernel.body, kernel.inputs)
        return
    op = kernel.op
    if op is None:
        raise CodegenError(f"{ctx.where}: kernel kind '{kernel.kind}' has no op")
    expected = FUSED_KIND_OPS.get(kernel.kind)
    if expected is not None and not isinstance(op, expected):
        raise CodegenError(f"{ctx.where}: kind '{kernel.kind}' needs a {expected.__name__} op")
    lowering = OP_LOWERINGS.get(type(op))
    if lowering is None:
        raise CodegenError(f"{ctx.where}: no CUDA lowering for {op.name}")
    if type(op) in FUSING or (kernel.prologue is None and kernel.epilogue is None):
        lowering(ctx, kernel)
        return
    _split(ctx, kernel, lowering)


def op_result_type(ctx: LoweringContext, kernel: Kernel) -> TensorType:
    """The type of the kernel's main op result (what `Acc` is)."""
    assert kernel.op is not None
    return kernel.op.infer(
        [TensorType(ctx.tensor(t).shape, ctx.dtype(t)) for t in operands(ctx, kernel)], ctx.where
    )


def operands(ctx: LoweringContext, kernel: Kernel) -> list[int]:
    """The main op's operand tensors, when there is no prologue (the first inputs)."""
    assert kernel.op is not None and kernel.prologue is None
    arity = kernel.op.arity if kernel.op.arity is not None else len(kernel.inputs)
    return list(kernel.inputs[:arity])


def prologue_type(ctx: LoweringContext, kernel: Kernel) -> TensorType:
    """The type of the operand a prologue computes (shape of the loads it reads)."""
    assert kernel.prologue is not None
    dtypes = [ctx.dtype(t) for t in kernel.inputs]
    dtype = expr_dtype(kernel.prologue, dtypes)
    shapes = [ctx.tensor(kernel.inputs[i]).shape for i in sorted(used_loads(kernel.prologue))]
    shape = tuple(int(d) for d in np.broadcast_shapes(*shapes)) if shapes else ()
    return TensorType(shape, dtype)


def _split(ctx: LoweringContext, kernel: Kernel, lowering: Lowering) -> None:
    inputs = list(kernel.inputs)
    first = kernel
    if kernel.prologue is not None:
        operand_type = prologue_type(ctx, kernel)
        operand = ctx.new_tensor(operand_type.shape, operand_type.dtype)  # type: ignore[arg-type]
        emit_elementwise(ctx, operand, kernel.prologue, inputs)
        first = dataclasses.replace(kernel, inputs=(operand,), prologue=None)
    if kernel.epilogue is None:
        lowering(ctx, dataclasses.replace(first, epilogue=None))
        return
    result = op_result_type(ctx, first)
    acc = ctx.new_tensor(result.shape, result.dtype)  # type: ignore[arg-type]
    lowering(ctx, dataclasses.replace(first, output=acc, epilogue=None))
    emit_elementwise(ctx, kernel.output, replace_acc(kernel.epilogue, len(inputs)), [*inputs, acc])
