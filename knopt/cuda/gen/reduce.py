"""Reductions and scans along axes: Reduce (prologue, epilogue), ArgReduce, CumSum, ArgSort."""

from __future__ import annotations

from collections.abc import Sequence

import ml_dtypes
import numpy as np

from knopt.cuda.cexpr import (
    ScalarCode,
    accumulate_dtype,
    accumulate_type,
    cast,
    compute_type,
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
    blocks,
    broadcast_to,
    decompose,
    indent,
    index_type,
    named,
    offset,
)
from knopt.cuda.layout import merge_axes, numel
from knopt.cuda.steps import Launch
from knopt.cuda.templates import render
from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.op import Reduction
from knopt.ir.program import Acc, Expr, Kernel, Load

THREADS = 256
ROW_MIN = 16  # reduced counts below this loop in one thread instead of a block

_OPS = {
    Reduction.SUM: "kn::SumOp",
    Reduction.PROD: "kn::ProdOp",
    Reduction.MAX: "kn::MaxOp",
    Reduction.MIN: "kn::MinOp",
}


def identity(kind: Reduction, dtype: DType) -> str:
    """The reduction's neutral element in `dtype`'s accumulation type, as C."""
    acc = accumulate_dtype(dtype)
    if kind is Reduction.SUM:
        return literal(0, acc)
    if kind is Reduction.PROD:
        return literal(1, acc)
    lowest = kind is Reduction.MAX
    if dtype is DType.BOOL:
        return literal(0 if lowest else 1, acc)
    if acc.is_float:
        return literal(-float("inf") if lowest else float("inf"), acc)
    info = ml_dtypes.iinfo(acc.numpy)
    return literal(info.min if lowest else info.max, acc)


def split_axes(
    shape: Sequence[int], axes: Sequence[int], strides_list: Sequence[Sequence[int]]
) -> tuple[tuple[int, ...], list[tuple[int, ...]], tuple[int, ...], list[tuple[int, ...]]]:
    """Kept and reduced sizes of `shape`, and each layout's strides over both."""
    kept = [i for i in range(len(shape)) if i not in axes]
    kept_dims = tuple(shape[i] for i in kept)
    red_dims = tuple(shape[i] for i in axes)
    kept_strides = [tuple(st[i] for i in kept) for st in strides_list]
    red_strides = [tuple(st[i] for i in axes) for st in strides_list]
    return kept_dims, kept_strides, red_dims, red_strides


def emit_reduce(ctx: LoweringContext, kernel: Kernel) -> None:
    """Reduce, with its prologue and epilogue fused."""
    op = kernel.op
    assert isinstance(op, ops.Reduce)
    inputs = list(kernel.inputs)
    dtypes = [ctx.dtype(t) for t in inputs]
    prologue: Expr = kernel.prologue if kernel.prologue is not None else Load(0)
    epilogue: Expr = kernel.epilogue if kernel.epilogue is not None else Acc()
    pro_loads = sorted(used_loads(prologue))
    epi_loads = sorted(used_loads(epilogue))
    shape = _operand_shape(ctx, kernel, pro_loads)
    dtype = expr_dtype(prologue, dtypes)
    out = ctx.tensor(kernel.output)
    if out.layout.numel == 0:
        return
    out_shape = out.shape
    where = ctx.where
    pro_strides = [broadcast_to(ctx.layout(inputs[i]), shape, where) for i in pro_loads]
    epi_strides = [broadcast_to(ctx.layout(inputs[i]), out_shape, where) for i in epi_loads]
    kept_dims, pro_kept, red_dims, pro_red = split_axes(shape, op.axes, pro_strides)
    keep = [i for i in range(len(shape)) if i not in op.axes]
    epi_kept = [tuple(st[i] for i in keep) for st in epi_strides]
    kept, kept_strides = merge_axes(kept_dims, [*pro_kept, *epi_kept])
    reduced, red_strides = merge_axes(red_dims, pro_red)
    outputs, count = numel(kept_dims), numel(red_dims)
    rows = bool(op.axes) and op.axes[-1] == len(shape) - 1 and count > ROW_MIN
    threads = _row_threads(outputs, count) if rows else THREADS
    extent = max(
        [count * outputs] + [ctx.layout(t).numel + abs(ctx.layout(t).offset) for t in inputs]
    )
    itype = index_type(extent * 2)
    reads = Reads(ctx)
    kept_lines = decompose("m", kept, "k", itype)
    for n, i in enumerate(pro_loads):
        kept_lines.append(f"const idx_t b{i} = {offset('k', kept_strides[n])};")
    for n, i in enumerate(epi_loads):
        kept_lines.append(f"const idx_t e{i} = {offset('k', kept_strides[len(pro_loads) + n])};")
    red_lines = decompose("j", reduced, "r", itype)
    for n, i in enumerate(pro_loads):
        element = f"{reads.slot(inputs[i])}[{offset('r', red_strides[n], f'b{i}')}]"
        red_lines.append(f"const auto x{i} = {load_value(element, dtypes[i])};")
    pro = ScalarCode(dtypes, [f"x{i}" for i in range(len(inputs))], prefix="p")
    value = pro.emit(prologue)
    epi_lines = []
    for i in epi_loads:
        element = f"{reads.slot(inputs[i])}[e{i}]"
        epi_lines.append(f"const auto y{i} = {load_value(element, dtypes[i])};")
    epi = ScalarCode(
        dtypes, [f"y{i}" for i in range(len(inputs))], acc=dtype, acc_name="a", prefix="q"
    )
    result = epi.emit(epilogue)
    acc_t = accumulate_type(dtype)
    source = render(
        "reduce.cu",
        NAME=PLACEHOLDER,
        PARAMS=reads.params(kernel.output),
        THREADS=threads,
        INDEX=itype,
        ROWS=int(rows),
        OUTPUTS=outputs,
        COUNT=count,
        ACC_T=acc_t,
        IDENTITY=identity(op.kind, dtype),
        OP=_OPS[op.kind],
        KEPT=indent(kept_lines),
        REDUCED=indent(red_lines + pro.lines, 2),
        VALUE=value,
        ACC_VALUE=cast("acc", accumulate_dtype(dtype), dtype),
        EPILOGUE=indent(epi_lines + epi.lines),
        RESULT=store_value(cast(result, epi.dtype(epilogue), out.dtype), out.dtype),
    )
    name, source = named("reduce", source)
    grid = outputs if rows else blocks(outputs, threads)
    ctx.emit(Launch(name, source, (grid, 1, 1), (threads, 1, 1), reads.args(kernel.output)))


