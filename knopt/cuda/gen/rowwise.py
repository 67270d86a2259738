"""Softmax, LayerNorm and RmsNorm over rows, with a fused prologue and epilogue."""

from __future__ import annotations

from collections.abc import Sequence

from knopt.cuda.cexpr import (
    ScalarCode,
    cast,
    expr_dtype,
    literal,
    load_value,
    store_value,
    used_loads,
)
from knopt.cuda.context import LoweringContext
from knopt.cuda.gen.indexing import (
    PLACEHOLDER,
    Reads,
    broadcast_to,
    decompose,
    indent,
    index_type,
    named,
    offset,
)
from knopt.cuda.gen.reduce import split_axes
from knopt.cuda.layout import merge_axes, numel
from knopt.cuda.steps import Launch
from knopt.cuda.templates import render
from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.program import Acc, Expr, Kernel, Load

MAX_CACHED = 16  # values a thread keeps in registers between passes
FEW_VALUES, MANY_VALUES = 4, 16  # values a thread of a row takes below 1024 threads a row
BUSY_THREADS = 1 << 17  # threads over all rows that keep the GPU's memory system busy
_OPS = {ops.Softmax: "KN_SOFTMAX", ops.LayerNorm: "KN_LAYER_NORM", ops.RmsNorm: "KN_RMS_NORM"}


def emit_softmax(ctx: LoweringContext, kernel: Kernel) -> None:
    """Softmax along one axis."""
    op = kernel.op
    assert isinstance(op, ops.Softmax)
    _emit_rowwise(ctx, kernel, [op.axis], 0.0)


def emit_norm(ctx: LoweringContext, kernel: Kernel) -> None:
    """LayerNorm or RmsNorm over the axes from `axis` on."""
    op = kernel.op
    assert isinstance(op, ops.LayerNorm | ops.RmsNorm)
    rank = ctx.tensor(kernel.output).layout.shape
    _emit_rowwise(ctx, kernel, list(range(op.axis, len(rank))), op.eps)


def values_per_thread(length: int, rows: int) -> int:
    """Values a thread of a row takes: MANY_VALUES when rows alone fill the GPU, else FEW_VALUES.

    Few threads a row keep many rows in flight: a block a row waits on its loads and on two
    block reductions, so rows run about a wave of blocks at a time. BERT-base's int8
    LayerNorm (4,096 rows of 768) took 15.4 us on the H200 at 256 threads a row (8 rows an
    SM, 4 waves) for 9.4 MB; at 64 threads all its rows fit in one wave. A few rows (a
    decoding step's norms: one row of 2,048 at batch 1) need the threads for their loads in
    flight instead: at 16 values a thread the 4-layer decoding step ran 0.53 ms against 0.41.
    """
    return MANY_VALUES if rows * row_threads(length, MANY_VALUES) >= BUSY_THREADS else FEW_VALUES


def row_threads(length: int, per_thread: int) -> int:
    """Threads per row: up to `per_thread` values each, between one warp and 1024 threads."""
    threads = 32
    while threads < 1024 and threads * per_thread < length:
        threads *= 2
    return threads


def cache_bound(threads: int, count: int, per_thread: int) -> int:
    """The values a thread keeps in registers, as a compile-time bound on `count`.

    Below 1024 threads, `row_threads` keeps every row within `per_thread` values a thread,
    so that is the bound for each thread count: rows of one kernel shape at every length (a
    symbolic axis).
    """
    return per_thread if threads < 1024 else count


