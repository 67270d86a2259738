"""Importers of ONNX Resize (opsets 10 to 19) and Upsample (7 and 9).

Resizing is separable: each resized axis is interpolated on its own, one after the other, in the
order the ONNX reference implementation uses. For one axis, the source taps and their weights
depend only on sizes and attributes, so they are computed here, in float64 numpy, as constant
tables: an index table `[out, taps]` and a weight table of the same shape. The graph then
gathers the taps along the axis and takes their weighted sum. Nearest mode (and any axis whose
weights are one-hot) is a single gather, which copies values exactly in any dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx

from knopt.ir.dtype import DType
from knopt.ir.graph import Value
from knopt.ir.op import Reduction, Unary
from knopt.ir.shape import Dim
from knopt.onnx.context import Attributes, ImportContext, OnnxValue, importer
from knopt.onnx.ops.common import axes_of, static_dim

_MODES = ("nearest", "linear", "cubic")
_COORDINATE_MODES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
)
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
# Upsample and Resize-10 use asymmetric coordinates; nearest picks the floor when upsampling
# and the ceiling when downsampling (onnxruntime's "simple" rule, which Resize-10 follows).
_LEGACY_NEAREST = "legacy"


@dataclass(frozen=True)
class Interpolation:
    """How one Resize node interpolates, from its attributes."""

    mode: str = "nearest"
    coordinate_mode: str = "half_pixel"
    nearest_mode: str = "round_prefer_floor"
    cubic_coeff_a: float = -0.75
    exclude_outside: bool = False
    extrapolation_value: float = 0.0
    antialias: bool = False


@dataclass(frozen=True)
class AxisTaps:
    """The constant tables that resize one axis.

    Attributes:
        indices: `[out, taps]` source positions, already clamped into the input.
        weights: `[out, taps]` float64 weights of those taps.
        outside: `[out]` true where tf_crop_and_resize extrapolates, or None.
    """

    indices: np.ndarray
    weights: np.ndarray
    outside: np.ndarray | None


# ---- coefficients (ported from the ONNX reference, op_resize.py) --------------------------


def _nearest_weights(ratio: float, mode: str, scale: float) -> list[float]:
    if ratio == 1.0:
        return [0.0, 1.0]
    if mode == _LEGACY_NEAREST:
        mode = "floor" if scale >= 1 else "ceil"
    take_right = {
        "round_prefer_floor": ratio > 0.5,
        "round_prefer_ceil": ratio >= 0.5,
        "floor": False,
        "ceil": True,
    }[mode]
    return [0.0, 1.0] if take_right else [1.0, 0.0]


def _cubic_weights(ratio: float, a: float) -> list[float]:
    r, s = ratio, 1 - ratio
    return [
        ((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
        ((a + 2) * r - (a + 3)) * r * r + 1,
        ((a + 2) * s - (a + 3)) * s * s + 1,
        ((a * (s + 1) - 5 * a) * (s + 1) + 8 * a) * (s + 1) - 4 * a,
    ]


def _cubic_kernel(x: float, a: float) -> float:
    x = abs(x)
    if x <= 1:
        return (a + 2) * x**3 - (a + 3) * x**2 + 1
    if x < 2:
        return a * x**3 - 5 * a * x**2 + 8 * a * x - 4 * a
    return 0.0


def _antialias_weights(ratio: float, scale: float, interp: Interpolation) -> list[float]:
    # Downsampling widens the kernel by 1 / scale so that every input pixel contributes.
    scale = min(scale, 1.0)
    if interp.mode == "linear":
        start = int(np.floor(-1 / scale) + 1)
        args = (np.arange(start, 2 - start) - ratio) * scale
        weights = np.clip(1 - np.abs(args), 0, 1)
    else:
        start = int(np.floor(-2 / scale) + 1)
        weights = np.array(
            [
                _cubic_kernel(scale * (i - ratio), interp.cubic_coeff_a)
                for i in range(start, 2 - start)
            ]
        )
    return list(weights / weights.sum())


def _weights(ratio: float, scale: float, interp: Interpolation) -> list[float]:
    if interp.mode == "nearest":
        return _nearest_weights(ratio, interp.nearest_mode, scale)
    if interp.antialias:
        return _antialias_weights(ratio, scale, interp)
    if interp.mode == "linear":
        return [1 - ratio, ratio]
    return _cubic_weights(ratio, interp.cubic_coeff_a)


# ---- one axis --------------------------------------------------------------------------


def _source_coordinates(
    interp: Interpolation, in_size: int, out_size: int, scale: float, roi: tuple[float, float]
) -> tuple[np.ndarray, np.ndarray | None]:
    """Where each output position samples the input, and where tf_crop_and_resize extrapolates."""
    # Where `scale * in_size` is not whole, onnxruntime divides by the integer resized length
    # but the ONNX reference, and so the conformance suite, by the fractional one; knopt
    # follows the reference.
    y = np.arange(out_size, dtype=np.float64)
    width = scale * in_size
    mode = interp.coordinate_mode
    if mode == "align_corners":
        return (np.zeros(out_size) if width == 1 else y * (in_size - 1) / (width - 1)), None
    if mode == "asymmetric":
        return y / scale, None
    if mode == "pytorch_half_pixel":
        return (np.full(out_size, -0.5) if width == 1 else (y + 0.5) / scale - 0.5), None
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5, None
    if mode == "half_pixel_symmetric":
        offset = in_size / 2 * (1 - out_size / width)
        return offset + (y + 0.5) / scale - 0.5, None
    start, end = roi  # tf_crop_and_resize
    if width == 1:
        x = np.full(out_size, (end - start) * (in_size - 1) / 2)
    else:
        x = y * (end - start) * (in_size - 1) / (width - 1)
    x = x + start * (in_size - 1)
    return x, (x < 0) | (x > in_size - 1)


def axis_taps(
    interp: Interpolation, in_size: int, out_size: int, scale: float, roi: tuple[float, float]
) -> AxisTaps:
    """The index and weight tables that resize an axis of `in_size` to `out_size`."""
    x, outside = _source_coordinates(interp, in_size, out_size, scale, roi)
    floor = np.floor(x)
    ratios = np.where(x == floor, 1.0, x - floor)  # (0, 1]: prefer the pixel left of x
    weights = np.array([_weights(float(r), scale, interp) for r in ratios], np.float64)
    taps = weights.shape[1] if out_size else 2
    weights = weights.reshape(out_size, taps)
    # The `taps` inputs nearest to x, ties broken towards the smaller index.
    pad = math.ceil(taps / 2)
    padded = x + pad
    base = np.floor(padded)
    fraction = padded - base
    if taps % 2 == 0:
        offset = np.where(fraction == 0, -(taps // 2), -(taps // 2) + 1)
    else:
        offset = np.where(fraction <= 0.5, -((taps - 1) // 2), -((taps - 1) // 2) + 1)
    first = base.astype(np.int64) + offset - pad
    indices = first[:, None] + np.arange(taps)[None, :]
    if interp.exclude_outside:
        weights = np.where((indices < 0) | (indices >= in_size), 0.0, weights)
        total = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    clamped = np.clip(indices, 0, in_size - 1)
    return AxisTaps(clamped, weights, outside if outside is not None and outside.any() else None)


def _apply_taps(ctx: ImportContext, x: Value, axis: int, taps: AxisTaps, fill: float) -> Value:
    """Resize `x` along `axis` with precomputed taps; `fill` is the extrapolation value."""
    b = ctx.builder
    out_size, count = taps.weights.shape
    after = (1,) * (x.rank - axis - 1)
    if is_one_hot(taps):
        chosen = taps.indices[np.arange(out_size), np.argmax(taps.weights, axis=1)]
        y = b.gather(x, b.constant(chosen.astype(np.int64)), axis=axis)
    else:
        gathered = b.gather(x, b.constant(taps.indices.astype(np.int64)), axis=axis)
        weights = b.constant(taps.weights.reshape(out_size, count, *after).astype(x.dtype.numpy))
        total = b.reduce(Reduction.SUM, b.mul(gathered, weights), axes=[axis + 1])
        y = b.view(total, (*x.shape[:axis], out_size, *x.shape[axis + 1 :]))
    if taps.outside is not None:
        mask = b.constant(taps.outside.reshape(out_size, *after))
        y = b.where(mask, b.scalar(fill, y.dtype), y)
    return y


def is_one_hot(taps: AxisTaps) -> bool:
    """True when every output copies exactly one input (nearest mode), so a gather suffices."""
    w = taps.weights
    return bool(np.all((w == 0.0) | (w == 1.0)) and np.all(w.sum(axis=1) == 1.0))


# ---- the whole tensor ---------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """Per-axis output sizes, scales and crop windows of one Resize node."""

    sizes: tuple[Dim, ...]
    scales: tuple[float, ...]
    roi: tuple[tuple[float, float], ...]
    order: tuple[int, ...]  # the resized axes, in the order they are interpolated


MAX_RESIZED_LENGTH = 2**20  # a table entry costs a few microseconds of Python: 1 M is seconds


def resize(ctx: ImportContext, x: Value, interp: Interpolation, target: Target) -> Value:
    """`x` resized to `target` by separable interpolation."""
    plans: list[tuple[int, AxisTaps]] = []
    for axis in target.order:
        in_size, out_size = x.shape[axis], target.sizes[axis]
        scale, roi = target.scales[axis], target.roi[axis]
        if math.isclose(scale, 1.0) and out_size == in_size and roi == (0.0, 1.0):
            continue  # the reference skips identity axes too, whatever the coordinate mode
        if not isinstance(in_size, int) or not isinstance(out_size, int):
            raise ctx.fail_symbolic(
                f"resizing axis {axis} of symbolic size {in_size} is not supported"
            )
        if out_size > MAX_RESIZED_LENGTH:
            raise ctx.fail(
                f"resizing axis {axis} to {out_size} positions is not supported (at most "
                f"{MAX_RESIZED_LENGTH}: knopt computes the interpolation tables while loading)"
            )
        plans.append((axis, axis_taps(interp, in_size, out_size, scale, roi)))
    exact = all(is_one_hot(taps) for _, taps in plans)
    work = x if exact else ctx.builder.cast(x, _compute_dtype(x.dtype))
    for axis, taps in plans:
        work = _apply_taps(ctx, work, axis, taps, interp.extrapolation_value)
    return work if exact else _saturate(ctx, work, x.dtype)


def _compute_dtype(dtype: DType) -> DType:
    if dtype in (DType.F32, DType.F64):
        return dtype
    if dtype in (DType.I32, DType.I64, DType.U32, DType.U64):
        return DType.F64
    return DType.F32


def _saturate(ctx: ImportContext, y: Value, dtype: DType) -> Value:
    """`y` converted back to the input's dtype as the reference does: integers round and clamp."""
    b = ctx.builder
    if dtype.is_int or dtype is DType.BOOL:
        info = ml_dtypes.iinfo(dtype.numpy) if dtype.is_int else None
        y = b.unary(Unary.ROUND, y)
        if info is not None:
            y = b.clamp(y, lo=float(info.min), hi=float(info.max))
    return b.cast(y, dtype)