def _operand_shape(ctx: LoweringContext, kernel: Kernel, loads: Sequence[int]) -> tuple[int, ...]:
    # The shape the prologue is evaluated at: the reduce's operand shape. The output keeps the
    # reduced axes as size 1, so the operand is the largest shape any prologue load has.
    if not loads:
        return ctx.tensor(kernel.output).shape
    shapes = [ctx.tensor(kernel.inputs[i]).shape for i in loads]
    return tuple(int(d) for d in np.broadcast_shapes(*shapes))


def _row_threads(outputs: int, count: int) -> int:
    threads = 32
    limit = 1024 if outputs < 128 and count >= 8192 else THREADS
    while threads < limit and threads < count:
        threads *= 2
    return threads


def _axis_reads(
    ctx: LoweringContext, tid: int, axis: int
) -> tuple[tuple[int, ...], tuple[int, ...], int, int]:
    layout = ctx.layout(tid)
    kept_dims, (kept_strides,), (count,), ((stride,),) = split_axes(
        layout.shape, [axis], [layout.strides]
    )
    return kept_dims, kept_strides, count, stride


def emit_arg_reduce(ctx: LoweringContext, kernel: Kernel) -> None:
    """ArgMax / ArgMin along one axis."""
    op = kernel.op
    assert isinstance(op, ops.ArgReduce)
    (source_id,) = kernel.inputs
    kept_dims, kept_strides, count, stride = _axis_reads(ctx, source_id, op.axis)
    outputs = numel(kept_dims)
    if outputs == 0 or count == 0:
        return
    dims, (strides,) = merge_axes(kept_dims, [kept_strides])
    itype = index_type(2 * (ctx.layout(source_id).numel + abs(ctx.layout(source_id).offset)))
    dtype = ctx.dtype(source_id)
    ctype = compute_type(dtype)
    lines = [*decompose("m", dims, "k", itype), f"const idx_t b = {offset('k', strides)};"]
    compare = (">" if op.largest else "<") + ("=" if op.last else "")
    if op.last:
        better = f"kn::isnan_(x) || (!kn::isnan_(best) && x {compare} best)"
    else:
        better = f"(kn::isnan_(x) && !kn::isnan_(best)) || (!kn::isnan_(best) && x {compare} best)"
    reads = Reads(ctx)
    pointer = reads.slot(source_id)
    source = render(
        "arg_reduce.cu",
        NAME=PLACEHOLDER,
        PARAMS=reads.params(kernel.output),
        THREADS=THREADS,
        INDEX=itype,
        OUTPUTS=outputs,
        KEPT=indent(lines),
        T=ctype,
        COUNT=count,
        LOAD_FIRST=load_value(f"{pointer}[b]", dtype),
        LOAD_J=load_value(f"{pointer}[b + j * ({stride})]", dtype),
        BETTER=better,
    )
    name, source = named("arg_reduce", source)
    ctx.emit(
        Launch(
            name,
            source,
            (blocks(outputs, THREADS), 1, 1),
            (THREADS, 1, 1),
            reads.args(kernel.output),
        )
    )


