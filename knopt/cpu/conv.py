"""Convolution and pooling on numpy: sliding windows over a padded input, contracted by BLAS."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from knopt.ir.op import Conv, Pool, PoolKind

Array = np.ndarray


def windows(
    x: Array,
    kernel: tuple[int, ...],
    strides: tuple[int, ...],
    dilations: tuple[int, ...],
    out_spatial: tuple[int, ...],
) -> Array:
    """A read-only view `[N, C, *out_spatial, *kernel]` of the windows of padded `x`."""
    lead = x.strides[:2]
    spatial = x.strides[2:]
    shape = (*x.shape[:2], *out_spatial, *kernel)
    steps = (
        *lead,
        *(st * s for st, s in zip(spatial, strides, strict=True)),
        *(st * d for st, d in zip(spatial, dilations, strict=True)),
    )
    return as_strided(x, shape, steps, writeable=False)


def conv(op: Conv, x: Array, w: Array) -> Array:
    """N-d cross-correlation; im2col through a windows view, then one contraction per group."""
    spatial = x.ndim - 2
    xp = np.pad(x, ((0, 0), (0, 0), *op.pads))
    kernel = tuple(w.shape[2:])
    out_spatial = tuple(
        (xp.shape[2 + i] - (op.dilations[i] * (kernel[i] - 1) + 1)) // op.strides[i] + 1
        for i in range(spatial)
    )
    if any(o <= 0 for o in out_spatial):
        return np.zeros((x.shape[0], w.shape[0], *(max(o, 0) for o in out_spatial)), x.dtype)
    cols = windows(xp, kernel, op.strides, op.dilations, out_spatial)
    g = op.groups
    n, c = x.shape[:2]
    m = w.shape[0]
    cols = cols.reshape(n, g, c // g, *out_spatial, *kernel)
    wg = w.reshape(g, m // g, c // g, *kernel)
    # Letters: n batch, g group, c in-channel, m out-channel; spatial and kernel axes follow.
    sp = "pqrstu"[:spatial]
    ks = "vwxyz"[:spatial] if spatial <= 5 else None
    assert ks is not None, "conv of more than 5 spatial dims"
    out = np.einsum(f"ngc{sp}{ks},gmc{ks}->ngm{sp}", cols, wg, optimize=True)
    return np.ascontiguousarray(out.reshape(n, m, *out_spatial)).astype(x.dtype, copy=False)


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
    widths = ((0, 0), (0, 0), *((b, a + e) for (b, a), e in zip(op.pads, extra, strict=True)))
    kernel, strides, dilations = op.kernel, op.strides, op.dilations
    if op.kind is PoolKind.MAX:
        low = -np.inf if np.issubdtype(x.dtype, np.floating) else np.iinfo(x.dtype).min
        xp = np.pad(x, widths, constant_values=low)
        win = windows(xp, kernel, strides, dilations, tuple(out_spatial))
        return win.max(axis=tuple(range(-spatial, 0)))
    xp = np.pad(x.astype(np.float64), widths)
    win = windows(xp, kernel, strides, dilations, tuple(out_spatial))
    total = win.sum(axis=tuple(range(-spatial, 0)))
    # Count what each window covers: real elements, plus explicit padding if it counts.
    ones = np.ones((1, 1, *x.shape[2:]))
    if op.count_include_pad:
        ones = np.pad(ones, ((0, 0), (0, 0), *op.pads), constant_values=1.0)
        count_widths = ((0, 0), (0, 0), *((0, e) for e in extra))
    else:
        count_widths = widths
    counts = windows(np.pad(ones, count_widths), kernel, strides, dilations, tuple(out_spatial))
    count = counts.sum(axis=tuple(range(-spatial, 0)))
    return (total / np.maximum(count, 1)).astype(x.dtype)
