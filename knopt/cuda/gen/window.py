"""Sliding windows and direct products: Pool, and the direct Conv and MatMul kernels.

The direct kernels serve what the libraries do not take (integer dtypes, unusual ranks).
"""

from __future__ import annotations

import ml_dtypes

from knopt.cuda.cexpr import (
    accumulate_dtype,
    accumulate_type,
    cast,
    compute_type,
    literal,
    load_value,
    store_value,
)
from knopt.cuda.context import LoweringContext
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
from knopt.cuda.steps import Launch
from knopt.cuda.templates import render
from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.op import PoolKind
from knopt.ir.program import Kernel

THREADS = 256


def _emit(ctx: LoweringContext, kind: str, source: str, count: int, reads: Reads, out: int) -> None:
    name, source = named(kind, source)
    ctx.emit(Launch(name, source, (blocks(count, THREADS), 1, 1), (THREADS, 1, 1), reads.args(out)))


def _window_loops(
    spatial: tuple[int, ...],
    kernel: tuple[int, ...],
    strides: tuple[int, ...],
    pads: tuple[tuple[int, int], ...],
    dilations: tuple[int, ...],
) -> list[str]:
    """Opening lines of one loop per window axis, defining p<d>, real<d> and padded<d>."""
    lines = []
    for d, size in enumerate(spatial):
        before, after = pads[d]
        lines.append(f"for (idx_t k{d} = 0; k{d} < {kernel[d]}; ++k{d}) {{")
        lines.append(
            f"  const idx_t p{d} = c{d + 2} * {strides[d]} - {before} + k{d} * {dilations[d]};"
        )
        lines.append(f"  const bool real{d} = p{d} >= 0 && p{d} < {size};")
        lines.append(f"  const bool padded{d} = p{d} >= -{before} && p{d} < {size + after};")
    return lines


def emit_pool(ctx: LoweringContext, kernel: Kernel) -> None:
    """Max or average pooling."""
    op = kernel.op
    assert isinstance(op, ops.Pool)
    (x,) = kernel.inputs
    out = ctx.tensor(kernel.output)
    count = out.layout.numel
    if count == 0:
        return
    xl = ctx.layout(x)
    spatial = xl.shape[2:]
    itype = index_type(2 * count, 2 * (xl.numel + abs(xl.offset)))
    reads = Reads(ctx)
    pointer = reads.slot(x)
    coords = decompose("i", out.shape, "c", itype)
    loops = _window_loops(spatial, op.kernel, op.strides, op.pads, op.dilations)
    terms = [f"c0 * ({xl.strides[0]})", f"c1 * ({xl.strides[1]})"]
    terms += [f"p{d} * ({xl.strides[d + 2]})" for d in range(len(spatial))]
    value = load_value(f"{pointer}[{' + '.join(terms)}]", ctx.dtype(x))
    real = " && ".join(f"real{d}" for d in range(len(spatial)))
    padded = " && ".join(f"padded{d}" for d in range(len(spatial)))
    dtype = out.dtype
    if op.kind is PoolKind.MAX:
        acc_t = compute_type(dtype)
        init = literal(-float("inf"), dtype) if dtype.is_float else _lowest(dtype)
        body = [f"if ({real}) acc = kn::max_(acc, ({acc_t})({value}));"]
        result = store_value("acc", dtype)
    else:
        acc_t = "double"
        init = "0.0"
        body = [f"if ({real}) {{ acc += (double)({value}); count += 1; }}"]
        if op.count_include_pad:
            body.append(f"else if ({padded}) count += 1;")
        result = store_value(cast("(acc / (count > 0 ? count : 1.0))", DType.F64, dtype), dtype)
    lines = (
        loops
        + ["  " * len(spatial) + b for b in body]
        + ["  " * (len(spatial) - 1 - d) + "}" for d in range(len(spatial))]
    )
    source = render(
        "pool.cu",
        NAME=PLACEHOLDER,
        PARAMS=reads.params(kernel.output),
        THREADS=THREADS,
        INDEX=itype,
        COUNT=count,
        COORDS=indent(coords),
        ACC_T=acc_t,
        INIT=init,
        LOOPS=indent(lines),
        RESULT=result,
    )
    _emit(ctx, "pool", source, count, reads, kernel.output)


def _lowest(dtype: DType) -> str:
    if dtype is DType.BOOL:
        return "false"
    return literal(int(ml_dtypes.iinfo(dtype.numpy).min), dtype)


def emit_conv_direct(ctx: LoweringContext, out_id: int, x: int, w: int, op: ops.Conv) -> None:
    """Append the direct convolution kernel (see `conv_direct_launch`)."""
    launch = conv_direct_launch(ctx, out_id, x, w, op)
    if launch is not None:
        ctx.emit(launch)


