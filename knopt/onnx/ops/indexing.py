"""Importers of ONNX gathers and scatters, all lowered to `Gather` and `Scatter` on flat views."""

from __future__ import annotations

import numpy as np
import onnx

from knopt.ir.dtype import DType
from knopt.ir.graph import Value
from knopt.ir.op import Binary, ScatterReduction
from knopt.ir.shape import numel
from knopt.onnx.context import ImportContext, OnnxValue, importer
from knopt.onnx.ops.common import axis_of

_REDUCTIONS = {
    "none": ScatterReduction.NONE,
    "add": ScatterReduction.ADD,
    "mul": ScatterReduction.MUL,
    "max": ScatterReduction.MAX,
    "min": ScatterReduction.MIN,
}


def _wrapped(ctx: ImportContext, indices: Value, size: int) -> Value:
    """Indices as int64 with negatives wrapped into [0, size)."""
    b = ctx.builder
    idx = b.cast(indices, DType.I64)
    negative = b.binary(Binary.LESS, idx, b.constant(np.array(0, np.int64)))
    return b.where(negative, b.add(idx, b.constant(np.array(size, np.int64))), idx)


def _static_shape(ctx: ImportContext, value: Value, what: str) -> tuple[int, ...]:
    if not all(isinstance(d, int) for d in value.shape):
        raise ctx.fail(f"{what} with symbolic sizes is not supported")
    return tuple(int(d) for d in value.shape)  # type: ignore[arg-type]


def _flat_element_indices(ctx: ImportContext, indices: Value, data_shape: tuple[int, ...],
                          axis: int) -> Value:
    """Flat positions in `data` of ScatterElements/GatherElements index tensors."""
    b = ctx.builder
    shape = _static_shape(ctx, indices, "indices")
    strides = np.cumprod((1, *data_shape[::-1]))[:-1][::-1]
    offsets = np.zeros(shape, np.int64)
    for dim, grid in enumerate(np.indices(shape)):
        if dim != axis:
            offsets += grid * strides[dim]
    idx = _wrapped(ctx, indices, data_shape[axis])
    scaled = b.mul(idx, b.constant(np.array(strides[axis], np.int64)))
    return b.add(scaled, b.constant(offsets))


@importer("GatherElements")
def _gather_elements(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    data, indices = ctx.inputs(node, count=2)
    axis = axis_of(ctx, ctx.attributes(node).int("axis", 0), data.rank)
    return [gather_elements(ctx, data, indices, axis)]


def gather_elements(ctx: ImportContext, data: Value, indices: Value, axis: int) -> Value:
    """ONNX GatherElements as a gather from the flattened data."""
    shape = _static_shape(ctx, data, "GatherElements")
    flat = ctx.builder.view(data, (numel(shape),))
    positions = _flat_element_indices(ctx, indices, shape, axis)
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
    idx = _wrapped(ctx, indices, _static_shape(ctx, data, "Scatter")[axis])
    return [ctx.builder.scatter(data, idx, updates, axis=axis, reduction=_REDUCTIONS[reduction])]


def _nd_positions(ctx: ImportContext, data: Value, indices: Value, batch_dims: int) -> Value:
    """Flat positions of the slices that ONNX GatherND/ScatterND indices address.

    Returns int64 positions of shape `indices.shape[:-1]`, into `data` viewed as
    `[prod(data.shape[:batch_dims + k]), *rest]`.
    """
    b = ctx.builder
    data_shape = _static_shape(ctx, data, "GatherND/ScatterND data")
    index_shape = _static_shape(ctx, indices, "GatherND/ScatterND indices")
    k = index_shape[-1]
    addressed = data_shape[batch_dims : batch_dims + k]
    strides = np.cumprod((1, *addressed[::-1]))[:-1][::-1]
    position = None
    for i in range(k):
        column = b.view(b.slice(indices, axis=indices.rank - 1, start=i, stop=i + 1), index_shape[:-1])
        term = b.mul(_wrapped(ctx, column, addressed[i]), b.constant(np.array(strides[i], np.int64)))
        position = term if position is None else b.add(position, term)
    if position is None:
        position = b.constant(np.zeros(index_shape[:-1], np.int64))
    if batch_dims:
        per_batch = int(np.prod(addressed))
        batch_index = np.indices(index_shape[:batch_dims]).reshape(batch_dims, -1)
        batch_flat = np.ravel_multi_index(batch_index, index_shape[:batch_dims]).reshape(
            index_shape[:batch_dims] + (1,) * (len(index_shape) - 1 - batch_dims)
        )
        position = b.add(position, b.constant(batch_flat.astype(np.int64) * per_batch))
    return position


@importer("GatherND")
def _gather_nd(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    data, indices = ctx.inputs(node, count=2)
    batch_dims = ctx.attributes(node).int("batch_dims", 0)
    data_shape = _static_shape(ctx, data, "GatherND")
    k = _static_shape(ctx, indices, "GatherND")[-1]
    rest = data_shape[batch_dims + k :]
    b = ctx.builder
    rows = b.view(data, (int(np.prod(data_shape[: batch_dims + k])), *rest))
    positions = _nd_positions(ctx, data, indices, batch_dims)
    return [b.gather(rows, positions, axis=0)]


@importer("ScatterND")
def _scatter_nd(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    data, indices, updates = ctx.inputs(node, count=3)
    reduction = ctx.attributes(node).string("reduction", "none")
    if reduction not in _REDUCTIONS:
        raise ctx.fail(f"ScatterND reduction '{reduction}' is not supported")
    data_shape = _static_shape(ctx, data, "ScatterND")
    index_shape = _static_shape(ctx, indices, "ScatterND")
    k = index_shape[-1]
    rest = data_shape[k:]
    b = ctx.builder
    count = int(np.prod(index_shape[:-1]))
    width = int(np.prod(rest))
    rows = b.view(data, (int(np.prod(data_shape[:k])), width))
    positions = b.view(_nd_positions(ctx, data, indices, 0), (count, 1))
    # Scatter every element of each addressed row: indices repeat the row along the width.
    row_indices = b.broadcast(positions, (count, width))
    flat_updates = b.view(updates, (count, width))
    result = b.scatter(rows, row_indices, flat_updates, axis=0, reduction=_REDUCTIONS[reduction])
    return [b.view(result, data_shape)]
