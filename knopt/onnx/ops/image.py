"""Importers of ONNX ops that rearrange image patches: Col2Im, CenterCropPad and MaxUnpool.

Where the layout is static (Col2Im), the positions every element moves to are a constant table
and one scatter-add places them; MaxUnpool scatters to the positions its indices input names.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx

from knopt.ir.graph import Value
from knopt.ir.op import PadMode, ScatterReduction
from knopt.ir.shape import Shape, numel
from knopt.onnx.context import ImportContext, OnnxValue, importer
from knopt.onnx.ops.common import PoolWindow, axes_of, static_dim
from knopt.onnx.ops.indexing import gather_elements, wrapped_indices
from knopt.onnx.ops.tensor import pad_signed


def _ints(ctx: ImportContext, node: onnx.NodeProto, index: int, what: str) -> list[int]:
    known = ctx.known_ints(node, index, what)
    if known is None:
        raise ctx.fail(f"input {index} ({what}) is required")
    return known


def col2im_positions(
    image: list[int], block: list[int], strides: list[int], pads: list[int], dilations: list[int]
) -> tuple[np.ndarray, list[int]]:
    """Flat positions in the padded image of every `[block offset, window]` column entry."""
    k = len(image)
    padded = [image[i] + pads[i] + pads[i + k] for i in range(k)]
    windows = [
        (padded[i] - (dilations[i] * (block[i] - 1) + 1)) // strides[i] + 1 for i in range(k)
    ]
    offsets = np.indices(block).reshape(k, -1)  # [k, prod(block)]
    starts = np.indices(windows).reshape(k, -1)  # [k, prod(windows)]
    coords = (
        offsets[:, :, None] * np.array(dilations)[:, None, None]
        + starts[:, None, :] * np.array(strides)[:, None, None]
    )
    flat = np.ravel_multi_index(tuple(coords), padded)
    return flat.reshape(-1), padded


@importer("Col2Im", since=18)
def _col2im(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x = ctx.value(node.input[0])
    attrs = ctx.attributes(node)
    image, block = _ints(ctx, node, 1, "image_shape"), _ints(ctx, node, 2, "block_shape")
    k = len(image)
    strides = attrs.ints("strides", [1] * k)
    dilations = attrs.ints("dilations", [1] * k)
    pads = attrs.ints("pads", [0] * (2 * k))
    positions, padded = col2im_positions(image, block, strides, pads, dilations)
    n, columns, length = ctx.shape_of(x, 3, "Col2Im's input")
    per_block = int(np.prod(block))
    columns = static_dim(ctx, columns, "Col2Im")
    if columns % per_block or positions.size != per_block * static_dim(ctx, length, "Col2Im"):
        raise ctx.fail(f"Col2Im input {x.type} does not fit image {image} and block {block}")
    channels = columns // per_block
    b = ctx.builder
    updates = b.view(x, (n, channels, positions.size))
    indices = b.broadcast(b.constant(positions.reshape(1, 1, -1).astype(np.int64)), updates.shape)
    canvas = b.scalar(0, x.dtype, (n, channels, int(np.prod(padded))))
    summed = b.scatter(canvas, indices, updates, axis=2, reduction=ScatterReduction.ADD)
    y = b.view(summed, (n, channels, *padded))
    widths = [(0, 0), (0, 0), *((-pads[i], -pads[i + k]) for i in range(k))]
    return [pad_signed(ctx, y, widths, PadMode.CONSTANT, 0.0)]


@importer("CenterCropPad", since=18)
def _center_crop_pad(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x = ctx.value(node.input[0])
    attrs = ctx.attributes(node)
    axes = attrs.ints("axes", list(range(x.rank)))
    axes = [a % x.rank for a in axes]
    axes_of(ctx, axes, x.rank)  # rejects repeated axes
    sizes = _ints(ctx, node, 1, "shape")
    if len(sizes) != len(axes):
        raise ctx.fail(f"shape {sizes} needs one size per axis of {axes}")
    widths = [(0, 0)] * x.rank
    for axis, size in zip(axes, sizes, strict=True):
        dim = x.shape[axis]
        if not isinstance(dim, int):
            raise ctx.fail("CenterCropPad needs static sizes on its axes")
        grow = size - dim  # negative crops; the odd element goes to (or comes from) the end
        before = grow // 2 if grow >= 0 else -((-grow) // 2)
        widths[axis] = (before, grow - before)
    return [pad_signed(ctx, x, widths, PadMode.CONSTANT, 0.0)]


@importer("MaxUnpool", since=9)
def _max_unpool(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x, indices = ctx.inputs(node, count=(2, 3))[:2]
    attrs = ctx.attributes(node)
    kernel = attrs.ints("kernel_shape")
    k = len(kernel)
    strides = attrs.ints("strides", [1] * k)
    pads = attrs.ints("pads", [0] * (2 * k))
    n, c, *dims = (static_dim(ctx, d, "MaxUnpool") for d in x.shape)
    inferred = [(dims[i] - 1) * strides[i] - (pads[i] + pads[i + k]) + kernel[i] for i in range(k)]
    full = (n, c, *inferred)
    b = ctx.builder
    total = int(np.prod(full))
    flat_x = b.view(x, (numel(x.shape),))
    places = wrapped_indices(ctx, b.view(indices, (numel(indices.shape),)), total)
    canvas = b.scalar(0, x.dtype, (total,))
    y = b.view(b.scatter(canvas, places, flat_x, axis=0), full)
    if len(node.input) > 2 and node.input[2]:
        target = _ints(ctx, node, 2, "output_shape")
        widths = [(0, t - d) for t, d in zip(target, full, strict=True)]
        y = pad_signed(ctx, y, widths, PadMode.CONSTANT, 0.0)
    return [y]


def _window_table(
    sizes: tuple[int, ...], window: PoolWindow, out: tuple[int, ...], column_major: bool
) -> tuple[np.ndarray, np.ndarray]:
    """The spatial index (row- or column-major) each output position and tap `[O, K]` reads.

    Returns the indices and whether each tap lies inside the input.
    """
    k = len(sizes)
    outs = np.indices(out).reshape(k, -1)  # [k, O]
    taps = np.indices(window.kernel).reshape(k, -1)  # [k, K]
    stride = np.array(window.strides)[:, None, None]
    dilation = np.array(window.dilations)[:, None, None]
    before = np.array([p[0] for p in window.pads])[:, None, None]
    coords = outs[:, :, None] * stride + taps[:, None, :] * dilation - before  # [k, O, K]
    limits = np.array(sizes)[:, None, None]
    inside = np.all((coords >= 0) & (coords < limits), axis=0)
    clipped = np.clip(coords, 0, limits - 1)
    order = tuple(clipped[::-1]) if column_major else tuple(clipped)
    flat = np.ravel_multi_index(order, sizes[::-1] if column_major else sizes)
    return flat, inside


def max_pool_indices(
    ctx: ImportContext, x: Value, window: PoolWindow, out: Shape, column_major: bool
) -> Value:
    """MaxPool's Indices output: the flat position in `x` of each window's first maximum."""
    b = ctx.builder
    n, c, *spatial = (static_dim(ctx, d, "MaxPool's Indices") for d in x.shape)
    sizes = tuple(spatial)
    outputs = tuple(static_dim(ctx, d, "MaxPool's Indices") for d in out)
    row_major, inside = _window_table(sizes, window, outputs, False)
    stored, _ = _window_table(sizes, window, outputs, column_major)
    count, taps = row_major.shape
    total = int(np.prod(sizes))
    flat = b.view(x, (n, c, total))
    values = b.gather(flat, b.constant(row_major.astype(np.int64)), axis=2)  # [N, C, O, K]
    lowest = -np.inf if x.dtype.is_float else float(ml_dtypes.iinfo(x.dtype.numpy).min)
    values = b.where(b.constant(inside), values, b.scalar(lowest, x.dtype))
    best = b.arg_reduce(values, axis=3)  # [N, C, O, 1], the first maximum
    table = b.broadcast(
        b.constant(stored.astype(np.int64).reshape(1, 1, count, taps)), (n, c, count, taps)
    )
    spatial_index = gather_elements(ctx, table, best, 3)
    planes = b.view(b.iota(n * c), (n, c, 1, 1))
    index = b.add(b.mul(planes, b.constant(np.array(total, np.int64))), spatial_index)
    return b.view(index, (n, c, *outputs))
