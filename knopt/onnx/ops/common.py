"""Small helpers shared by the op importers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from knopt.ir.dtype import DType
from knopt.ir.graph import Value
from knopt.ir.shape import Dim, broadcast_shapes, normalize_axis
from knopt.onnx.context import ImportContext


@dataclass(frozen=True)
class PoolWindow:
    """The sliding window of a pooling node."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    pads: tuple[tuple[int, int], ...]
    dilations: tuple[int, ...]


def axis_of(ctx: ImportContext, axis: int, rank: int) -> int:
    """`axis` made non-negative, or an error naming the node.

    Raises:
        UnsupportedModelError: If the tensor is a scalar, which has no axes (the IR's
            `normalize_axis` takes axis 0 of rank 0; every importer reads `shape[axis]`).
        InvalidGraphError: If the axis is out of range.
    """
    if rank == 0:
        raise ctx.fail(f"axis {axis} of a scalar, which has no axes")
    return normalize_axis(axis, rank, ctx.where)


def axes_of(ctx: ImportContext, axes: Sequence[int], rank: int) -> list[int]:
    """Several axes made non-negative and sorted; duplicates are an error.

    Raises:
        UnsupportedModelError: As `axis_of`, or if an axis repeats.
        InvalidGraphError: As `axis_of`.
    """
    if rank == 0 and axes:
        raise ctx.fail(f"axes {list(axes)} of a scalar, which has no axes")
    result = sorted(normalize_axis(int(a), rank, ctx.where) for a in axes)
    if len(set(result)) != len(result):
        raise ctx.fail(f"axes {list(axes)} repeat an axis")
    return result


def scalar_like(ctx: ImportContext, x: Value, value: float | int | bool) -> Value:
    """A one-element constant of `x`'s dtype (it broadcasts in binary ops)."""
    return ctx.builder.constant(np.array(value).astype(x.dtype.numpy))


def broadcast_batch(ctx: ImportContext, a: Value, b: Value) -> tuple[Value, Value]:
    """Operands of an ONNX MatMul brought to equal rank and equal batch dimensions.

    1-D operands are promoted as numpy does; the caller removes the promoted axes again.
    """
    builder = ctx.builder
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2], ctx.where)
    a = builder.broadcast(a, (*batch, *a.shape[-2:]))
    b = builder.broadcast(b, (*batch, *b.shape[-2:]))
    return a, b


def matmul(ctx: ImportContext, a: Value, b: Value) -> Value:
    """numpy-style matmul: 1-D promotion and batch broadcasting."""
    builder = ctx.builder
    squeeze_front = a.rank == 1
    squeeze_back = b.rank == 1
    if squeeze_front:
        a = builder.view(a, (1, a.shape[0]))
    if squeeze_back:
        b = builder.view(b, (b.shape[0], 1))
    a, b = broadcast_batch(ctx, a, b)
    out = builder.matmul(a, b)
    shape: list[Dim] = list(out.shape)
    if squeeze_back:
        shape.pop(-1)
    if squeeze_front:
        shape.pop(-2 if not squeeze_back else -1)
    return builder.view(out, tuple(shape))


def keep_or_drop(ctx: ImportContext, x: Value, axes: Sequence[int], keepdims: bool) -> Value:
    """A reduction result (reduced axes kept as size 1) with those axes dropped unless kept."""
    if keepdims:
        return x
    shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return ctx.builder.view(x, shape)


def float_dtype(ctx: ImportContext, x: Value, what: str) -> DType:
    """`x`'s dtype, which must be a float type."""
    if not x.dtype.is_float:
        raise ctx.fail(f"{what} needs a float input, got {x.dtype.short}")
    return x.dtype


def static_dim(ctx: ImportContext, dim: Dim, what: str) -> int:
    """`dim` as an integer.

    Raises:
        SymbolicSizeError: If it is symbolic: `what` needs a static size.
    """
    if not isinstance(dim, int):
        raise ctx.fail_symbolic(f"{what} needs a static size, got {dim}")
    return dim
