"""Importers of ONNX ops that sample images at computed positions: GridSample and AffineGrid.

GridSample reads the input at positions known only at run time. Each output position takes
taps (1 for nearest, 2 per axis for linear, 4 for cubic) whose indices, weights and validity are
computed elementwise from the grid, then gathered from the flattened input: the same arithmetic
as the ONNX reference implementation, vectorized.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import onnx

from knopt.ir.dtype import DType
from knopt.ir.graph import Value
from knopt.ir.op import Binary, Reduction, Unary
from knopt.ir.shape import Dim, numel
from knopt.onnx.context import ImportContext, OnnxValue, importer
from knopt.onnx.ops.common import static_dim
from knopt.onnx.ops.indexing import gather_elements

_MODES = {
    "nearest": "nearest",
    "linear": "linear",
    "cubic": "cubic",
    "bilinear": "linear",
    "bicubic": "cubic",
}
_PADDINGS = ("zeros", "border", "reflection")
_CUBIC_A = -0.75


@dataclass(frozen=True)
class _Tap:
    """One tap along one axis: its integer index, weight and whether it reads the input."""

    index: Value
    weight: Value | None
    valid: Value | None


def _f(ctx: ImportContext, value: float) -> Value:
    return ctx.builder.constant(np.array(value, np.float32))


def _reflect(ctx: ImportContext, x: Value, low: float, high: float) -> Value:
    """Reflect `x` at the borders `low` and `high` until it lies between them."""
    b = ctx.builder
    span = _f(ctx, high - low)
    result = x
    for below in (True, False):
        distance = b.sub(_f(ctx, low), x) if below else b.sub(x, _f(ctx, high))
        folds = b.unary(Unary.FLOOR, b.div(distance, span))
        rest = b.sub(distance, b.mul(folds, span))
        even = b.binary(Binary.EQUAL, b.binary(Binary.FMOD, folds, _f(ctx, 2)), _f(ctx, 0))
        near, far = (low, high) if below else (high, low)
        toward = b.add(_f(ctx, near), rest) if below else b.sub(_f(ctx, near), rest)
        away = b.sub(_f(ctx, far), rest) if below else b.add(_f(ctx, far), rest)
        outside = b.binary(
            Binary.LESS if below else Binary.GREATER, x, _f(ctx, low if below else high)
        )
        result = b.where(outside, b.where(even, toward, away), result)
    return result


def _source(
    ctx: ImportContext, coordinate: Value, size: int, align: bool, mode: str, padding: str
) -> Value:
    """A normalized grid coordinate as an input position, with out-of-range ones adjusted."""
    b = ctx.builder
    one = _f(ctx, 1)
    if align:
        x = b.mul(b.div(b.add(coordinate, one), _f(ctx, 2)), _f(ctx, size - 1))
    else:
        x = b.div(b.sub(b.mul(b.add(coordinate, one), _f(ctx, size)), one), _f(ctx, 2))
    if mode == "nearest":
        x = b.unary(Unary.ROUND, x)
    low, high = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
    if padding == "border":  # only positions beyond the borders move
        outside = b.binary(
            Binary.OR,
            b.binary(Binary.LESS, x, _f(ctx, low)),
            b.binary(Binary.GREATER, x, _f(ctx, high)),
        )
        x = b.where(outside, b.clamp(x, lo=0.0, hi=float(size - 1)), x)
    elif padding == "reflection":
        x = _reflect(ctx, x, low, high)
    return x


def _pixel(ctx: ImportContext, i: Value, size: int, align: bool, padding: str) -> _Tap:
    """The input index read for the integer position `i` under the padding mode."""
    b = ctx.builder
    if padding == "zeros":
        inside = b.binary(
            Binary.AND,
            b.binary(Binary.GREATER_EQUAL, i, _f(ctx, 0)),
            b.binary(Binary.LESS, i, _f(ctx, size)),
        )
        index = b.clamp(i, lo=0.0, hi=float(size - 1))
        return _Tap(b.cast(index, DType.I64), None, inside)
    if padding == "border":
        return _Tap(b.cast(b.clamp(i, lo=0.0, hi=float(size - 1)), DType.I64), None, None)
    low, high = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
    reflected = b.cast(_reflect(ctx, i, low, high), DType.I64)  # truncates, as int() does
    return _Tap(b.cast(b.clamp(reflected, lo=0, hi=size - 1), DType.I64), None, None)


def _cubic_weights(ctx: ImportContext, t: Value) -> list[Value]:
    b = ctx.builder
    a = _CUBIC_A

    def poly(x: Value, coefficients: tuple[float, float, float, float]) -> Value:
        c3, c2, c1, c0 = coefficients
        y = b.add(b.mul(x, _f(ctx, c3)), _f(ctx, c2))
        y = b.add(b.mul(y, x), _f(ctx, c1))
        return b.add(b.mul(y, x), _f(ctx, c0))

    far = (a, -5 * a, 8 * a, -4 * a)  # for distances in [1, 2)
    near = (a + 2, -(a + 3), 0.0, 1.0)  # for distances in [0, 1]
    one, two = _f(ctx, 1), _f(ctx, 2)
    return [
        poly(b.add(t, one), far),
        poly(t, near),
        poly(b.sub(one, t), near),
        poly(b.sub(two, t), far),
    ]


def _axis_taps(
    ctx: ImportContext, x: Value, size: int, align: bool, mode: str, padding: str
) -> list[_Tap]:
    b = ctx.builder
    if mode == "nearest":
        return [_pixel(ctx, b.cast(b.cast(x, DType.I32), DType.F32), size, align, padding)]
    base = b.unary(Unary.FLOOR, x)
    t = b.sub(x, base)
    if mode == "linear":
        weights, offsets = [b.sub(_f(ctx, 1), t), t], [0, 1]
    else:
        weights, offsets = _cubic_weights(ctx, t), [-1, 0, 1, 2]
    taps = []
    for weight, offset in zip(weights, offsets, strict=True):
        tap = _pixel(ctx, b.add(base, _f(ctx, offset)), size, align, padding)
        taps.append(_Tap(tap.index, weight, tap.valid))
    return taps


def _take(ctx: ImportContext, x: Value, positions: Value) -> Value:
    """`out[..., q] = x[..., positions[..., q]]`, positions broadcast over the leading axes."""
    b = ctx.builder
    indices = b.broadcast(positions, (*x.shape[:-1], positions.shape[-1]))
    return gather_elements(ctx, x, indices, x.rank - 1)


def _int(ctx: ImportContext, value: Dim) -> Value:
    return ctx.builder.constant(np.array(static_dim(ctx, value, "this sampling op"), np.int64))


@importer("GridSample", since=16)
def _grid_sample(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x, grid = ctx.inputs(node, count=2)
    attrs = ctx.attributes(node)
    mode = _MODES.get(attrs.string("mode", "bilinear" if ctx.opset < 20 else "linear"))
    padding = attrs.string("padding_mode", "zeros")
    align = bool(attrs.int("align_corners", 0))
    if mode is None or padding not in _PADDINGS:
        raise ctx.fail(f"GridSample mode or padding_mode is not supported ({_PADDINGS})")
    b = ctx.builder
    sizes = [static_dim(ctx, d, "GridSample") for d in x.shape[2:]]
    k = len(sizes)
    n, out = grid.shape[0], grid.shape[1:-1]
    count = numel(out)
    coords = b.view(b.cast(grid, DType.F32), (n, count, k))
    per_axis = []
    for axis, size in enumerate(sizes):  # the grid lists x (the last axis) first
        column = b.view(b.slice(coords, axis=2, start=k - 1 - axis, stop=k - axis), (n, count))
        source = _source(ctx, column, size, align, mode, padding)
        per_axis.append(_axis_taps(ctx, source, size, align, mode, padding))
    strides = [int(np.prod(sizes[i + 1 :])) for i in range(k)]
    flat = b.view(x, (x.shape[0], x.shape[1], int(np.prod(sizes))))
    total = None
    for combo in itertools.product(*per_axis):
        position: Value | None = None
        weight: Value | None = None
        valid: Value | None = None
        for tap, stride in zip(combo, strides, strict=True):
            term = b.mul(tap.index, _int(ctx, stride))
            position = term if position is None else b.add(position, term)
            if tap.weight is not None:
                weight = tap.weight if weight is None else b.mul(weight, tap.weight)
            if tap.valid is not None:
                valid = tap.valid if valid is None else b.binary(Binary.AND, valid, tap.valid)
        assert position is not None
        value = _take(ctx, flat, b.view(position, (n, 1, count)))
        if valid is not None:
            mask = b.view(valid, (n, 1, count))
            value = b.where(mask, value, b.scalar(0, value.dtype))
        if weight is not None:
            value = b.mul(value, b.view(b.cast(weight, x.dtype), (n, 1, count)))
        total = value if total is None else b.add(total, value)
    assert total is not None
    return [b.view(total, (n, x.shape[1], *out))]


def _base_grid(sizes: list[int], align: bool) -> np.ndarray:
    """AffineGrid's homogeneous grid `[prod(sizes), k + 1]`: x first, then y (and z), then 1."""
    axes = []
    for size in sizes:
        if align:
            axes.append(
                np.arange(-1, 1 + 0.0001, 2.0 / (size - 1)) if size > 1 else np.array([-1.0])
            )
        else:
            step = 2.0 / size
            axes.append(np.arange(-1 + step / 2, 1, step))
    mesh = np.meshgrid(*axes, indexing="ij")
    columns = [m.reshape(-1) for m in mesh[::-1]] + [np.ones(int(np.prod(sizes)))]
    return np.stack(columns, axis=1)


