"""Quantized products on the GPU: IntMatMul, IntConv and Int4MatMul, with fused epilogues.

Each main op computes its result (int32 for the integer products) into a temporary, and the
kernel's epilogue (the model's requantization or dequantization, bias, activation, residual:
whatever extraction fused) runs as one elementwise kernel over it, which looks up what follows
an 8-bit code in a table where it can (lookup.py). The integer paths are
exact, so the CPU and the GPU agree bit for bit wherever the epilogue does.

The fast paths: IntMatMul with a constant weight on the int8 tensor cores (imma.py), and
Int4MatMul on float16 or bfloat16 activations by the W4A16 kernels (int4.py). The general
paths need nothing of their operands: the direct kernels over centered int32 operands, and for
Int4MatMul in float32 (or shapes W4A16 cannot tile) a GEMM over the weight dequantized while
planning, which keeps the arithmetic in the program's precision.
"""

from __future__ import annotations

import numpy as np

from knopt.cpu.kernels import int4_weight
from knopt.cuda.context import LoweringContext
from knopt.cuda.gen.constants import add_constant, constant_array
from knopt.cuda.gen.elementwise import emit_elementwise, replace_acc
from knopt.cuda.gen.imma import emit_imma, imma_sizes_fit, int8_weight
from knopt.cuda.gen.int4 import emit_w4a16, w4a16_format
from knopt.cuda.gen.library import FusedEpilogue, gemm_step
from knopt.cuda.gen.lookup import emit_elementwise_coded
from knopt.cuda.gen.window import emit_conv_direct, emit_matmul_direct
from knopt.cuda.layout import Layout
from knopt.errors import UnsupportedModelError
from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.op import Binary
from knopt.ir.program import (
    Acc,
    BinaryE,
    CastE,
    Expr,
    Kernel,
    Load,
    map_leaves,
)


def result_tensor(ctx: LoweringContext, kernel: Kernel, dtype: DType) -> int:
    """Where the main op writes: the output, or a temporary the epilogue reads."""
    shape = ctx.tensor(kernel.output).shape
    return ctx.new_tensor(shape, dtype) if kernel.epilogue is not None else kernel.output


def finish_epilogue(ctx: LoweringContext, kernel: Kernel, acc: int) -> None:
    """Run the kernel's epilogue over the main op's result `acc`, if it has one."""
    if kernel.epilogue is not None:
        body = replace_acc(kernel.epilogue, len(kernel.inputs))
        emit_elementwise_coded(ctx, kernel.output, body, [*kernel.inputs, acc])


def centered_int32(ctx: LoweringContext, value: int, zero: int) -> int:
    """A new int32 tensor `value - zero` (8-bit operand and its zero point)."""
    out = ctx.new_tensor(ctx.tensor(value).shape, DType.I32)
    body = BinaryE(Binary.SUB, CastE(Load(0), DType.I32), CastE(Load(1), DType.I32))
    emit_elementwise(ctx, out, body, [value, zero])
    return out


# ---- IntMatMul -------------------------------------------------------------------------------


def emit_int_matmul(ctx: LoweringContext, kernel: Kernel) -> None:
    """IntMatMul and its epilogue: on IMMA where it can, else by the direct kernel."""
    a, b, a_zero, b_zero = kernel.inputs[:4]
    weight = None
    b_value, zb_value = constant_array(ctx, b), constant_array(ctx, b_zero)
    k, n = ctx.tensor(b).shape[-2:]
    uniform_zero = all(s == 0 for s in ctx.layout(a_zero).strides)
    if b_value is not None and zb_value is not None and uniform_zero and imma_sizes_fit(n, k):
        weight = int8_weight(b_value, zb_value)
    if weight is None:
        acc = result_tensor(ctx, kernel, DType.I32)
        emit_matmul_direct(ctx, acc, centered_int32(ctx, a, a_zero), centered_int32(ctx, b, b_zero))
        finish_epilogue(ctx, kernel, acc)
        return
    exact = emit_imma(ctx, kernel, weight)
    body = exact.expr if kernel.epilogue is None else substitute_acc(kernel.epilogue, exact.expr)
    emit_elementwise_coded(ctx, kernel.output, body, [*kernel.inputs, *exact.inputs])


def substitute_acc(expr: Expr, acc: Expr) -> Expr:
    """`expr` with `Acc()` replaced by the expression `acc`."""
    return map_leaves(expr, lambda leaf: acc if isinstance(leaf, Acc) else leaf)


# ---- IntConv ---------------------------------------------------------------------------------


def emit_int_conv(ctx: LoweringContext, kernel: Kernel) -> None:
    """IntConv by the direct convolution kernel over centered int32 operands."""
    op = kernel.op
    assert isinstance(op, ops.IntConv)
    x, w, x_zero, w_zero = kernel.inputs[:4]
    acc = result_tensor(ctx, kernel, DType.I32)
    as_conv = ops.Conv(op.strides, op.pads, op.dilations, op.groups)
    # Zero padding of the centered input is padding with the zero point, as IntConv means.
    emit_conv_direct(
        ctx, acc, centered_int32(ctx, x, x_zero), centered_int32(ctx, w, w_zero), as_conv
    )
    finish_epilogue(ctx, kernel, acc)


# ---- Int4MatMul ------------------------------------------------------------------------------


def int4_operands(ctx: LoweringContext, kernel: Kernel) -> tuple[np.ndarray, ...]:
    """The packed codes, scales and zero points of an Int4MatMul, which must be constants.

    Raises:
        UnsupportedModelError: If one of them is computed at run time.
    """
    found = [constant_array(ctx, tid) for tid in kernel.inputs[1:4]]
    if any(array is None for array in found):
        raise UnsupportedModelError(
            f"{ctx.where}: an int4 matmul runs on the GPU with constant weights only (packed "
            "codes, scales and zero points)"
        )
    return tuple(array for array in found if array is not None)


def emit_int4_matmul(ctx: LoweringContext, kernel: Kernel) -> None:
    """Int4MatMul and its epilogue: W4A16 kernels in half precision, else a dequantized GEMM."""
    operands = int4_operands(ctx, kernel)
    acc = result_tensor(ctx, kernel, ctx.dtype(kernel.inputs[0]))
    form = w4a16_format(ctx, kernel, operands)
    if form is not None:
        emit_w4a16(ctx, kernel, form, operands, acc)
    else:
        _emit_dequantized_gemm(ctx, kernel, operands, acc)
    finish_epilogue(ctx, kernel, acc)


def _emit_dequantized_gemm(
    ctx: LoweringContext, kernel: Kernel, operands: tuple[np.ndarray, ...], acc: int
) -> None:
    op = kernel.op
    assert isinstance(op, ops.Int4MatMul)
    a = kernel.inputs[0]
    packed, scales, zeros = operands
    dtype = ctx.dtype(a)
    k = ctx.tensor(a).shape[-1]
    weight = int4_weight(op, packed, scales.astype(np.float32), zeros, k).T  # [k, n]
    w = add_constant(ctx, weight, dtype)
    shape = ctx.tensor(acc).shape
    if len(shape) > 2:  # one weight for every batch: a broadcast view, read once
        lead = (1,) * (len(shape) - 2)
        layout = Layout.contiguous(lead + weight.shape).broadcast((*shape[:-2], *weight.shape))
        w = ctx.add_tensor(dtype, layout, ctx.tensor(w).buffer)
    ctx.emit(gemm_step(ctx, a, w, acc, FusedEpilogue()))
