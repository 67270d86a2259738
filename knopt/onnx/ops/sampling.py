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
from knopt.ir.op import Binary, Unary
from knopt.ir.shape import numel
from knopt.onnx.context import ImportContext, OnnxValue, importer
from knopt.onnx.ops.indexing import gather_elements

_MODES = {"nearest": "nearest", "linear": "linear", "cubic": "cubic", "bilinear": "linear",
          "bicubic": "cubic"}
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
        outside = b.binary(Binary.LESS if below else Binary.GREATER, x, _f(ctx, low if below else high))
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


def _int(ctx: ImportContext, value: object) -> Value:
    if not isinstance(value, int):
        raise ctx.fail("GridSample needs static sizes")
    return ctx.builder.constant(np.array(value, np.int64))


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
    sizes = [int(_int_size(ctx, d)) for d in x.shape[2:]]
    k = len(sizes)
    n, out = grid.shape[0], grid.shape[1:-1]
    count = numel(out)
    coords = b.view(b.cast(grid, DType.F32), (n, count, k))
    per_axis = []
    for axis, size in enumerate(sizes):  # the grid lists x (the last axis) first
        column = b.view(b.slice(coords, axis=2, start=k - 1 - axis, stop=k - axis), (n, count))
        position = _source(ctx, column, size, align, mode, padding)
        per_axis.append(_axis_taps(ctx, position, size, align, mode, padding))
    strides = [int(np.prod(sizes[i + 1 :])) for i in range(k)]
    flat = b.view(x, (x.shape[0], x.shape[1], int(np.prod(sizes))))
    total = None
    for combo in itertools.product(*per_axis):
        position = None
        weight = None
        valid = None
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


def _int_size(ctx: ImportContext, dim: object) -> int:
    if not isinstance(dim, int):
        raise ctx.fail("GridSample needs static spatial sizes")
    return dim


def _base_grid(sizes: list[int], align: bool) -> np.ndarray:
    """AffineGrid's homogeneous grid `[prod(sizes), k + 1]`: x first, then y (and z), then 1."""
    axes = []
    for size in sizes:
        if align:
            axes.append(np.arange(-1, 1 + 0.0001, 2.0 / (size - 1)) if size > 1 else np.array([-1.0]))
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
    size = ctx.known_input(node, 1, "size")
    assert size is not None
    sizes = [int(d) for d in size.reshape(-1)[2:]]
    b = ctx.builder
    n = theta.shape[0]
    base = b.constant(_base_grid(sizes, align).astype(theta.dtype.numpy))
    points = b.broadcast(b.view(base, (1, *base.shape)), (n, *base.shape))
    grid = b.matmul(points, b.permute(theta, (0, 2, 1)))
    return [b.view(grid, (n, *sizes, len(sizes)))]
