"""Importers of ONNX gathers and scatters, all lowered to `Gather` and `Scatter` on flat views."""

from __future__ import annotations

import numpy as np
import onnx

from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.graph import Value
from knopt.ir.op import Binary, ScatterReduction
from knopt.ir.shape import Dim, Shape, numel
from knopt.onnx.context import ImportContext, Known, OnnxValue, importer
from knopt.onnx.ops.common import axis_of, static_dim

_REDUCTIONS = {
    "none": ScatterReduction.NONE,
    "add": ScatterReduction.ADD,
    "mul": ScatterReduction.MUL,
    "max": ScatterReduction.MAX,
    "min": ScatterReduction.MIN,
}


def _size_value(ctx: ImportContext, dim: Dim) -> Value:
    """A 0-d int64 value holding `dim`, which may be symbolic."""
    b = ctx.builder
    if isinstance(dim, int):
        return b.constant(np.array(dim, np.int64))
    return b.view(b.apply(ops.Sizes((dim,))), ())


def wrapped_indices(ctx: ImportContext, indices: Value, size: Dim) -> Value:
    """Indices as int64 with negatives wrapped into [0, size).

    Raises:
        UnsupportedModelError: If the indices are not integers (a cast would truncate them).
    """
    if not indices.dtype.is_int:
        raise ctx.fail(f"indices must be integers, not {indices.dtype.short}")
    b = ctx.builder
    idx = b.cast(indices, DType.I64)
    negative = b.binary(Binary.LESS, idx, b.constant(np.array(0, np.int64)))
    return b.where(negative, b.add(idx, _size_value(ctx, size)), idx)


def _flat_element_indices(
    ctx: ImportContext, indices: Value, data_shape: Shape, axis: int
) -> Value:
    """Flat positions in `data` of ScatterElements/GatherElements index tensors.

    Position `(i0, ..., ik)` of `indices` addresses `data` at the same coordinates except on
    `axis`, where it takes the index's value. The coordinates come from `Iota`s and the strides
    from `Sizes`, so symbolic sizes (dynamic batch or sequence) work.
    """
    b = ctx.builder
    rank = indices.rank
    strides: list[Dim] = [numel(data_shape[d + 1 :]) for d in range(rank)]
    position = b.mul(
        wrapped_indices(ctx, indices, data_shape[axis]), _size_value(ctx, strides[axis])
    )
    for d in range(rank):
        if d == axis or indices.shape[d] == 1:
            continue  # a size-1 axis only ever has coordinate 0
        shape = tuple(indices.shape[d] if i == d else 1 for i in range(rank))
        grid = b.view(b.iota(indices.shape[d]), shape)
        position = b.add(position, b.mul(grid, _size_value(ctx, strides[d])))
    return position