# ---- reading the node ----------------------------------------------------------------------


def _interpolation(ctx: ImportContext, attrs: Attributes) -> Interpolation:
    mode = attrs.string("mode", "nearest")
    if mode not in _MODES:
        raise ctx.fail(f"Resize mode '{mode}' is not supported ({', '.join(_MODES)})")
    if ctx.opset < 11:
        return Interpolation(mode, "asymmetric", _LEGACY_NEAREST)
    coordinate_mode = attrs.string("coordinate_transformation_mode", "half_pixel")
    allowed = (
        _COORDINATE_MODES if ctx.opset >= 19 else _COORDINATE_MODES[:1] + _COORDINATE_MODES[2:]
    )
    if coordinate_mode not in allowed:
        raise ctx.fail(
            f"coordinate_transformation_mode '{coordinate_mode}' is not supported at opset "
            f"{ctx.opset} ({', '.join(allowed)})"
        )
    nearest_mode = attrs.string("nearest_mode", "round_prefer_floor")
    if nearest_mode not in _NEAREST_MODES:
        raise ctx.fail(f"nearest_mode '{nearest_mode}' is not supported")
    antialias = bool(attrs.int("antialias", 0)) if ctx.opset >= 18 else False
    if antialias and mode == "nearest":
        raise ctx.fail("antialias applies to linear and cubic modes, not nearest")
    return Interpolation(
        mode,
        coordinate_mode,
        nearest_mode,
        attrs.float("cubic_coeff_a", -0.75),
        bool(attrs.int("exclude_outside", 0)),
        attrs.float("extrapolation_value", 0.0),
        antialias,
    )


