"""Elementwise bodies that end in a function of one 8-bit code: a 256-entry table lookup.

A quantized model's epilogues often round to an 8-bit code and then, with per-tensor scales and
zero points only, dequantize it, apply an activation and quantize again (BERT's first
feed-forward layer: requantize, GELU, requantize). Everything after the code takes at most 256
values. The planner evaluates that tail once per code with the CPU executor, which is the
oracle itself, so every entry is the oracle's answer bit for bit; the kernel computes the code
and reads the table. On the H200 the GELU tail was about half of that epilogue's ~100
instructions an element (41 us for 63 MB: bound by instruction issue, not by memory).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from knopt.cpu.program import evaluate_expr
from knopt.cuda.cexpr import HALF_TYPES, expr_dtype, used_loads, uses_acc
from knopt.cuda.context import LoweringContext
from knopt.cuda.gen.constants import add_constant, constant_array
from knopt.cuda.gen.elementwise import emit_elementwise
from knopt.ir.dtype import DType
from knopt.ir.program import Expr, Load, expr_children, expr_size

CODE_TYPES = frozenset({DType.I8, DType.U8})
TABLE_SIZE = 256
MIN_TAIL_OPS = 4  # a shorter tail costs about what the lookup does (an index and a load)


@dataclass(frozen=True)
class CodeTable:
    """An elementwise body split at an 8-bit code.

    Attributes:
        code: The part of the body up to the code: what the kernel computes per element.
        table: A constant plan tensor of 256 outputs; entry b is the body's value where the
            code's bits are b.
    """

    code: Expr
    table: int


def emit_elementwise_coded(
    ctx: LoweringContext, out: int, body: Expr, inputs: Sequence[int]
) -> None:
    """`emit_elementwise`, with the body's tail after an 8-bit code looked up where it can."""
    found = code_table(ctx, body, inputs, out)
    if found is None:
        emit_elementwise(ctx, out, body, inputs)
    else:
        emit_elementwise(ctx, out, found.code, inputs, table=found.table)


def code_table(
    ctx: LoweringContext, body: Expr, inputs: Sequence[int], out: int
) -> CodeTable | None:
    """The split of `out = body(inputs)` at an 8-bit code, or None where none is worth it.

    The code is the smallest 8-bit part of the body that holds every input that varies
    (everything else the body reads is a constant with one value); the tail after it must do
    at least MIN_TAIL_OPS operations, none of them in a half type (the GPU computes those in float,
    the CPU executor does not), and yield the output's type.
    """
    dtypes = [ctx.dtype(t) for t in inputs]
    out_dtype = ctx.dtype(out)
    if out_dtype in HALF_TYPES or expr_dtype(body, dtypes) is not out_dtype:
        return None
    scalars = {i: v for i in used_loads(body) if (v := _one_value(ctx, inputs[i])) is not None}
    code = _code_of(body, dtypes, set(scalars))
    if code is None:
        return None
    code_dtype = expr_dtype(code, dtypes)
    tail = _replaced(body, code, Load(len(inputs)))
    if expr_size(tail) < MIN_TAIL_OPS or _computes_in_half(tail, [*dtypes, code_dtype]):
        return None
    codes = np.arange(TABLE_SIZE, dtype=np.uint8).view(code_dtype.numpy)
    loads = [
        np.full(TABLE_SIZE, scalars[i], dtype=dtypes[i].numpy) if i in scalars else codes[:0]
        for i in range(len(inputs))
    ]
    values = np.broadcast_to(evaluate_expr(tail, [*loads, codes]), (TABLE_SIZE,))
    if values.dtype != out_dtype.numpy:
        return None
    return CodeTable(code, add_constant(ctx, values, out_dtype))


def _one_value(ctx: LoweringContext, tid: int) -> np.generic | None:
    """The value of a constant tensor that holds one (broadcast everywhere), else None."""
    layout = ctx.layout(tid)
    if layout.numel == 0 or any(layout.strides):
        return None
    array = constant_array(ctx, tid)
    return None if array is None else array[(0,) * array.ndim]


def _code_of(body: Expr, dtypes: Sequence[DType], fixed: set[int]) -> Expr | None:
    """The smallest 8-bit sub-body that holds every input that varies, wherever it is read.

    A body is a tree, so one value may appear in it several times (a requantization reads its
    clamped value twice: `where(is_nan(x), fill, x)`); every copy is replaced by the code.
    """
    code_index = len(dtypes)

    def varies(expr: Expr) -> bool:
        return bool(used_loads(expr) - fixed - {code_index}) or uses_acc(expr)

    candidates = {
        node for node in _nodes(body) if expr_dtype(node, dtypes) in CODE_TYPES and varies(node)
    }
    covering = [k for k in candidates if not varies(_replaced(body, k, Load(code_index)))]
    return min(covering, key=expr_size, default=None)


def _nodes(expr: Expr) -> list[Expr]:
    found = [expr]
    for child in expr_children(expr):
        found += _nodes(child)
    return found


def _replaced(expr: Expr, old: Expr, new: Expr) -> Expr:
    """`expr` with every node equal to `old` replaced by `new`."""
    if expr == old:
        return new
    children = expr_children(expr)
    if not children:
        return expr
    names = [f.name for f in dataclasses.fields(expr)]
    changed = {
        name: _replaced(getattr(expr, name), old, new)
        for name in names
        if any(getattr(expr, name) is child for child in children)
    }
    return dataclasses.replace(expr, **changed)  # type: ignore[arg-type]


def _computes_in_half(expr: Expr, dtypes: Sequence[DType]) -> bool:
    if expr_dtype(expr, dtypes) in HALF_TYPES:
        return True
    return any(_computes_in_half(child, dtypes) for child in expr_children(expr))
