"""Rotary position embedding: a thread per pair of elements half the last axis apart."""

from __future__ import annotations

from knopt.cuda.cexpr import compute_type, load_value, store_value
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
from knopt.cuda.layout import Layout
from knopt.cuda.steps import Launch
from knopt.cuda.templates import render
from knopt.ir import op as ops
from knopt.ir.program import Kernel

THREADS = 256


def emit_rope(ctx: LoweringContext, kernel: Kernel) -> None:
    """`x * cos + rotate_half(x) * sin` over the last axis, each input read through its layout.

    Pair (j, j + h) gives `y[j] = x[j] * cos[j] - x[j + h] * sin[j]` and `y[j + h] = x[j + h] *
    cos[j + h] + x[j] * sin[j + h]`: the template's products and sums (halves in float, rounded
    once when stored).
    """
    assert isinstance(kernel.op, ops.Rope)
    out = ctx.tensor(kernel.output)
    shape = out.shape
    pairs = out.layout.numel // 2
    if pairs == 0:
        return
    half = shape[-1] // 2
    where = ctx.where or "rope kernel"
    names = ("x", "cos", "sin")
    reads = Reads(ctx)
    offsets, steps = [], {}
    for name, tid in zip(names, kernel.inputs, strict=True):
        strides = broadcast_to(ctx.layout(tid), shape, where)
        offsets.append(f"const idx_t o_{name} = {offset('c', strides)};")
        steps[name] = (reads.slot(tid), half * strides[-1])
    out_strides = out.layout.strides
    offsets.append(f"const idx_t o_out = {offset('c', out_strides)};")
    dtype = out.dtype

    def load(name: str, upper: bool) -> str:
        pointer, step = steps[name]
        index = f"o_{name} + {step}" if upper and step else f"o_{name}"
        return load_value(f"{pointer}[{index}]", dtype)

    # Offsets reach a layout's span, which for the cache rows the output may be (a slice of the
    # cache's buffer, knopt.cuda.resident) is the cache's size, not the rows'.
    extent = max(_span(layout) for layout in [out.layout, *map(ctx.layout, kernel.inputs)])
    itype = index_type(out.layout.numel * 2, 2 * extent)
    source = render(
        "rope.cu",
        NAME=PLACEHOLDER,
        PARAMS=reads.params(kernel.output),
        THREADS=THREADS,
        INDEX=itype,
        C=compute_type(dtype),
        PAIRS=pairs,
        COORDS=indent(decompose("i", (*shape[:-1], half), "c", itype)),
        OFFSETS=indent(offsets),
        X_LO=load("x", upper=False),
        X_HI=load("x", upper=True),
        Y_LO=store_value(f"lo * {load('cos', False)} + -hi * {load('sin', False)}", dtype),
        Y_HI=store_value(f"hi * {load('cos', True)} + lo * {load('sin', True)}", dtype),
        OUT_HALF=half * out_strides[-1],
    )
    name, source = named("rope", source)
    ctx.emit(
        Launch(
            name, source, (blocks(pairs, THREADS), 1, 1), (THREADS, 1, 1), reads.args(kernel.output)
        )
    )


def _span(layout: Layout) -> int:
    """Elements from a layout's first to its last, counting its offset."""
    reach = sum((n - 1) * abs(s) for n, s in zip(layout.shape, layout.strides, strict=True))
    return abs(layout.offset) + reach + 1