def emit_cumsum(ctx: LoweringContext, kernel: Kernel) -> None:
    """CumSum along one axis (inclusive or exclusive, forward or reverse)."""
    op = kernel.op
    assert isinstance(op, ops.CumSum)
    (source_id,) = kernel.inputs
    out = ctx.tensor(kernel.output)
    layout = ctx.layout(source_id)
    kept_dims, (in_kept, out_kept), (count,), ((in_stride,), (out_stride,)) = split_axes(
        layout.shape, [op.axis], [layout.strides, out.layout.strides]
    )
    rows = numel(kept_dims)
    if rows == 0 or count == 0:
        return
    dims, (in_strides, out_strides) = merge_axes(kept_dims, [in_kept, out_kept])
    itype = index_type(2 * max(out.layout.numel, layout.numel + abs(layout.offset)))
    lines = decompose("m", dims, "k", itype)
    lines += [
        f"const idx_t b = {offset('k', in_strides)};",
        f"const idx_t o = {offset('k', out_strides)};",
    ]
    dtype = ctx.dtype(source_id)
    acc_t = accumulate_type(dtype)
    reads = Reads(ctx)
    pointer = reads.slot(source_id)
    source = render(
        "cumsum.cu",
        NAME=PLACEHOLDER,
        PARAMS=reads.params(kernel.output),
        THREADS=THREADS,
        INDEX=itype,
        ROWS=rows,
        KEPT=indent(lines),
        ACC_T=acc_t,
        COUNT=count,
        REVERSE="true" if op.reverse else "false",
        EXCLUSIVE=int(op.exclusive),
        LOAD=load_value(f"{pointer}[b + j * ({in_stride})]", dtype),
        OUT_STRIDE=out_stride,
        STORE=store_value("acc", out.dtype),
    )
    name, source = named("cumsum", source)
    ctx.emit(
        Launch(
            name, source, (blocks(rows, THREADS), 1, 1), (THREADS, 1, 1), reads.args(kernel.output)
        )
    )


def emit_arg_sort(ctx: LoweringContext, kernel: Kernel) -> None:
    """ArgSort along one axis, stable, ascending or descending."""
    op = kernel.op
    assert isinstance(op, ops.ArgSort)
    (source_id,) = kernel.inputs
    out = ctx.tensor(kernel.output)
    layout = ctx.layout(source_id)
    kept_dims, (in_kept, out_kept), (count,), ((in_stride,), (out_stride,)) = split_axes(
        layout.shape, [op.axis], [layout.strides, out.layout.strides]
    )
    total = numel(kept_dims) * count
    if total == 0:
        return
    dims, (in_strides, out_strides) = merge_axes(kept_dims, [in_kept, out_kept])
    itype = index_type(2 * max(total, layout.numel + abs(layout.offset)))
    lines = decompose("m", dims, "k", itype)
    lines += [
        f"const idx_t b = {offset('k', in_strides)};",
        f"const idx_t o = {offset('k', out_strides)};",
    ]
    dtype = ctx.dtype(source_id)
    reads = Reads(ctx)
    pointer = reads.slot(source_id)

    def before(a: str, b: str) -> str:  # a sorts strictly before b
        if op.descending:
            return f"((kn::isnan_({a}) && !kn::isnan_({b})) || {a} > {b})"
        return f"((kn::isnan_({b}) && !kn::isnan_({a})) || {a} < {b})"

    source = render(
        "arg_sort.cu",
        NAME=PLACEHOLDER,
        PARAMS=reads.params(kernel.output),
        THREADS=THREADS,
        INDEX=itype,
        TOTAL=total,
        COUNT=count,
        KEPT=indent(lines),
        T=compute_type(dtype),
        LOAD_I=load_value(f"{pointer}[b + i * ({in_stride})]", dtype),
        LOAD_J=load_value(f"{pointer}[b + j * ({in_stride})]", dtype),
        BEFORE_JI=before("xj", "xi"),
        BEFORE_IJ=before("xi", "xj"),
        OUT_STRIDE=out_stride,
    )
    name, source = named("arg_sort", source)
    ctx.emit(
        Launch(
            name, source, (blocks(total, THREADS), 1, 1), (THREADS, 1, 1), reads.args(kernel.output)
        )
    )
