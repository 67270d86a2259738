"""Attention: a flash kernel that keeps the scores out of memory, or GEMM, softmax, GEMM.

The flash kernel takes f32/f16/bf16 and head sizes up to 256; other cases materialize scores.
"""

from __future__ import annotations

from knopt.cuda.cexpr import literal, load_value, store_value
from knopt.cuda.context import LoweringContext
from knopt.cuda.gen import rowwise
from knopt.cuda.gen.indexing import (
    PLACEHOLDER,
    Reads,
    decompose,
    indent,
    index_type,
    named,
    offset,
)
from knopt.cuda.gen.library import FusedEpilogue, gemm_step
from knopt.cuda.layout import merge_axes, numel
from knopt.cuda.steps import Launch
from knopt.cuda.templates import render
from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.op import Binary
from knopt.ir.program import BinaryE, Kernel, Load

FLASH_DTYPES = frozenset({DType.F32, DType.F16, DType.BF16})
MAX_HEAD = 256
THREADS = 128
TARGET_BLOCKS = 264  # two blocks per multiprocessor of an H200 before taller tiles pay


def emit_attention(ctx: LoweringContext, kernel: Kernel) -> None:
    """softmax(q @ k^T * scale + bias) @ v."""
    op = kernel.op
    assert isinstance(op, ops.Attention)
    q, k, v, _ = kernel.inputs
    out = ctx.tensor(kernel.output)
    if out.layout.numel == 0:
        return
    d = ctx.tensor(q).shape[-1]
    e = ctx.tensor(v).shape[-1]
    t = ctx.tensor(k).shape[-2]
    if ctx.dtype(q) in FLASH_DTYPES and d <= MAX_HEAD and e <= MAX_HEAD and t > 0 and d > 0:
        ctx.emit(flash_launch(ctx, kernel, op.scale))
    else:
        _emit_unfused(ctx, kernel, op.scale)


def flash_launch(ctx: LoweringContext, kernel: Kernel, scale: float) -> Launch:
    """The flash-attention launch of `kernel`."""
    q, k, v, bias = kernel.inputs
    out = ctx.tensor(kernel.output)
    s, d = ctx.tensor(q).shape[-2:]
    t, e = ctx.tensor(v).shape[-2:]
    lead = out.shape[:-2]
    heads = numel(lead)
    layouts = [ctx.layout(x) for x in (q, k, v, bias)] + [out.layout]
    dims, strides = merge_axes(lead, [lay.strides[:-2] for lay in layouts])
    rows_per_thread = 1
    while rows_per_thread < 4 and heads * -(-s // (32 * rows_per_thread)) >= TARGET_BLOCKS:
        rows_per_thread *= 2
    block_n = 64 if max(d, e) <= 128 else 32
    block_m = 16 * rows_per_thread
    extent = max(lay.numel + abs(lay.offset) for lay in layouts)
    itype = index_type(2 * extent)
    head_lines = decompose("head", dims, "h", itype)
    for name, st in zip(("qb", "kb", "vb", "bb", "ob"), strides, strict=True):
        head_lines.append(f"const idx_t {name} = {offset('h', st)};")
    reads = Reads(ctx)
    qp, kp, vp, bp = (reads.slot(x, share=False) for x in (q, k, v, bias))
    ql, kl, vl, bl = layouts[:4]
    dtype = ctx.dtype(q)
    source = render(
        "attention.cu",
        NAME=PLACEHOLDER,
        PARAMS=reads.params(kernel.output),
        INDEX=itype,
        ROWS_PER_THREAD=rows_per_thread,
        BLOCK_N=block_n,
        D=d,
        E=e,
        S=s,
        T=t,
        HEAD=indent(head_lines),
        LOAD_Q=load_value(f"{qp}[qb + row * ({ql.strides[-2]}) + d * ({ql.strides[-1]})]", dtype),
        LOAD_K=load_value(f"{kp}[kb + key * ({kl.strides[-2]}) + d * ({kl.strides[-1]})]", dtype),
        LOAD_V=load_value(f"{vp}[vb + key * ({vl.strides[-2]}) + e * ({vl.strides[-1]})]", dtype),
        LOAD_BIAS=load_value(
            f"{bp}[bb + row * ({bl.strides[-2]}) + key * ({bl.strides[-1]})]", dtype
        ),
        SCALE=literal(scale, DType.F32),
        STORE=store_value("acc[i][l] / l_i[i]", out.dtype),
    )
    name, source = named("attention", source)
    floats = (
        block_m * (d + 1) + block_n * (d + 1) + block_n * (-(-e // 8) * 8) + block_m * (block_n + 1)
    )
    grid = heads * -(-s // block_m)
    return Launch(
        name, source, (grid, 1, 1), (THREADS, 1, 1), reads.args(kernel.output), shared=4 * floats
    )


def _emit_unfused(ctx: LoweringContext, kernel: Kernel, scale: float) -> None:
    q, k, v, bias = kernel.inputs
    dtype = ctx.dtype(q)
    s = ctx.tensor(q).shape[-2]
    t = ctx.tensor(k).shape[-2]
    lead = ctx.tensor(kernel.output).shape[:-2]
    scores = ctx.new_tensor((*lead, s, t), dtype)
    kl = ctx.layout(k)
    rank = len(kl.shape)
    transposed = ctx.add_tensor(
        dtype, kl.permute([*range(rank - 2), rank - 1, rank - 2]), ctx.tensor(k).buffer
    )
    ctx.emit(gemm_step(ctx, q, transposed, scores, FusedEpilogue(alpha=scale)))
    probabilities = ctx.new_tensor((*lead, s, t), dtype)
    softmax = Kernel(
        "softmax",
        ops.Softmax(rank - 1),
        (scores, bias),
        probabilities,
        prologue=BinaryE(Binary.ADD, Load(0), Load(1)),
    )
    rowwise.emit_softmax(ctx, softmax)
    ctx.emit(gemm_step(ctx, probabilities, v, kernel.output, FusedEpilogue()))
