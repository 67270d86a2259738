"""Importers of ONNX reductions: Reduce*, ArgMax/ArgMin, TopK and CumSum."""

from __future__ import annotations

import numpy as np
import onnx

from knopt.ir.dtype import DType
from knopt.ir.graph import Value
from knopt.ir.op import Reduction, Unary
from knopt.onnx.context import ImportContext, OnnxValue, importer
from knopt.onnx.ops.common import axes_of, axis_of, keep_or_drop, scalar_like
from knopt.onnx.ops.indexing import gather_elements
from knopt.onnx.ops.nn import mean

# From these opset versions on, the reduction takes its axes as an input, not an attribute.
_AXES_AS_INPUT_SINCE = {"ReduceSum": 13}
_AXES_AS_INPUT_DEFAULT = 18


def _reduction_axes(ctx: ImportContext, node: onnx.NodeProto, x: Value) -> list[int] | None:
    """The axes to reduce, or None for "reduce nothing" (noop_with_empty_axes)."""
    attrs = ctx.attributes(node)
    since = _AXES_AS_INPUT_SINCE.get(node.op_type, _AXES_AS_INPUT_DEFAULT)
    if ctx.opset < since:
        axes = attrs.ints("axes") if attrs.has("axes") else []
        noop = 0
    else:
        axes = ctx.known_ints(node, 1, "axes") or []
        noop = attrs.int("noop_with_empty_axes", 0)
    if not axes:
        return None if noop else list(range(x.rank))
    return axes_of(ctx, axes, x.rank)


def _reducer(combine):
    def run(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
        x = ctx.value(node.input[0])
        keepdims = bool(ctx.attributes(node).int("keepdims", 1))
        axes = _reduction_axes(ctx, node, x)
        if axes is None:
            return [x]
        return [keep_or_drop(ctx, combine(ctx, x, axes), axes, keepdims)]

    return run


def _sum(ctx: ImportContext, x: Value, axes: list[int]) -> Value:
    return ctx.builder.reduce(Reduction.SUM, x, axes=axes)


def _square(ctx: ImportContext, x: Value) -> Value:
    return ctx.builder.mul(x, x)


_REDUCERS = {
    "ReduceSum": _sum,
    "ReduceMean": mean,
    "ReduceProd": lambda ctx, x, axes: ctx.builder.reduce(Reduction.PROD, x, axes=axes),
    "ReduceMax": lambda ctx, x, axes: ctx.builder.reduce(Reduction.MAX, x, axes=axes),
    "ReduceMin": lambda ctx, x, axes: ctx.builder.reduce(Reduction.MIN, x, axes=axes),
    "ReduceSumSquare": lambda ctx, x, axes: _sum(ctx, _square(ctx, x), axes),
    "ReduceL1": lambda ctx, x, axes: _sum(ctx, ctx.builder.unary(Unary.ABS, x), axes),
    "ReduceL2": lambda ctx, x, axes: _l2(ctx, x, axes),
    "ReduceLogSum": lambda ctx, x, axes: ctx.builder.unary(Unary.LOG, _sum(ctx, x, axes)),
    "ReduceLogSumExp": lambda ctx, x, axes: _log_sum_exp(ctx, x, axes),
}


def _l2(ctx: ImportContext, x: Value, axes: list[int]) -> Value:
    total = _sum(ctx, _square(ctx, x), axes)
    if x.dtype.is_float:
        return ctx.builder.unary(Unary.SQRT, total)
    as_float = ctx.builder.cast(total, DType.F64)
    return ctx.builder.cast(ctx.builder.unary(Unary.SQRT, as_float), x.dtype)


def _log_sum_exp(ctx: ImportContext, x: Value, axes: list[int]) -> Value:
    b = ctx.builder
    peak = b.reduce(Reduction.MAX, x, axes=axes)
    finite = b.where(b.unary(Unary.IS_INF, peak), scalar_like(ctx, x, 0), peak)
    total = _sum(ctx, b.unary(Unary.EXP, b.sub(x, finite)), axes)
    return b.add(b.unary(Unary.LOG, total), finite)


for _name, _combine in _REDUCERS.items():
    importer(_name)(_reducer(_combine))


def _arg(largest: bool):
    def run(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
        (x,) = ctx.inputs(node, count=1)
        attrs = ctx.attributes(node)
        axis = axis_of(ctx, attrs.int("axis", 0), x.rank)
        keepdims = bool(attrs.int("keepdims", 1))
        last = bool(attrs.int("select_last_index", 0))
        found = ctx.builder.arg_reduce(x, axis=axis, largest=largest, last=last)
        return [keep_or_drop(ctx, found, [axis], keepdims)]

    return run


importer("ArgMax")(_arg(True))
importer("ArgMin")(_arg(False))


@importer("TopK")
def _top_k(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x = ctx.value(node.input[0])
    attrs = ctx.attributes(node)
    axis = axis_of(ctx, attrs.int("axis", -1), x.rank)
    k = attrs.int("k") if ctx.opset < 10 else ctx.known_int(node, 1, "K")
    largest = bool(attrs.int("largest", 1))
    attrs.skip("sorted")  # results are always sorted, which is allowed either way
    b = ctx.builder
    order = b.arg_sort(x, axis=axis, descending=largest)
    indices = b.slice(order, axis=axis, start=0, stop=k)
    return [gather_elements(ctx, x, indices, axis), indices]


@importer("CumSum")
def _cumsum(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x = ctx.value(node.input[0])
    attrs = ctx.attributes(node)
    axis = axis_of(ctx, ctx.known_int(node, 1, "axis"), x.rank)
    exclusive, reverse = bool(attrs.int("exclusive", 0)), bool(attrs.int("reverse", 0))
    return [ctx.builder.cumsum(x, axis=axis, exclusive=exclusive, reverse=reverse)]


@importer("CumProd", since=26)
def _cumprod(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x = ctx.value(node.input[0])
    attrs = ctx.attributes(node)
    axis = axis_of(ctx, ctx.known_int(node, 1, "axis"), x.rank)
    exclusive, reverse = bool(attrs.int("exclusive", 0)), bool(attrs.int("reverse", 0))
    size = x.shape[axis]
    if not isinstance(size, int):
        raise ctx.fail("CumProd needs a static size along its axis")
    # Output i multiplies the inputs j that it covers: a [size, size] mask, then a product over j.
    i, j = np.indices((size, size))
    covered = (j >= i) if reverse else (j <= i)
    if exclusive:
        covered &= j != i
    b = ctx.builder
    spread = b.view(x, (*x.shape[:axis], 1, size, *x.shape[axis + 1 :]))
    mask = b.constant(covered.reshape(size, size, *(1,) * (x.rank - axis - 1)))
    terms = b.where(mask, spread, scalar_like(ctx, x, 1))
    product = b.reduce(Reduction.PROD, terms, axes=[axis + 1])
    return [b.view(product, x.shape)]
