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
from knopt.cuda.gen import attention, data, library, quantized, reduce, rope, rowwise, window
from knopt.cuda.gen.elementwise import copy_launch, emit_elementwise, replace_acc
from knopt.cuda.layout import Layout, view_layout
from knopt.errors import CodegenError, UnsupportedOpError
from knopt.ir import op as ops
from knopt.ir.kernel import FUSED_MAIN_OPS, KernelKind
from knopt.ir.op import TensorType
from knopt.ir.program import Kernel, Load, elementwise_expr

Lowering = Callable[[LoweringContext, Kernel], None]


def _elementwise_op(ctx: LoweringContext, kernel: Kernel) -> None:
    # A single elementwise op: its body reads each input once, in order.
    assert kernel.op is not None
    body = elementwise_expr(kernel.op, [Load(i) for i in range(len(kernel.inputs))])
    emit_elementwise(ctx, kernel.output, body, kernel.inputs)


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


def gpu_refusal(call: ops.OpaqueCall) -> UnsupportedOpError:
    """The error for an opaque op (an ONNX node knopt keeps as it is): the GPU runs none."""
    where = f"node '{call.node_name}' ({call})" if call.node_name else f"a {call} node"
    return UnsupportedOpError(
        f"{where}: knopt keeps this op as it is but cannot run it on the GPU; run the model on "
        "the CPU (device='cpu', where onnx's reference evaluator has the op), or save it with "
        "`knopt optimize --target onnx` for a runtime that has the op",
        call.op_type,
        call.domain,
        call.node_name,
    )


def _opaque(ctx: LoweringContext, kernel: Kernel) -> None:
    assert isinstance(kernel.op, ops.Opaque)
    raise gpu_refusal(kernel.op.call)


OP_LOWERINGS: dict[type[ops.Op], Lowering] = {
    ops.Iota: data.emit_iota,
    ops.Sizes: data.emit_sizes,
    **dict.fromkeys(ops.VIEW_OPS, _view_copy),
    **dict.fromkeys(ops.ELEMENTWISE_OPS, _elementwise_op),
    ops.Pad: data.emit_pad,
    ops.Concat: data.emit_concat,
    ops.Gather: data.emit_gather,
    ops.Scatter: data.emit_scatter,
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
    ops.Rope: rope.emit_rope,
    ops.IntMatMul: quantized.emit_int_matmul,
    ops.IntConv: quantized.emit_int_conv,
    ops.Int4MatMul: quantized.emit_int4_matmul,
    ops.Opaque: _opaque,
}


def lower_kernel(ctx: LoweringContext, kernel: Kernel) -> None:
    """Append the steps of one (non-view) kernel.

    Raises:
        CodegenError: If the kernel's kind and op disagree or it has no GPU lowering.
    """
    if kernel.kind == KernelKind.ELEMENTWISE:
        if kernel.body is None:
            raise CodegenError(f"{ctx.where}: elementwise kernel without a body")
        emit_elementwise(ctx, kernel.output, kernel.body, kernel.inputs)
        return
    op = kernel.op
    if op is None:
        raise CodegenError(f"{ctx.where}: kernel kind '{kernel.kind}' has no op")
    fused = KernelKind.of_name(kernel.kind)
    expected = fused.main_op if fused is not None else None
    if expected is not None and not isinstance(op, expected):
        raise CodegenError(f"{ctx.where}: kind '{kernel.kind}' needs a {expected.__name__} op")
    lowering = OP_LOWERINGS.get(type(op))
    if lowering is None:
        raise CodegenError(f"{ctx.where}: no CUDA lowering for {op.name}")
    # The generators of fused kinds' main ops fuse a prologue and an epilogue themselves.
    if type(op) in FUSED_MAIN_OPS or (kernel.prologue is None and kernel.epilogue is None):
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
