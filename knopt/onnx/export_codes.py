"""Float weights read back as the 8-bit codes a quantizer made them from.

A quantized model's weights are 8-bit codes times a scale (per tensor, or per output channel),
dequantized by a DequantizeLinear. The optimizer folds that dequantization, and often the next
quantization's scale too, into float weights: `codes * (scale / next_scale)`, rounded to
float32. The codes come back exactly: the coarsest step of which every weight is a whole
multiple, within a thousandth of a code.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Folding scales into weights moves them by under 1e-4 of a code (a few roundings of 2^-24 of
# codes up to 255); random float weights come that close to whole codes only by chance.
_CODE_TOLERANCE = 1e-3
_MAX_LEVELS = 255  # codes of an 8-bit type span at most 255 steps
_SAMPLE = 64  # a scale is tried on this many weights before all of them


@dataclass(frozen=True)
class Codes:
    """8-bit codes of weights: `weights == (codes - zero) * scale`, per tensor or per `axis`."""

    codes: np.ndarray
    scale: np.ndarray  # 0-d, or one per slice along `axis`
    zero: np.ndarray  # like `scale`, of the codes' type
    axis: int | None


def quantized_weights(weights: np.ndarray, axis: int | None) -> Codes | None:
    """`weights` as 8-bit codes times one scale, per tensor or else per slice along `axis`.

    The scale is the coarsest that makes every weight a whole multiple of it; the codes are
    int8 where they fit, else uint8 less a zero point.

    Returns:
        The codes, or None if the weights are no such multiples (float weights).
    """
    if weights.dtype != np.float32 or weights.size == 0 or not np.all(np.isfinite(weights)):
        return None
    found = _codes(weights.reshape(1, -1))
    if found is not None:
        return _narrowed(found[0].reshape(weights.shape), found[1].reshape(()), None)
    if axis is None or weights.ndim < 2:
        return None
    rows = np.moveaxis(weights, axis, 0)
    found = _codes(rows.reshape(rows.shape[0], -1))
    if found is None:
        return None
    return _narrowed(np.moveaxis(found[0].reshape(rows.shape), 0, axis), found[1], axis)


def _codes(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Whole-number codes, and a scale per row of which the row's values are those multiples."""
    wide = rows.astype(np.float64)
    steps = np.empty(len(rows))
    for row, values in enumerate(wide):
        step = _step(values)
        if step is None:
            return None
        steps[row] = step
    return np.rint(wide / steps[:, None]), steps.astype(np.float32)


def _step(values: np.ndarray) -> float | None:
    """The largest `peak / n`, n at most 255, of which every value is a whole multiple."""
    peak = float(np.max(np.abs(values)))
    if peak == 0:
        return 1.0  # all codes 0, at any scale
    steps = peak / np.arange(1, _MAX_LEVELS + 1)
    ratios = values[None, :_SAMPLE] / steps[:, None]  # every step at once, on a sample
    candidates = np.all(np.abs(ratios - np.rint(ratios)) <= _CODE_TOLERANCE, axis=1)
    for step in steps[candidates]:  # coarsest first
        if _whole(values, float(step)):
            return float(step)
    return None


def _whole(values: np.ndarray, step: float) -> bool:
    ratio = values / step
    return bool(np.all(np.abs(ratio - np.rint(ratio)) <= _CODE_TOLERANCE))


def _narrowed(codes: np.ndarray, scale: np.ndarray, axis: int | None) -> Codes | None:
    """The codes as int8 (zero point 0) where they fit, else as uint8 less a zero point."""
    if codes.min() >= -128 and codes.max() <= 127:
        return Codes(codes.astype(np.int8), scale, np.zeros(scale.shape, np.int8), axis)
    others = tuple(a for a in range(codes.ndim) if a != axis)
    low, high = codes.min(axis=others), codes.max(axis=others)
    if np.any(high - low > _MAX_LEVELS):
        return None
    shape = [1] * codes.ndim
    if axis is not None:
        shape[axis] = -1
    shifted = codes - low.reshape(shape)
    return Codes(shifted.astype(np.uint8), scale, (-low).astype(np.uint8), axis)
