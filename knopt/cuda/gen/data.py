"""Data movement: Iota, Sizes, Pad, Concat, Gather and Scatter."""

from __future__ import annotations

import numpy as np

from knopt.cuda.cexpr import compute_type, literal, load_value, storage_type, store_value
from knopt.cuda.context import LoweringContext
from knopt.cuda.gen.elementwise import copy_launch
from knopt.cuda.gen.indexing import (
    PLACEHOLDER,
    Reads,
    blocks,
    decompose,
    indent,
    index_type,
    named,
    offset,
)
from knopt.cuda.layout import Layout
from knopt.cuda.steps import Launch
from knopt.cuda.templates import render
from knopt.ir import op as ops
from knopt.ir.op import PadMode, ScatterReduction
from knopt.ir.program import Kernel

THREADS = 256


def _extent(ctx: LoweringContext, *tids: int) -> int:
    return 2 * max(ctx.layout(t).numel + abs(ctx.layout(t).offset) for t in tids)


def _launch(
    ctx: LoweringContext, kind: str, source: str, count: int, reads: Reads, out: int
) -> None:
    name, source = named(kind, source)
    ctx.emit(Launch(name, source, (blocks(count, THREADS), 1, 1), (THREADS, 1, 1), reads.args(out)))


def emit_iota(ctx: LoweringContext, kernel: Kernel) -> None:
    """0, 1, ..., n - 1 in the output's dtype."""
    out = ctx.tensor(kernel.output)
    count = out.layout.numel
    if count == 0:
        return
    value = store_value("i", out.dtype) if out.dtype.is_float else f"({storage_type(out.dtype)})i"
    source = render(
        "iota.cu",
        NAME=PLACEHOLDER,
        THREADS=THREADS,
        T=storage_type(out.dtype),
        COUNT=count,
        VALUE=value,
    )
    _launch(ctx, "iota", source, count, Reads(ctx), kernel.output)


def emit_sizes(ctx: LoweringContext, kernel: Kernel) -> None:
    """Sizes are known when planning: the output becomes a constant."""
    op = kernel.op
    assert isinstance(op, ops.Sizes)
    out = ctx.tensor(kernel.output)
    buffer = ctx.buffers[out.buffer]
    buffer.region = "constant"
    ctx.constants[buffer.id] = np.array(
        [int(d) for d in op.dims],  # type: ignore[arg-type]
        dtype=out.dtype.numpy,
    )


def emit_gather(ctx: LoweringContext, kernel: Kernel) -> None:
    """`x.take(indices, axis)`."""
    op = kernel.op
    assert isinstance(op, ops.Gather)
    x, indices = kernel.inputs
    out = ctx.tensor(kernel.output)
    count = out.layout.numel
    if count == 0:
        return
    xl, il = ctx.layout(x), ctx.layout(indices)
    itype = index_type(count * 2, _extent(ctx, x, indices))
    axis, q = op.axis, len(il.shape)
    coords = decompose("i", out.shape, "c", itype)
    index_offset = " + ".join(
        [f"c{axis + j} * ({s})" for j, s in enumerate(il.strides) if s] or ["0"]
    )
    terms = [f"c{j} * ({xl.strides[j]})" for j in range(axis) if xl.strides[j]]
    terms.append(f"g * ({xl.strides[axis]})")
    terms += [
        f"c{j + q - 1} * ({xl.strides[j]})" for j in range(axis + 1, len(xl.shape)) if xl.strides[j]
    ]
    reads = Reads(ctx)
    reads.slot(x, share=False)
    reads.slot(indices, share=False)
    source = render(
        "gather.cu",
        NAME=PLACEHOLDER,
        PARAMS=reads.params(kernel.output),
        THREADS=THREADS,
        INDEX=itype,
        COUNT=count,
        COORDS=indent(coords),
        INDEX_OFFSET=index_offset,
        SIZE=f"{xl.shape[axis]}LL",
        SOURCE_OFFSET=f"(idx_t)({' + '.join(terms)})",
    )
    _launch(ctx, "gather", source, count, reads, kernel.output)


def emit_concat(ctx: LoweringContext, kernel: Kernel) -> None:
    """Inputs joined along `axis`."""
    op = kernel.op
    assert isinstance(op, ops.Concat)
    out = ctx.tensor(kernel.output)
    count = out.layout.numel
    if count == 0:
        return
    itype = index_type(count * 2, _extent(ctx, *kernel.inputs))
    coords = decompose("i", out.shape, "c", itype)
    reads = Reads(ctx)
    lines: list[str] = []
    start = 0
    for tid in kernel.inputs:
        layout = ctx.layout(tid)
        size = layout.shape[op.axis]
        if size == 0:
            continue
        terms = [f"c{j} * ({s})" for j, s in enumerate(layout.strides) if s and j != op.axis]
        if layout.strides[op.axis]:
            terms.append(f"(c{op.axis} - {start}) * ({layout.strides[op.axis]})")
        element = f"{reads.slot(tid)}[{' + '.join(terms) or '0'}]"
        keyword = "if" if not lines else "} else if"
        lines.append(f"{keyword} (c{op.axis} < {start + size}) {{")
        lines.append(f"  out[i] = {element};")
        start += size
    lines.append("}")
    source = render(
        "concat.cu",
        NAME=PLACEHOLDER,
        PARAMS=reads.params(kernel.output),
        THREADS=THREADS,
        INDEX=itype,
        COUNT=count,
        COORDS=indent(coords),
        SELECT=indent(lines),
    )
    _launch(ctx, "concat", source, count, reads, kernel.output)