def _emit_rowwise(ctx: LoweringContext, kernel: Kernel, axes: Sequence[int], eps: float) -> None:
    assert kernel.op is not None
    inputs = list(kernel.inputs)
    dtypes = [ctx.dtype(t) for t in inputs]
    prologue: Expr = kernel.prologue if kernel.prologue is not None else Load(0)
    epilogue: Expr = kernel.epilogue if kernel.epilogue is not None else Acc()
    out = ctx.tensor(kernel.output)
    shape = out.shape
    if out.layout.numel == 0:
        return
    dtype = expr_dtype(prologue, dtypes)
    pro_loads = sorted(used_loads(prologue))
    epi_loads = sorted(used_loads(epilogue))
    where = ctx.where
    strides = [broadcast_to(ctx.layout(inputs[i]), shape, where) for i in pro_loads]
    strides += [broadcast_to(ctx.layout(inputs[i]), shape, where) for i in epi_loads]
    strides.append(out.layout.strides)
    outer_dims, outer_strides, row_dims, row_strides = split_axes(shape, axes, strides)
    outer, outer_merged = merge_axes(outer_dims, outer_strides)
    row, row_merged = merge_axes(row_dims, row_strides)
    length = numel(row_dims)
    per_thread = values_per_thread(length, numel(outer_dims))
    threads = row_threads(length, per_thread)
    count = -(-length // threads)
    cached = count <= MAX_CACHED
    extent = max(
        [out.layout.numel] + [ctx.layout(t).numel + abs(ctx.layout(t).offset) for t in inputs]
    )
    itype = index_type(2 * extent)
    real = "double" if dtype is DType.F64 else "float"
    real_dtype = DType.F64 if dtype is DType.F64 else DType.F32
    bases = [f"b{i}" for i in pro_loads] + [f"e{i}" for i in epi_loads] + ["o"]
    outer_lines = decompose("row", outer, "k", itype)
    outer_lines += [
        f"const idx_t {b} = {offset('k', st)};" for b, st in zip(bases, outer_merged, strict=True)
    ]
    reads = Reads(ctx)
    coords = decompose("j", row, "r", itype)
    load_lines = list(coords)
    # A value that is the same along the row (a scale, a zero point) is read once a row.
    for n, i in enumerate(pro_loads):
        element = f"{reads.slot(inputs[i])}[{offset('r', row_merged[n], f'b{i}')}]"
        lines = load_lines if any(row_merged[n]) else outer_lines
        lines.append(f"const auto x{i} = {load_value(element, dtypes[i])};")
    pro = ScalarCode(dtypes, [f"x{i}" for i in range(len(inputs))], prefix="p")
    value = pro.emit(prologue)
    load_lines += [*pro.lines, f"return (real)({cast(value, pro.dtype(prologue), real_dtype)});"]
    store_lines = list(coords)
    for n, i in enumerate(epi_loads):
        along = row_merged[len(pro_loads) + n]
        element = f"{reads.slot(inputs[i])}[{offset('r', along, f'e{i}')}]"
        lines = store_lines if any(along) else outer_lines
        lines.append(f"const auto y{i} = {load_value(element, dtypes[i])};")
    store_lines.append(f"const auto a = {cast('value', real_dtype, dtype)};")
    epi = ScalarCode(
        dtypes, [f"y{i}" for i in range(len(inputs))], acc=dtype, acc_name="a", prefix="q"
    )
    result = epi.emit(epilogue)
    store_lines += epi.lines
    out_index = offset("r", row_merged[-1], "o")
    stored = store_value(cast(result, epi.dtype(epilogue), out.dtype), out.dtype)
    store_lines.append(f"out[{out_index}] = {stored};")
    source = render(
        "rowwise.cu",
        NAME=PLACEHOLDER,
        PARAMS=reads.params(kernel.output),
        THREADS=threads,
        INDEX=itype,
        C=real,
        LENGTH=length,
        OUTER=indent(outer_lines),
        LOAD=indent(load_lines, 2),
        STORE=indent(store_lines, 2),
        CACHED=int(cached),
        CACHE=cache_bound(threads, count, per_thread) if cached else 0,
        OP=_OPS[type(kernel.op)],
        EPS=literal(eps, real_dtype),
    )
    name, source = named(type(kernel.op).__name__.lower(), source)
    rows = numel(outer_dims)
    ctx.emit(Launch(name, source, (rows, 1, 1), (threads, 1, 1), reads.args(kernel.output)))
