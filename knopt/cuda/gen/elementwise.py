"""Elementwise kernels: any fused body over strided (broadcast, permuted, sliced) inputs."""

from __future__ import annotations

from collections.abc import Sequence

from knopt.cuda.cexpr import ScalarCode, cast, load_value, storage_type, store_value, used_loads
from knopt.cuda.context import LoweringContext
from knopt.cuda.gen.indexing import (
    PLACEHOLDER,
    blocks,
    broadcast_to,
    decompose,
    indent,
    index_type,
    named,
    offset,
    params,
)
from knopt.cuda.layout import merge_axes
from knopt.cuda.steps import Buf, Launch
from knopt.cuda.templates import render
from knopt.errors import CodegenError
from knopt.ir.program import Acc, Expr, Load, map_leaves

THREADS = 256
MAX_VECTOR_BYTES = 16


def replace_acc(expr: Expr, index: int) -> Expr:
    """`expr` with `Acc()` read as input `index` (an epilogue run as its own kernel)."""
    return map_leaves(expr, lambda leaf: Load(index) if isinstance(leaf, Acc) else leaf)


def emit_elementwise(
    ctx: LoweringContext, out: int, body: Expr, inputs: Sequence[int], table: int | None = None
) -> None:
    """Append the launch computing `out = body(inputs)`; `out` must be dense.

    With a `table` (a plan tensor of 256 values of `out`'s type), `body` computes an 8-bit code
    and the kernel writes the table's entry at the code's bits (knopt.cuda.gen.lookup).

    Raises:
        CodegenError: If `out` is not dense or an input does not broadcast to its shape.
    """
    launch = elementwise_launch(ctx, out, body, inputs, table)
    if launch is not None:
        ctx.emit(launch)


def copy_launch(ctx: LoweringContext, out: int, source: int) -> Launch | None:
    """The launch copying (and converting) `source` into dense `out` of the same shape."""
    return elementwise_launch(ctx, out, Load(0), [source])


def elementwise_launch(
    ctx: LoweringContext, out: int, body: Expr, inputs: Sequence[int], table: int | None = None
) -> Launch | None:
    """The launch computing `out = body(inputs)`, or None when `out` is empty.

    A dense output stored in another axis order (channels last) is written in that order: the
    body is the same at every index, so the kernel walks all tensors in the output's order.
    """
    target = ctx.tensor(out)
    where = ctx.where or "elementwise kernel"
    order = target.layout.dense_order
    if order is None:
        raise CodegenError(f"{where}: elementwise output must be dense")
    count = target.layout.numel
    if count == 0:
        return None
    used = sorted(used_loads(body))
    in_strides = [broadcast_to(ctx.layout(inputs[i]), target.shape, where) for i in used]
    shape = [target.shape[a] for a in order]
    dims, merged = merge_axes(
        shape,
        [[strides[a] for a in order] for strides in [target.layout.strides, *in_strides]],
    )
    strides = merged[1:]
    items = [target.dtype.itemsize] + [ctx.dtype(inputs[i]).itemsize for i in used]
    vec = _vector_width(dims, max(items))
    extent = max(
        [count] + [abs(ctx.layout(inputs[i]).offset) + ctx.layout(inputs[i]).numel for i in used]
    )
    itype = index_type(extent * 2)
    coords = decompose("first", dims, "c", itype)
    offsets, wide, values = [], [], []
    load_dtypes = [ctx.dtype(t) for t in inputs]
    for slot, (i, st) in enumerate(zip(used, strides, strict=True)):
        layout = ctx.layout(inputs[i])
        ctype = storage_type(load_dtypes[i])
        offsets.append(f"const idx_t o{slot} = {offset('c', st)};")
        inner = st[-1] if st else 0
        if (
            vec > 1
            and inner == 1
            and layout.offset % vec == 0
            and all(s % vec == 0 for s in st[:-1])
        ):
            wide.append(
                f"const kn::Vec<{ctype}, {vec}> w{slot} = "
                f"*reinterpret_cast<const kn::Vec<{ctype}, {vec}>*>(in{slot} + o{slot});"
            )
            element = f"w{slot}.v[v]"
        elif inner == 0 or vec == 1:
            element = f"in{slot}[o{slot}]"
        else:
            element = f"in{slot}[o{slot} + v * ({inner})]"
        values.append(f"const auto x{i} = {load_value(element, load_dtypes[i])};")
    code = ScalarCode(load_dtypes, [f"x{i}" for i in range(len(inputs))])
    result = code.emit(body)
    value = store_value(cast(result, code.dtype(body), target.dtype), target.dtype)
    parameters = [(storage_type(target.dtype), "out", True)] + [
        (storage_type(load_dtypes[i]), f"in{slot}", False) for slot, i in enumerate(used)
    ]
    tables: tuple[Buf, ...] = ()
    if table is not None:
        value = f"lut[(unsigned char)({result})]"
        parameters.append((storage_type(target.dtype), "lut", False))
        tables = (Buf(table),)
    source = render(
        "elementwise.cu",
        NAME=PLACEHOLDER,
        PARAMS=params(parameters),
        THREADS=THREADS,
        INDEX=itype,
        GROUPS=count // vec,
        VEC=vec,
        OFFSETS=indent(coords + offsets),
        WIDE_LOADS=indent(wide),
        VALUES=indent(values, 2),
        BODY=indent(code.lines, 2),
        RESULT=value,
        OUT_T=storage_type(target.dtype),
    )
    name, source = named("elementwise", source)
    args = (Buf(out), *(Buf(inputs[i]) for i in used), *tables)
    return Launch(name, source, (blocks(count // vec, THREADS), 1, 1), (THREADS, 1, 1), args)


def _vector_width(dims: Sequence[int], itemsize: int) -> int:
    # Each thread handles `vec` elements along the last axis: 16-byte accesses for the widest
    # type, as long as the last axis splits evenly. The width depends on nothing else, so that
    # a kernel keeps its shape at every size of a symbolic dimension (knopt.cuda.generic).
    if not dims:
        return 1
    vec = min(8, MAX_VECTOR_BYTES // itemsize)
    while vec > 1 and dims[-1] % vec:
        vec //= 2
    return vec