def _target(
    ctx: ImportContext,
    x: Value,
    axes: list[int],
    scales: np.ndarray | None,
    sizes: list[Dim] | None,
    roi: np.ndarray | None,
    policy: str,
) -> Target:
    rank = x.rank
    out: list[Dim] = list(x.shape)
    factors = [1.0] * rank
    if sizes is not None:
        if len(sizes) != len(axes):
            raise ctx.fail(f"sizes {sizes} need one entry per resized axis ({len(axes)})")
        for axis, size in zip(axes, sizes, strict=True):
            out[axis] = size
            factors[axis] = _ratio(ctx, size, x.shape[axis])
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            scale = pick(factors[a] for a in axes)
            for axis in axes:
                factors[axis] = scale
                out[axis] = int(scale * static_dim(ctx, x.shape[axis], "a resized axis") + 0.5)
    elif scales is not None:
        if len(scales) != len(axes):
            raise ctx.fail(f"scales {scales.tolist()} need one entry per resized axis")
        for axis, scale in zip(axes, scales.tolist(), strict=True):
            if not 0 < scale < math.inf:  # NaN too: the output size is int(scale * size)
                raise ctx.fail(f"scale {scale} must be positive and finite")
            factors[axis] = float(scale)
            out[axis] = (
                x.shape[axis]
                if scale == 1
                else int(scale * static_dim(ctx, x.shape[axis], "a resized axis"))
            )
    else:
        raise ctx.fail("Resize needs scales or sizes")
    windows = [(0.0, 1.0)] * rank
    if roi is not None and roi.size:
        if roi.size != 2 * len(axes):
            raise ctx.fail(f"roi needs {2 * len(axes)} values, got {roi.size}")
        for i, axis in enumerate(axes):
            # numpy scalars keep the ROI arithmetic in its own precision, as the reference does
            windows[axis] = (roi[i], roi[i + len(axes)])
    return Target(tuple(out), tuple(factors), tuple(windows), tuple(axes))


