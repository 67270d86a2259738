"""Convolution and pooling on numpy: sliding windows over a padded input, contracted by BLAS."""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np

from knopt.ir.memory import check_shape
from knopt.ir.op import Conv, Pool, PoolKind

Array = np.ndarray
_MAX_OFFSET_PASSES = 256  # kernel offsets looped over in Python; larger kernels reduce a view


def windows(
    x: Array,
    kernel: tuple[int, ...],
    strides: tuple[int, ...],
    dilations: tuple[int, ...],
    out_spatial: tuple[int, ...],
) -> Array:
    """A read-only view `[N, C, *out_spatial, *kernel]` of the windows of padded `x`."""
    if not x.flags.c_contiguous:
        x = np.ascontiguousarray(x)  # the view below needs one buffer
    lead = x.strides[:2]
    spatial = x.strides[2:]
    shape = (*x.shape[:2], *out_spatial, *kernel)
    # A step along an axis of one position is never taken: 0 keeps a huge stride or dilation
    # from overflowing numpy's byte strides.
    steps = (
        *lead,
        *(st * s if o > 1 else 0 for st, s, o in zip(spatial, strides, out_spatial, strict=True)),
        *(st * d if k > 1 else 0 for st, d, k in zip(spatial, dilations, kernel, strict=True)),
    )
    # The same view as_strided makes, built directly: as_strided goes through
    # __array_interface__ and costs 10 us, more than a small convolution's arithmetic.
    view = np.ndarray(shape, x.dtype, buffer=x, strides=steps)
    view.flags.writeable = False
    return view


def conv(op: Conv, x: Array, w: Array) -> Array:
    """N-d cross-correlation as im2col and one batched matrix product per group.

    The windows of the padded input are copied once into columns `[N, G, C/G * K, P]` (K
    kernel elements, P output positions), so that each group is one GEMM with the weights
    `[G, M/G, C/G * K]` and the result comes out in `[N, M, *spatial]` order, with no transpose.
    """
    spatial = x.ndim - 2
    xp = _padded(x, ((0, 0), (0, 0), *op.pads), 0)
    kernel = tuple(w.shape[2:])
    out_spatial = tuple(
        (xp.shape[2 + i] - (op.dilations[i] * (kernel[i] - 1) + 1)) // op.strides[i] + 1
        for i in range(spatial)
    )
    n, c = x.shape[:2]
    m, g = w.shape[0], op.groups
    if any(o <= 0 for o in out_spatial):
        return np.zeros((n, m, *(max(o, 0) for o in out_spatial)), x.dtype)
    k, positions = math.prod(kernel), math.prod(out_spatial)
    check_shape((n, c * k, positions), x.dtype.itemsize, "the im2col columns of a convolution")
    view = windows(xp, kernel, op.strides, op.dilations, out_spatial)
    # Kernel axes before position axes: the copy that reshape makes is then im2col's layout.
    cols = view.transpose(0, 1, *range(2 + spatial, 2 + 2 * spatial), *range(2, 2 + spatial))
    wg = w.reshape(g, m // g, c // g * k)
    out = np.matmul(wg, cols.reshape(n, g, c // g * k, positions))
    return out.reshape(n, m, *out_spatial)


def pool(op: Pool, x: Array) -> Array:
    """Max or average pooling, with ceil mode handled as extra padding that never counts."""
    spatial = x.ndim - 2
    out_spatial, extra = [], []
    for i in range(spatial):
        size = x.shape[2 + i] + op.pads[i][0] + op.pads[i][1]
        span = op.dilations[i] * (op.kernel[i] - 1) + 1
        if op.ceil_mode:
            out = -(-(size - span) // op.strides[i]) + 1
            if (out - 1) * op.strides[i] >= x.shape[2 + i] + op.pads[i][0]:
                out -= 1
        else:
            out = (size - span) // op.strides[i] + 1
        out_spatial.append(out)
        extra.append(max(0, (out - 1) * op.strides[i] + span - size))
    if any(o <= 0 for o in out_spatial):  # the window is wider than the padded input
        return np.zeros((*x.shape[:2], *(max(o, 0) for o in out_spatial)), x.dtype)
    widths = ((0, 0), (0, 0), *((b, a + e) for (b, a), e in zip(op.pads, extra, strict=True)))
    window = (op.kernel, op.strides, op.dilations, tuple(out_spatial))
    if op.kind is PoolKind.MAX:
        if np.issubdtype(x.dtype, np.floating):
            low: Any = -np.inf
        else:
            low = False if x.dtype == np.bool_ else ml_dtypes.iinfo(x.dtype).min
        return _over_windows(np.maximum, _padded(x, widths, low), *window)
    # Sum in at least f32, then divide by what each window covers: real elements, plus the
    # explicit padding if it counts (the ceil-mode extra never does).
    total = _over_windows(
        np.add, _padded(x.astype(np.result_type(x, np.float32)), widths, 0), *window
    )
    ones = np.ones((1, 1, *x.shape[2:]))
    if op.count_include_pad:
        ones = _padded(ones, ((0, 0), (0, 0), *op.pads), 1)
        count_widths = ((0, 0), (0, 0), *((0, e) for e in extra))
    else:
        count_widths = widths
    count = _over_windows(np.add, _padded(ones, count_widths, 0), *window)
    return (total / np.maximum(count, 1)).astype(x.dtype)


def _padded(x: Array, widths: tuple[tuple[int, int], ...], value: float) -> Array:
    """`x` with `widths` elements of `value` around each axis (np.pad, without its overhead)."""
    if not any(b or a for b, a in widths):
        return x
    shape = tuple(d + b + a for d, (b, a) in zip(x.shape, widths, strict=True))
    check_shape(shape, x.dtype.itemsize, "a padded input of a window op")
    out = np.full(shape, value, x.dtype)
    out[tuple(slice(b, b + d) for d, (b, _) in zip(x.shape, widths, strict=True))] = x
    return out


def _over_windows(
    combine: np.ufunc,
    xp: Array,
    kernel: tuple[int, ...],
    strides: tuple[int, ...],
    dilations: tuple[int, ...],
    out_spatial: tuple[int, ...],
) -> Array:
    """Each window of the trailing axes of `xp` combined elementwise by `combine`.

    One pass per kernel offset over a strided slice: much faster in numpy than reducing the
    windows view, whose innermost axes are the short kernel axes. Large kernels (a global
    pool written as a window over the whole input) reduce the view instead: a Python loop
    over millions of offsets would take minutes.
    """
    if math.prod(kernel) > _MAX_OFFSET_PASSES:
        view = windows(xp, kernel, strides, dilations, out_spatial)
        return np.asarray(combine.reduce(view, axis=tuple(range(xp.ndim, view.ndim))))
    result: Array | None = None
    for offset in np.ndindex(*kernel):
        index = tuple(
            slice(o * d, o * d + (n - 1) * s + 1, s)
            for o, d, n, s in zip(offset, dilations, out_spatial, strides, strict=True)
        )
        part = xp[(slice(None),) * (xp.ndim - len(kernel)) + index]
        if result is None:
            result = part.copy()
        else:
            combine(result, part, out=result)
    assert result is not None
    return result
