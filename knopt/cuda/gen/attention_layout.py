"""Attention outputs stored in the order their reader permutes them to.

Transformers compute attention as [batch, heads, rows, e], then permute it to
[batch, rows, heads, e] and merge the last two axes: a reshape that strides cannot express over
the first order, so the planner copied the whole output once more (a launch, and the output's
bytes read and written again: 12 MiB a BERT-base layer at batch 32 in fp16). Fused attention
kernels and cuDNN's SDPA write `out` through its strides, so before lowering,
`assign_attention_layouts` stores such an output in its reader's order: the permute is then
dense and the reshape after it a view. As for channels last (`channels_last.assign_layouts`),
the planner picks the layout by this rule; extraction never sees it.
"""

from __future__ import annotations

from knopt.cuda.context import LoweringContext
from knopt.cuda.gen.attention import LEAD_AXES, is_fused
from knopt.cuda.layout import Layout
from knopt.ir import op as ops
from knopt.ir.program import Kernel, Program


def assign_attention_layouts(ctx: LoweringContext, program: Program) -> None:
    """Store each fused attention's output permuted as its readers read it (see the module)."""
    readers: dict[int, list[Kernel]] = {}
    for kernel in program.kernels:
        for tid in set(kernel.inputs):
            readers.setdefault(tid, []).append(kernel)
    for kernel in program.kernels:
        perm = _read_order(ctx, program, kernel, readers.get(kernel.output, []))
        if perm is None:
            continue
        out = ctx.tensors[kernel.output]
        inverse = [perm.index(axis) for axis in range(len(perm))]
        out.layout = Layout.contiguous([out.shape[p] for p in perm]).permute(inverse)


def _read_order(
    ctx: LoweringContext, program: Program, kernel: Kernel, readers: list[Kernel]
) -> tuple[int, ...] | None:
    """The one permutation that every reader of a fused attention's output applies, or None.

    None too when the permutation moves the last axis (rows of `out` stay dense, as the
    kernels' 16-byte stores and cuDNN want them), when the program hands the output out
    (results are dense), or when anything else reads it.
    """
    if not isinstance(kernel.op, ops.Attention) or kernel.prologue is not None:
        return None
    if kernel.epilogue is not None or program.tensors[kernel.output].role != "intermediate":
        return None
    perms = [r.op.perm for r in readers if r.is_view and isinstance(r.op, ops.Permute)]
    if not perms or len(perms) != len(readers) or len(set(perms)) != 1:
        return None
    perm = perms[0]
    q, k = (ctx.tensors[t] for t in kernel.inputs[:2])
    out = ctx.tensors[kernel.output]
    rank = len(out.shape)
    if perm[-1] != rank - 1 or list(perm) == list(range(rank)) or rank - 2 > LEAD_AXES:
        return None
    if not is_fused(q.dtype, k.shape[-2], q.shape[-1], out.shape[-1]):
        return None
    return tuple(perm)