def emit_pad(ctx: LoweringContext, kernel: Kernel) -> None:
    """Constant, reflect, edge or wrap padding."""
    op = kernel.op
    assert isinstance(op, ops.Pad)
    (x,) = kernel.inputs
    out = ctx.tensor(kernel.output)
    count = out.layout.numel
    if count == 0:
        return
    xl = ctx.layout(x)
    itype = index_type(count * 2, _extent(ctx, x))
    coords = decompose("i", out.shape, "c", itype)
    lines = []
    for j, ((before, _), size) in enumerate(zip(op.pads, xl.shape, strict=True)):
        lines.append(f"idx_t s{j} = c{j} - {before};")
        if op.mode is PadMode.CONSTANT or size == 0:
            lines.append(f"inside = inside && s{j} >= 0 && s{j} < {size};")
        elif op.mode is PadMode.EDGE:
            lines.append(f"s{j} = s{j} < 0 ? 0 : (s{j} >= {size} ? {size - 1} : s{j});")
        elif op.mode is PadMode.WRAP:
            lines.append(f"s{j} = ((s{j} % {size}) + {size}) % {size};")
        elif size == 1:
            lines.append(f"s{j} = 0;")
        else:  # reflect: the pattern repeats every 2 * (size - 1) elements
            period = 2 * (size - 1)
            lines.append(f"s{j} = ((s{j} % {period}) + {period}) % {period};")
            lines.append(f"s{j} = s{j} >= {size} ? {period} - s{j} : s{j};")
    lines.append(f"if (!inside) {{ {' '.join(f's{j} = 0;' for j in range(len(xl.shape)))} }}")
    reads = Reads(ctx)
    reads.slot(x)
    value = store_value(literal(op.value, out.dtype), out.dtype)
    source = render(
        "pad.cu",
        NAME=PLACEHOLDER,
        PARAMS=reads.params(kernel.output),
        THREADS=THREADS,
        INDEX=itype,
        COUNT=count,
        COORDS=indent(coords),
        SOURCE=indent(lines),
        SOURCE_OFFSET=offset("s", xl.strides),
        VALUE=value,
    )
    _launch(ctx, "pad", source, count, reads, kernel.output)


def emit_scatter(ctx: LoweringContext, kernel: Kernel) -> None:
    """ScatterElements: copy `data`, then write or combine `updates` at `indices`."""
    op = kernel.op
    assert isinstance(op, ops.Scatter)
    data, indices, updates = kernel.inputs
    copy = copy_launch(ctx, kernel.output, data)
    if copy is not None:
        ctx.emit(copy)
    il, ul = ctx.layout(indices), ctx.layout(updates)
    count = il.numel
    if count == 0:
        return
    out = ctx.tensor(kernel.output)
    out_strides = Layout.contiguous(out.shape).strides
    itype = index_type(count * 2, out.layout.numel * 2, _extent(ctx, indices, updates))
    coords = decompose("i", il.shape, "c", itype)
    terms = [f"c{j} * ({s})" for j, s in enumerate(out_strides) if s and j != op.axis]
    terms.append(f"(idx_t)g * ({out_strides[op.axis] or 1})")
    dtype = out.dtype
    storage, compute = storage_type(dtype), compute_type(dtype)
    if op.reduction is ScatterReduction.NONE:
        write = "out[o] = u;"
    else:
        combine = {
            ScatterReduction.ADD: "b_add",
            ScatterReduction.MUL: "b_mul",
            ScatterReduction.MAX: "b_max",
            ScatterReduction.MIN: "b_min",
        }[op.reduction]
        updated = store_value(
            f"kn::{combine}<{compute}>({load_value('v', dtype)}, {load_value('u', dtype)})", dtype
        )
        write = f"kn::atomic_update(out + o, [&]({storage} v) {{ return {updated}; }});"
    reads = Reads(ctx)
    reads.slot(indices, share=False)
    reads.slot(updates, share=False)
    source = render(
        "scatter.cu",
        NAME=PLACEHOLDER,
        PARAMS=reads.params(kernel.output),
        THREADS=THREADS,
        INDEX=itype,
        COUNT=count,
        COORDS=indent(coords),
        INDEX_OFFSET=offset("c", il.strides),
        SIZE=f"{out.shape[op.axis]}LL",
        OUT_OFFSET=" + ".join(terms),
        UPDATE_OFFSET=offset("c", ul.strides),
        T=storage,
        WRITE=indent([write]),
    )
    _launch(ctx, "scatter", source, count, reads, kernel.output)