def _ratio(ctx: ImportContext, size: Dim, dim: Dim) -> float:
    if size == dim:
        return 1.0
    source = static_dim(ctx, dim, "a resized axis")
    if source == 0:
        raise ctx.fail(f"an empty axis cannot be resized to {size} positions: nothing to sample")
    return static_dim(ctx, size, "a resized axis") / source


def _sizes_input(ctx: ImportContext, node: onnx.NodeProto, index: int) -> list[Dim] | None:
    return ctx.symbolic_ints(node, index, "sizes") or None


def _scales_input(ctx: ImportContext, node: onnx.NodeProto, index: int) -> np.ndarray | None:
    scales = ctx.known_input(node, index, "scales")
    return None if scales is None or scales.size == 0 else scales.reshape(-1)


@importer("Resize", since=10)
def _resize(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x = ctx.value(node.input[0])
    attrs = ctx.attributes(node)
    interp = _interpolation(ctx, attrs)
    axes = list(range(x.rank))
    policy = "stretch"
    if ctx.opset >= 18:
        if attrs.has("axes"):
            given = attrs.ints("axes")
            axes_of(ctx, given, x.rank)  # rejects repeated and out-of-range axes
            axes = [a % x.rank for a in given]  # in the given order: axes resize in this order
        policy = attrs.string("keep_aspect_ratio_policy", "stretch")
        if policy not in ("stretch", "not_larger", "not_smaller"):
            raise ctx.fail(f"keep_aspect_ratio_policy '{policy}' is not supported")
    if ctx.opset < 11:
        target = _target(ctx, x, axes, _scales_input(ctx, node, 1), None, None, policy)
    else:
        roi = ctx.known_input(node, 1, "roi")
        sizes = _sizes_input(ctx, node, 3)
        scales = None if sizes is not None else _scales_input(ctx, node, 2)
        target = _target(ctx, x, axes, scales, sizes, roi, policy)
    return [resize(ctx, x, interp, target)]


@importer("Upsample", since=7)
def _upsample(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x = ctx.value(node.input[0])
    attrs = ctx.attributes(node)
    interp = _interpolation(ctx, attrs)
    scales: np.ndarray | None
    if ctx.opset < 9:
        scales = np.array(attrs.floats("scales"), np.float32)
    else:
        scales = _scales_input(ctx, node, 1)
    if scales is None or np.any(scales < 1):
        raise ctx.fail("Upsample needs scales of at least 1, one per axis")
    target = _target(ctx, x, list(range(x.rank)), scales, None, None, "stretch")
    return [resize(ctx, x, interp, target)]