@importer("GatherElements")
def _gather_elements(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    data, indices = ctx.inputs(node, count=2)
    axis = axis_of(ctx, ctx.attributes(node).int("axis", 0), data.rank)
    return [gather_elements(ctx, data, indices, axis)]


def gather_elements(ctx: ImportContext, data: Value, indices: Value, axis: int) -> Value:
    """ONNX GatherElements as a gather from the flattened data.

    Raises:
        UnsupportedModelError: If `indices` and `data` differ in rank, or `indices` is longer
            than `data` on another axis than `axis` (its positions would address the next row).
    """
    if indices.rank != data.rank:
        raise ctx.fail(f"indices {indices.type} and data {data.type} differ in rank")
    for d, (size, bound) in enumerate(zip(indices.shape, data.shape, strict=True)):
        if d != axis and isinstance(size, int) and isinstance(bound, int) and size > bound:
            raise ctx.fail(f"indices {indices.type} reach beyond data {data.type} on axis {d}")
    flat = ctx.builder.view(data, (numel(data.shape),))
    positions = _flat_element_indices(ctx, indices, data.shape, axis)
    return ctx.builder.gather(flat, positions, axis=0)


@importer("ScatterElements")
@importer("Scatter")
def _scatter_elements(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    data, indices, updates = ctx.inputs(node, count=3)
    attrs = ctx.attributes(node)
    axis = axis_of(ctx, attrs.int("axis", 0), data.rank)
    reduction = attrs.string("reduction", "none")
    if reduction not in _REDUCTIONS:
        raise ctx.fail(f"scatter reduction '{reduction}' is not supported")
    idx = wrapped_indices(ctx, indices, data.shape[axis])
    return [ctx.builder.scatter(data, idx, updates, axis=axis, reduction=_REDUCTIONS[reduction])]


def _nd_positions(ctx: ImportContext, data: Value, indices: Value, batch_dims: int) -> Value:
    """Flat positions of the slices that ONNX GatherND/ScatterND indices address.

    Returns int64 positions of shape `indices.shape[:-1]`, into `data` viewed as
    `[prod(data.shape[:batch_dims + k]), *rest]`. Only `k` (the last index axis) must be
    static: strides come from `Sizes` and batch coordinates from `Iota`s, so symbolic sizes
    (the index grids TorchScript exports for slice assignments) work.
    """
    b = ctx.builder
    if indices.rank < 1 or not 0 <= batch_dims < min(data.rank, indices.rank):
        raise ctx.fail(f"batch_dims {batch_dims} does not fit data {data} and indices {indices}")
    k = static_dim(ctx, indices.shape[-1], "GatherND/ScatterND index depth")
    if batch_dims + k > data.rank:
        raise ctx.fail(f"indices address {k} axes after {batch_dims}, but data is {data}")
    outer = indices.shape[:-1]
    addressed = data.shape[batch_dims : batch_dims + k]
    position = b.scalar(0, DType.I64, outer)
    for i in range(k):
        column = b.view(b.slice(indices, axis=indices.rank - 1, start=i, stop=i + 1), outer)
        stride = _size_value(ctx, numel(addressed[i + 1 :]))
        term = b.mul(wrapped_indices(ctx, column, addressed[i]), stride)
        position = term if i == 0 else b.add(position, term)
    # Batch coordinates count whole blocks of the addressed axes.
    for d in range(batch_dims):
        if outer[d] == 1:
            continue  # a size-1 axis only ever has coordinate 0
        grid = b.view(b.iota(outer[d]), tuple(outer[d] if i == d else 1 for i in range(len(outer))))
        block = _size_value(ctx, numel(data.shape[d + 1 : batch_dims + k]))
        position = b.add(position, b.mul(grid, block))
    return position


@importer("GatherND")
def _gather_nd(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    data, indices = ctx.inputs(node, count=2)
    batch_dims = ctx.attributes(node).int("batch_dims", 0)
    positions = _nd_positions(ctx, data, indices, batch_dims)
    depth = batch_dims + static_dim(ctx, indices.shape[-1], "GatherND index depth")
    b = ctx.builder
    rows = b.view(data, (numel(data.shape[:depth]), *data.shape[depth:]))
    return [b.gather(rows, positions, axis=0)]


@importer("ScatterND")
def _scatter_nd(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    data, indices, updates = ctx.inputs(node, count=3)
    reduction = ctx.attributes(node).string("reduction", "none")
    if reduction not in _REDUCTIONS:
        raise ctx.fail(f"ScatterND reduction '{reduction}' is not supported")
    positions = _nd_positions(ctx, data, indices, 0)
    k = static_dim(ctx, indices.shape[-1], "ScatterND index depth")
    b = ctx.builder
    count = numel(indices.shape[:-1])
    width = numel(data.shape[k:])
    rows = b.view(data, (numel(data.shape[:k]), width))
    # Scatter every element of each addressed row: indices repeat the row along the width.
    row_indices = b.broadcast(b.view(positions, (count, 1)), (count, width))
    flat_updates = b.view(updates, (count, width))
    result = b.scatter(rows, row_indices, flat_updates, axis=0, reduction=_REDUCTIONS[reduction])
    return [b.view(result, data.shape)]


@importer("ReverseSequence", since=10)
def _reverse_sequence(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    data, lengths = ctx.inputs(node, count=2)
    attrs = ctx.attributes(node)
    batch_axis = axis_of(ctx, attrs.int("batch_axis", 1), data.rank)
    time_axis = axis_of(ctx, attrs.int("time_axis", 0), data.rank)
    b = ctx.builder
    steps = data.shape[time_axis]
    rank = data.rank
    time = b.view(b.iota(steps), tuple(steps if i == time_axis else 1 for i in range(rank)))
    counts = b.cast(lengths, DType.I64)
    counts = b.view(counts, tuple(counts.shape[0] if i == batch_axis else 1 for i in range(rank)))
    # Within its length a sequence reads backwards; past it, it stays in place.
    backwards = b.sub(b.sub(counts, b.constant(np.array(1, np.int64))), time)
    source = b.where(b.binary(Binary.LESS, time, counts), backwards, time)
    return [gather_elements(ctx, data, b.broadcast(source, data.shape), time_axis)]


@importer("NonZero", since=9)
def _non_zero(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    ctx.attributes(node)
    found = ctx.lookup(node.input[0])
    if isinstance(found, Known) and not found.is_symbolic:
        array = found.concrete()
        return [Known(np.asarray(np.nonzero(array), np.int64).reshape(array.ndim, -1), DType.I64)]
    x = ctx.value(node.input[0])
    if x.rank == 0 or not _is_all_nonzero(x):
        raise ctx.fail(
            "NonZero's output size depends on its input's values, which must then be known "
            "when loading; only constants and constant fills are supported"
        )
    # torch.arange before opset 11 exports as NonZero(ConstantOfShape(n)): every element is
    # non-zero, so the result is the coordinates of all elements in row-major order.
    b = ctx.builder
    rows = []
    for axis, size in enumerate(x.shape):
        line = b.view(b.iota(size), tuple(size if i == axis else 1 for i in range(x.rank)))
        rows.append(b.view(b.broadcast(line, x.shape), (1, numel(x.shape))))
    return [b.concat(rows, axis=0)]


def _is_all_nonzero(x: Value) -> bool:
    """True if `x` is a view or broadcast of a constant without zeros."""
    while isinstance(x.producer.op, ops.View | ops.Broadcast):
        x = x.producer.inputs[0]
    op = x.producer.op
    return isinstance(op, ops.Constant) and bool(np.all(op.data.array != 0))