@importer("AffineGrid", since=20)
def _affine_grid(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    theta = ctx.value(node.input[0])
    align = bool(ctx.attributes(node).int("align_corners", 0))
    size = ctx.known_ints(node, 1, "size")
    assert size is not None
    sizes = size[2:]
    b = ctx.builder
    n = theta.shape[0]
    base = b.constant(_base_grid(sizes, align).astype(theta.dtype.numpy))
    points = b.broadcast(b.view(base, (1, *base.shape)), (n, *base.shape))
    grid = b.matmul(points, b.permute(theta, (0, 2, 1)))
    return [b.view(grid, (n, *sizes, len(sizes)))]


# ---- RoiAlign --------------------------------------------------------------------------------


def _d(ctx: ImportContext, value: float) -> Value:
    return ctx.builder.constant(np.array(value, np.float64))


def _roi_axis(
    ctx: ImportContext, start: Value, extent: Value, bins: int, samples: int, size: int
) -> tuple[Value, Value, Value, Value, Value]:
    """The bilinear taps of one axis for every ROI sample `[R, bins, samples]`.

    Returns the low and high input indices, their weights, and whether the sample lies inside
    the input, all as the ONNX reference computes them.
    """
    b = ctx.builder
    step = b.div(extent, _d(ctx, bins))  # [R, 1, 1]
    grid = np.arange(bins)[:, None] + (np.arange(samples)[None, :] + 0.5) / samples
    at = b.add(start, b.mul(step, b.constant(grid[None])))
    inside = b.binary(
        Binary.AND,
        b.binary(Binary.GREATER_EQUAL, at, _d(ctx, -1.0)),
        b.binary(Binary.LESS_EQUAL, at, _d(ctx, float(size))),
    )
    at = b.clamp(at, lo=0.0)
    low = b.unary(Unary.FLOOR, at)
    last = b.binary(Binary.GREATER_EQUAL, low, _d(ctx, size - 1.0))
    low = b.where(last, _d(ctx, size - 1.0), low)
    at = b.where(last, low, at)
    high = b.where(last, low, b.add(low, _d(ctx, 1.0)))
    frac = b.sub(at, low)
    return b.cast(low, DType.I64), b.cast(high, DType.I64), b.sub(_d(ctx, 1.0), frac), frac, inside


@importer("RoiAlign", since=10)
def _roi_align(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x, rois, batch_indices = ctx.inputs(node, count=3)
    attrs = ctx.attributes(node)
    mode = attrs.string("mode", "avg")
    out_h, out_w = attrs.int("output_height", 1), attrs.int("output_width", 1)
    ratio = attrs.int("sampling_ratio", 0)
    scale = attrs.float("spatial_scale", 1.0)
    half_pixel = (
        ctx.opset >= 16
        and attrs.string("coordinate_transformation_mode", "half_pixel") == "half_pixel"
    )
    if mode not in ("avg", "max") or ratio <= 0:
        raise ctx.fail(
            "RoiAlign needs mode avg or max and a fixed sampling_ratio (> 0); an "
            "adaptive one gives every ROI its own number of samples"
        )
    b = ctx.builder
    _, c, h, w = (static_dim(ctx, d, "the input") for d in x.shape)
    r = rois.shape[0]
    boxes = b.mul(b.cast(rois, DType.F64), _d(ctx, scale))
    if half_pixel:
        boxes = b.sub(boxes, _d(ctx, 0.5))

    def column(i: int) -> Value:
        return b.view(b.slice(boxes, axis=1, start=i, stop=i + 1), (r, 1, 1))

    extent_w, extent_h = b.sub(column(2), column(0)), b.sub(column(3), column(1))
    if not half_pixel:
        extent_w, extent_h = b.clamp(extent_w, lo=1.0), b.clamp(extent_h, lo=1.0)
    ys = _roi_axis(ctx, column(1), extent_h, out_h, ratio, h)
    xs = _roi_axis(ctx, column(0), extent_w, out_w, ratio, w)
    shape = (r, out_h, out_w, ratio, ratio)

    def grid(value: Value, is_y: bool) -> Value:  # [R, bins, samples] -> [R, oh, ow, sy, sx]
        if is_y:
            return b.view(value, (r, out_h, 1, ratio, 1))
        return b.view(value, (r, 1, out_w, 1, ratio))

    inside = b.binary(Binary.AND, grid(ys[4], True), grid(xs[4], False))
    images = b.view(b.gather(x, b.cast(batch_indices, DType.I64), axis=0), (r, c, h * w))
    count = out_h * out_w * ratio * ratio
    taps = []
    for yi, wy in ((0, 2), (1, 3)):
        for xi, wx in ((0, 2), (1, 3)):
            place = b.add(b.mul(grid(ys[yi], True), _int(ctx, w)), grid(xs[xi], False))
            weight = b.mul(grid(ys[wy], True), grid(xs[wx], False))
            weight = b.where(inside, weight, _d(ctx, 0.0))
            place = b.where(inside, place, b.constant(np.array(0, np.int64)))
            value = _take(
                ctx, b.cast(images, DType.F64), b.view(b.broadcast(place, shape), (r, 1, count))
            )
            taps.append(b.mul(value, b.view(b.broadcast(weight, shape), (r, 1, count))))
    pooled = _pool_samples(ctx, taps, mode, (r, c, out_h, out_w), ratio * ratio)
    return [b.cast(b.view(pooled, (r, c, out_h, out_w)), x.dtype)]


def _pool_samples(
    ctx: ImportContext, taps: list[Value], mode: str, shape: tuple[Dim, ...], samples: int
) -> Value:
    """RoiAlign's bins: the average of the samples' bilinear sums, or the largest weighted tap."""
    b = ctx.builder
    if mode == "avg":
        total = taps[0]
        for tap in taps[1:]:
            total = b.add(total, tap)
        summed = b.reduce(Reduction.SUM, b.view(total, (*shape, samples)), axes=[len(shape)])
        return b.div(summed, _d(ctx, float(samples)))
    best = taps[0]
    for tap in taps[1:]:
        best = b.binary(Binary.MAX, best, tap)
    return b.reduce(Reduction.MAX, b.view(best, (*shape, samples)), axes=[len(shape)])


# ---- DeformConv ------------------------------------------------------------------------------


@importer("DeformConv", since=19)
def _deform_conv(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x, weight, offset, bias, mask = ctx.inputs(node, count=(3, 5))
    attrs = ctx.attributes(node)
    if x.rank != 4:
        raise ctx.fail("DeformConv is supported for 2-d images")
    kh, kw = attrs.ints(
        "kernel_shape", [static_dim(ctx, d, "the kernel") for d in weight.shape[2:]]
    )
    sh, sw = attrs.ints("strides", [1, 1])
    dh, dw = attrs.ints("dilations", [1, 1])
    pads = attrs.ints("pads", [0, 0, 0, 0])
    groups, offset_groups = attrs.int("group", 1), attrs.int("offset_group", 1)
    b = ctx.builder
    n, c, h, w = (static_dim(ctx, d, "the input") for d in x.shape)
    m = static_dim(ctx, weight.shape[0], "the kernel")
    oh, ow = (static_dim(ctx, d, "the offsets") for d in offset.shape[2:])
    k, q = kh * kw, oh * ow
    per_group = c // offset_groups
    moves = b.cast(b.view(offset, (n, offset_groups, k, 2, q)), DType.F32)
    ky, kx = np.indices((kh, kw)).reshape(2, k, 1)
    oy, ox = np.divmod(np.arange(q), ow)
    rows = ky * dh - pads[0] + sh * oy[None, :]  # [k, q] unshifted sample positions
    cols = kx * dw - pads[1] + sw * ox[None, :]
    at_y = b.add(
        b.view(b.slice(moves, axis=3, start=0, stop=1), (n, offset_groups, k, q)),
        b.constant(rows.astype(np.float32)),
    )
    at_x = b.add(
        b.view(b.slice(moves, axis=3, start=1, stop=2), (n, offset_groups, k, q)),
        b.constant(cols.astype(np.float32)),
    )
    images = b.view(x, (n, offset_groups, per_group, h * w))
    ys = _axis_taps(ctx, at_y, h, True, "linear", "zeros")
    xs = _axis_taps(ctx, at_x, w, True, "linear", "zeros")
    sampled = None
    for ty in ys:
        for tx in xs:
            place = b.add(b.mul(ty.index, _int(ctx, w)), tx.index)
            valid = b.binary(Binary.AND, ty.valid, tx.valid)  # type: ignore[arg-type]
            factor = b.where(valid, b.mul(ty.weight, tx.weight), _f(ctx, 0.0))  # type: ignore[arg-type]
            flat = b.view(place, (n, offset_groups, 1, k * q))
            value = b.view(_take(ctx, images, flat), (n, offset_groups, per_group, k, q))
            term = b.mul(value, b.view(b.cast(factor, x.dtype), (n, offset_groups, 1, k, q)))
            sampled = term if sampled is None else b.add(sampled, term)
    assert sampled is not None
    if mask is not None:
        sampled = b.mul(sampled, b.view(mask, (n, offset_groups, 1, k, q)))
    columns = b.view(sampled, (n, groups, (c // groups) * k, q))
    kernels = b.broadcast(
        b.view(weight, (1, groups, m // groups, (c // groups) * k)),
        (n, groups, m // groups, (c // groups) * k),
    )
    y = b.view(b.matmul(kernels, columns), (n, m, oh, ow))
    if bias is not None:
        y = b.add(y, b.view(bias, (m, 1, 1)))
    return [y]
