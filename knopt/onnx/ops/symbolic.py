"""Folders for shape arithmetic on symbolic sizes (known values holding `Sym` entries).

Symbolic sizes are positive, which decides comparisons against integers below 1. Anything
undecidable makes the folder give up; the node is then imported as runtime work.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx

from knopt.ir.dtype import DType
from knopt.ir.memory import check_rank, check_shape
from knopt.ir.shape import Dim, Sym, exact_div
from knopt.onnx.context import ImportContext, Known, folder
from knopt.onnx.ops.common import axes_of, axis_of
from knopt.onnx.ops.tensor import reshape_target


class _Undecidable(Exception):
    """A comparison or operation whose result depends on the value of a symbolic size."""


def _objects(known: Known) -> np.ndarray:
    return known.array.astype(object)


def _result(array: np.ndarray, dtype: DType = DType.I64) -> Known:
    array = np.asarray(array, dtype=object)
    if any(isinstance(v, Sym) for v in array.flat):
        return Known(array, dtype)
    return Known(np.asarray(array.astype(dtype.numpy)), dtype)


def _div(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int):
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b >= 0) else -q
    return exact_div(a, b)


def _compare(op: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    def run(a: Any, b: Any) -> bool:
        if isinstance(a, int) and isinstance(b, int):
            return op(a, b)
        if a == b:
            return op(0, 0)
        # A symbolic size s is at least 1: against an integer c < 1 it behaves like 1.
        if isinstance(a, Sym) and isinstance(b, int) and b < 1:
            return op(1, b)
        if isinstance(b, Sym) and isinstance(a, int) and a < 1:
            return op(a, 1)
        raise _Undecidable

    return run


def _extreme(pick_max: bool) -> Callable[[Any, Any], Any]:
    def run(a: Any, b: Any) -> Any:
        if isinstance(a, int) and isinstance(b, int):
            return max(a, b) if pick_max else min(a, b)
        if a == b:
            return a
        small, large = (a, b) if isinstance(a, int) else (b, a)
        if isinstance(small, int) and small <= 1:
            return large if pick_max else small
        raise _Undecidable

    return run


_ELEMENTWISE: dict[str, tuple[Callable[[Any, Any], Any], bool]] = {
    "Add": (operator.add, False),
    "Sub": (operator.sub, False),
    "Mul": (operator.mul, False),
    "Div": (_div, False),
    "Max": (_extreme(True), False),
    "Min": (_extreme(False), False),
    "Equal": (_compare(operator.eq), True),
    "Less": (_compare(operator.lt), True),
    "LessOrEqual": (_compare(operator.le), True),
    "Greater": (_compare(operator.gt), True),
    "GreaterOrEqual": (_compare(operator.ge), True),
}


def _elementwise_folder(name: str) -> None:
    fn, to_bool = _ELEMENTWISE[name]

    @folder(name)
    def run(
        ctx: ImportContext, node: onnx.NodeProto, args: list[Known | None]
    ) -> list[Known] | None:
        ctx.attributes(node)
        values = [a for a in args if a is not None]
        if not all(v.dtype.is_int for v in values):
            return None
        _broadcast(ctx, *(v.array.shape for v in values))
        try:
            result = values[0].array.astype(object)
            for other in values[1:]:
                result = np.frompyfunc(fn, 2, 1)(result, _objects(other))
        except _Undecidable:
            return None
        return [_result(np.asarray(result), DType.BOOL if to_bool else values[0].dtype)]


for _name in _ELEMENTWISE:
    _elementwise_folder(_name)


@folder("Neg")
def _neg(ctx: ImportContext, node: onnx.NodeProto, args: list[Known | None]) -> list[Known] | None:
    ctx.attributes(node)
    (x,) = args
    assert x is not None
    return [_result(np.frompyfunc(operator.neg, 1, 1)(_objects(x)), x.dtype)]


@folder("Identity")
def _identity(
    ctx: ImportContext, node: onnx.NodeProto, args: list[Known | None]
) -> list[Known] | None:
    ctx.attributes(node)
    (x,) = args
    assert x is not None
    return [x]


@folder("Cast")
def _cast(ctx: ImportContext, node: onnx.NodeProto, args: list[Known | None]) -> list[Known] | None:
    attrs = ctx.attributes(node)
    dtype = DType.from_onnx(attrs.int("to"), ctx.where)
    attrs.skip("saturate")
    (x,) = args
    assert x is not None
    return [Known(x.array, dtype)] if dtype.is_int else None


@folder("Gather")
def _gather(
    ctx: ImportContext, node: onnx.NodeProto, args: list[Known | None]
) -> list[Known] | None:
    data, indices = args
    assert data is not None and indices is not None
    axis = axis_of(ctx, ctx.attributes(node).int("axis", 0), data.array.ndim)
    if _unfit_parameters(args):
        return None
    check_rank(data.array.ndim - 1 + indices.array.ndim, ctx.where)
    size = data.array.shape[axis]
    idx = indices.concrete().astype(np.int64)
    if idx.size and (idx.min() < -size or idx.max() >= size):
        raise ctx.fail(f"indices {idx.reshape(-1).tolist()} are out of range for size {size}")
    idx = np.where(idx < 0, idx + size, idx)
    return [_result(np.take(_objects(data), idx, axis=axis), data.dtype)]


@folder("Concat")
def _concat(
    ctx: ImportContext, node: onnx.NodeProto, args: list[Known | None]
) -> list[Known] | None:
    values = [a for a in args if a is not None]
    ranks = {v.array.ndim for v in values}
    if len(ranks) != 1 or 0 in ranks:
        return None  # the importer names the shapes that do not fit
    axis = axis_of(ctx, ctx.attributes(node).int("axis"), values[0].array.ndim)
    if len({v.array.shape[:axis] + v.array.shape[axis + 1 :] for v in values}) != 1:
        return None
    joined = np.concatenate([_objects(v) for v in values], axis=axis)
    return [_result(joined, values[0].dtype)]


@folder("Unsqueeze")
def _unsqueeze(
    ctx: ImportContext, node: onnx.NodeProto, args: list[Known | None]
) -> list[Known] | None:
    if _unfit_parameters(args):
        return None
    x = args[0]
    assert x is not None
    axes = _axes(ctx, node, args)
    if axes is None:
        return None
    rank = x.array.ndim + len(axes)
    check_rank(rank, ctx.where)
    positions = axes_of(ctx, axes, rank)
    shape = list(x.array.shape)
    for p in positions:
        shape.insert(p, 1)
    return [Known(x.array.reshape(shape), x.dtype)]


@folder("Squeeze")
def _squeeze(
    ctx: ImportContext, node: onnx.NodeProto, args: list[Known | None]
) -> list[Known] | None:
    if _unfit_parameters(args):
        return None
    x = args[0]
    assert x is not None
    axes = _axes(ctx, node, args)
    shape = x.array.shape
    drop = (
        [i for i, d in enumerate(shape) if d == 1]
        if axes is None
        else axes_of(ctx, axes, len(shape))
    )
    if any(shape[i] != 1 for i in drop):
        return None  # the importer names the axis that is not of size 1
    return [Known(x.array.reshape([d for i, d in enumerate(shape) if i not in drop]), x.dtype)]


def _unfit_parameters(args: list[Known | None]) -> bool:
    """Whether an input after the data (axes, say) is symbolic or not of an integer type.

    The importer then decides, and names what is wrong.
    """
    return any(a is not None and (a.is_symbolic or not a.dtype.is_int) for a in args[1:])


def _axes(ctx: ImportContext, node: onnx.NodeProto, args: list[Known | None]) -> list[int] | None:
    attrs = ctx.attributes(node)
    if ctx.opset < 13:
        return attrs.ints("axes") if attrs.has("axes") else None
    if len(args) < 2 or args[1] is None:
        return None
    return [int(a) for a in args[1].concrete().reshape(-1)]


@folder("Slice")
def _slice(
    ctx: ImportContext, node: onnx.NodeProto, args: list[Known | None]
) -> list[Known] | None:
    ctx.attributes(node)
    if ctx.opset < 10 or _unfit_parameters(args):
        return None
    x = args[0]
    assert x is not None
    array = _objects(x)
    starts, ends = (args[i].concrete().reshape(-1) for i in (1, 2))  # type: ignore[union-attr]
    axes = (
        args[3].concrete().reshape(-1)
        if len(args) > 3 and args[3] is not None
        else range(len(starts))
    )
    steps = (
        args[4].concrete().reshape(-1)
        if len(args) > 4 and args[4] is not None
        else [1] * len(starts)
    )
    if not len(starts) == len(ends) == len(axes) == len(steps) or 0 in list(steps):
        return None  # the importer names what is wrong
    index = [slice(None)] * array.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        index[axis_of(ctx, int(axis), array.ndim)] = slice(int(start), int(end), int(step))
    return [_result(array[tuple(index)], x.dtype)]


@folder("Reshape")
def _reshape(
    ctx: ImportContext, node: onnx.NodeProto, args: list[Known | None]
) -> list[Known] | None:
    allow_zero = ctx.attributes(node).int("allowzero", 0)
    x, shape = args
    assert x is not None and shape is not None
    if _unfit_parameters(args):
        return None
    requested: list[Dim] = [int(d) for d in shape.concrete().reshape(-1)]
    check_rank(len(requested), ctx.where)
    target = reshape_target(ctx, x.array.shape, requested, bool(allow_zero))
    sizes = [d for d in target if isinstance(d, int) and d >= 0]
    if len(sizes) != len(target) or math.prod(sizes) != x.array.size:
        return None  # the importer names what does not fit
    return [Known(x.array.reshape(sizes), x.dtype)]


@folder("ReduceProd")
def _reduce_prod(
    ctx: ImportContext, node: onnx.NodeProto, args: list[Known | None]
) -> list[Known] | None:
    attrs = ctx.attributes(node)
    keepdims = bool(attrs.int("keepdims", 1))
    x = args[0]
    assert x is not None
    if _unfit_parameters(args):
        return None
    if ctx.opset < 18:
        axes = attrs.ints("axes") if attrs.has("axes") else None
    else:
        attrs.int("noop_with_empty_axes", 0)
        axes = None if len(args) < 2 or args[1] is None else args[1].concrete().reshape(-1).tolist()
    axis = None if not axes else tuple(axes_of(ctx, axes, x.array.ndim))
    product = np.multiply.reduce(_objects(x), axis=axis, keepdims=keepdims, initial=1)  # type: ignore[call-overload]
    return [_result(np.asarray(product), x.dtype)]


@folder("Where")
def _where(
    ctx: ImportContext, node: onnx.NodeProto, args: list[Known | None]
) -> list[Known] | None:
    ctx.attributes(node)
    condition, x, y = args
    assert condition is not None and x is not None and y is not None
    if condition.is_symbolic:
        return None
    _broadcast(ctx, condition.array.shape, x.array.shape, y.array.shape)
    chosen = np.where(condition.concrete().astype(bool), _objects(x), _objects(y))
    return [_result(chosen, x.dtype)]


@folder("Expand")
def _expand(
    ctx: ImportContext, node: onnx.NodeProto, args: list[Known | None]
) -> list[Known] | None:
    ctx.attributes(node)
    x, shape = args
    assert x is not None and shape is not None
    if _unfit_parameters(args):
        return None
    target = _broadcast(ctx, x.array.shape, tuple(int(d) for d in shape.concrete()))
    return [_result(np.broadcast_to(_objects(x), target).copy(), x.dtype)]


def _broadcast(ctx: ImportContext, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    """The broadcast of known shapes, checked against the memory budget (objects: 8 bytes)."""
    check_rank(max((len(s) for s in shapes), default=0), ctx.where)
    try:
        target = np.broadcast_shapes(*shapes)
    except ValueError as err:
        raise ctx.fail(f"shapes {[list(s) for s in shapes]} do not broadcast") from err
    check_shape(target, 8, ctx.where)
    return target
