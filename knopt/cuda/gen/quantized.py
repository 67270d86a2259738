"""Quantized products on the GPU: IntMatMul, IntConv and Int4MatMul, with fused epilogues.

Each main op computes its result (int32 for the integer products) into a temporary, and the
kernel's epilogue (the model's requantization or dequantization, bias, activation, residual:
whatever extraction fused) runs as one elementwise kernel over it. The integer paths are
exact, so the CPU and the GPU agree bit for bit wherever the epilogue does.

The general paths here need nothing of their operands: the products of centered int32
operands by the direct kernels, and the int4 weight dequantized while planning. Faster paths
take over where their conditions hold (knopt/cuda/gen/imma.py, knopt/cuda/gen/int4.py).
"""

from __future__ import annotations

import numpy as np

from knopt.cpu.kernels import int4_weight
from knopt.cuda.context import LoweringContext
from knopt.cuda.gen.elementwise import emit_elementwise, replace_acc
from knopt.cuda.gen.library import FusedEpilogue, gemm_step
from knopt.cuda.gen.window import emit_conv_direct, emit_matmul_direct
from knopt.cuda.layout import Layout
from knopt.errors import UnsupportedModelError
from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.op import Binary
from knopt.ir.program import BinaryE, CastE, Kernel, Load


def result_tensor(
    ctx: LoweringContext, kernel: Kernel, shape: tuple[int, ...], dtype: DType
) -> int:
    """Where the main op writes: the output, or a temporary the epilogue reads."""
    return ctx.new_tensor(shape, dtype) if kernel.epilogue is not None else kernel.output


def finish_epilogue(ctx: LoweringContext, kernel: Kernel, acc: int) -> None:
    """Run the kernel's epilogue over the main op's result `acc`, if it has one."""
    if kernel.epilogue is not None:
        body = replace_acc(kernel.epilogue, len(kernel.inputs))
        emit_elementwise(ctx, kernel.output, body, [*kernel.inputs, acc])


def centered_int32(ctx: LoweringContext, value: int, zero: int) -> int:
    """A new int32 tensor `value - zero` (8-bit operand and its zero point)."""
    out = ctx.new_tensor(ctx.tensor(value).shape, DType.I32)
    body = BinaryE(Binary.SUB, CastE(Load(0), DType.I32), CastE(Load(1), DType.I32))
    emit_elementwise(ctx, out, body, [value, zero])
    return out


def emit_int_matmul_direct(ctx: LoweringContext, kernel: Kernel, acc: int) -> None:
    """IntMatMul by the direct matmul kernel over centered int32 operands (any sizes)."""
    a, b, a_zero, b_zero = kernel.inputs[:4]
    emit_matmul_direct(ctx, acc, centered_int32(ctx, a, a_zero), centered_int32(ctx, b, b_zero))


def emit_int_conv(ctx: LoweringContext, kernel: Kernel) -> None:
    """IntConv by the direct convolution kernel over centered int32 operands."""
    op = kernel.op
    assert isinstance(op, ops.IntConv)
    x, w, x_zero, w_zero = kernel.inputs[:4]
    acc = result_tensor(ctx, kernel, ctx.tensor(kernel.output).shape, DType.I32)
    as_conv = ops.Conv(op.strides, op.pads, op.dilations, op.groups)
    # Zero padding of the centered input is padding with the zero point, as IntConv means.
    emit_conv_direct(
        ctx, acc, centered_int32(ctx, x, x_zero), centered_int32(ctx, w, w_zero), as_conv
    )
    finish_epilogue(ctx, kernel, acc)


def constant_array(ctx: LoweringContext, tid: int) -> np.ndarray | None:
    """The value of a plan tensor that is (a view of) a constant, else None."""
    tensor = ctx.tensor(tid)
    if tensor.buffer < 0 or ctx.buffers[tensor.buffer].region != "constant":
        return None
    data = np.ascontiguousarray(ctx.constants[tensor.buffer]).reshape(-1)
    layout = tensor.layout
    item = data.itemsize
    return np.ndarray(
        layout.shape,
        data.dtype,
        buffer=data,
        offset=layout.offset * item,
        strides=tuple(s * item for s in layout.strides),
    )


def add_constant(ctx: LoweringContext, array: np.ndarray, dtype: DType) -> int:
    """A new constant plan tensor holding `array` (converted to `dtype`)."""
    tid = ctx.new_tensor(tuple(array.shape), dtype, region="constant")
    ctx.constants[ctx.tensor(tid).buffer] = np.ascontiguousarray(array, dtype=dtype.numpy)
    return tid


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


def emit_int4_matmul_dequantized(ctx: LoweringContext, kernel: Kernel) -> None:
    """Int4MatMul as a GEMM over the weight dequantized while planning (any precision)."""
    op = kernel.op
    assert isinstance(op, ops.Int4MatMul)
    a = kernel.inputs[0]
    packed, scales, zeros = int4_operands(ctx, kernel)
    dtype = ctx.dtype(a)
    k = ctx.tensor(a).shape[-1]
    weight = int4_weight(op, packed, scales.astype(np.float32), zeros, k)
    w = add_constant(ctx, weight.T, dtype)  # [k, n]
    shape = ctx.tensor(kernel.output).shape
    acc = result_tensor(ctx, kernel, shape, dtype)
    rank = len(shape)
    if rank > 2:  # one weight for every batch: a broadcast view, which gemm_step reads once
        view = Layout.contiguous((1,) * (rank - 2) + weight.T.shape).broadcast(
            (*shape[:-2], *weight.T.shape)
        )
        w = ctx.add_tensor(dtype, view, ctx.tensor(w).buffer)
    ctx.emit(gemm_step(ctx, a, w, acc, FusedEpilogue()))
    finish_epilogue(ctx, kernel, acc)


def emit_int_matmul(ctx: LoweringContext, kernel: Kernel) -> None:
    """IntMatMul, then its epilogue."""
    shape = ctx.tensor(kernel.output).shape
    acc = result_tensor(ctx, kernel, shape, DType.I32)
    emit_int_matmul_direct(ctx, kernel, acc)
    finish_epilogue(ctx, kernel, acc)


def emit_int4_matmul(ctx: LoweringContext, kernel: Kernel) -> None:
    """Int4MatMul, then its epilogue."""
    emit_int4_matmul_dequantized(ctx, kernel)