def conv_direct_launch(
    ctx: LoweringContext, out_id: int, x: int, w: int, op: ops.Conv
) -> Launch | None:
    """Grouped N-d convolution by a thread per output element (any dtype, any rank).

    The output may be dense in another axis order (channels last).
    """
    out = ctx.tensor(out_id)
    count = out.layout.numel
    if count == 0:
        return None
    xl, wl = ctx.layout(x), ctx.layout(w)
    spatial = xl.shape[2:]
    window = wl.shape[2:]
    itype = index_type(2 * count, 2 * (xl.numel + abs(xl.offset)), 2 * (wl.numel + abs(wl.offset)))
    reads = Reads(ctx)
    xp, wp = reads.slot(x, share=False), reads.slot(w, share=False)
    coords = decompose("i", out.shape, "c", itype)
    loops = _window_loops(spatial, window, op.strides, op.pads, op.dilations)
    x_terms = [f"c0 * ({xl.strides[0]})", f"channel * ({xl.strides[1]})"]
    x_terms += [f"p{d} * ({xl.strides[d + 2]})" for d in range(len(spatial))]
    w_terms = [f"c1 * ({wl.strides[0]})", f"ci * ({wl.strides[1]})"]
    w_terms += [f"k{d} * ({wl.strides[d + 2]})" for d in range(len(spatial))]
    acc_t = accumulate_type(out.dtype)
    real = " && ".join(f"real{d}" for d in range(len(spatial)))
    xv = load_value(f"{xp}[{' + '.join(x_terms)}]", ctx.dtype(x))
    wv = load_value(f"{wp}[{' + '.join(w_terms)}]", ctx.dtype(w))
    body = [f"if ({real}) acc += ({acc_t})({xv}) * ({acc_t})({wv});"]
    lines = (
        loops
        + ["  " * len(spatial) + b for b in body]
        + ["  " * (len(spatial) - 1 - d) + "}" for d in range(len(spatial))]
    )
    acc_dtype = accumulate_dtype(out.dtype)
    out_index = "i" if out.layout.is_contiguous else offset("c", out.layout.strides)
    source = render(
        "conv_direct.cu",
        NAME=PLACEHOLDER,
        PARAMS=reads.params(out_id),
        THREADS=THREADS,
        INDEX=itype,
        COUNT=count,
        COORDS=indent(coords),
        OUT_PER_GROUP=out.shape[1] // op.groups,
        IN_PER_GROUP=wl.shape[1],
        ACC_T=acc_t,
        LOOPS=indent(lines, 2),
        RESULT=store_value(cast("acc", acc_dtype, out.dtype), out.dtype),
        OUT_INDEX=out_index,
    )
    name, source = named("conv_direct", source)
    return Launch(name, source, (blocks(count, THREADS), 1, 1), (THREADS, 1, 1), reads.args(out_id))


def emit_matmul_direct(ctx: LoweringContext, out_id: int, a: int, b: int) -> None:
    """Batched matmul by a thread per output element (any dtype)."""
    out = ctx.tensor(out_id)
    count = out.layout.numel
    if count == 0:
        return
    al, bl = ctx.layout(a), ctx.layout(b)
    rank = len(out.shape)
    itype = index_type(2 * count, 2 * (al.numel + abs(al.offset)), 2 * (bl.numel + abs(bl.offset)))
    reads = Reads(ctx)
    ap, bp = reads.slot(a, share=False), reads.slot(b, share=False)
    coords = decompose("i", out.shape, "c", itype)
    batch_a = [f"c{j} * ({al.strides[j]})" for j in range(rank - 2) if al.strides[j]]
    batch_b = [f"c{j} * ({bl.strides[j]})" for j in range(rank - 2) if bl.strides[j]]
    a_terms = [*batch_a, f"c{rank - 2} * ({al.strides[-2]})", f"k * ({al.strides[-1]})"]
    b_terms = [*batch_b, f"k * ({bl.strides[-2]})", f"c{rank - 1} * ({bl.strides[-1]})"]
    acc_t = accumulate_type(out.dtype)
    acc_dtype = accumulate_dtype(out.dtype)
    source = render(
        "matmul_direct.cu",
        NAME=PLACEHOLDER,
        PARAMS=reads.params(out_id),
        THREADS=THREADS,
        INDEX=itype,
        COUNT=count,
        COORDS=indent(coords),
        ACC_T=acc_t,
        K=al.shape[-1],
        A=load_value(f"{ap}[{' + '.join(a_terms)}]", ctx.dtype(a)),
        B=load_value(f"{bp}[{' + '.join(b_terms)}]", ctx.dtype(b)),
        RESULT=store_value(cast("acc", acc_dtype, out.dtype), out.dtype),
    )
    _emit(ctx, "matmul_direct", source, count, reads, out_id)
