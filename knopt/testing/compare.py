"""Comparing outputs: exact for integers and bools, dtype-scaled tolerances for floats.

A float element agrees when `|actual - expected| <= atol * scale + rtol * |expected|`, where
`scale` is the output's largest finite magnitude (at least 1): an absolute error is judged
against the size of the values the tensor holds. NaNs and infinities must sit at the same places.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# (rtol, atol) per numpy float type; one rounding of a rewritten constant is far inside these.
TOLERANCES: dict[np.dtype, tuple[float, float]] = {
    np.dtype(np.float64): (1e-7, 1e-8),
    np.dtype(np.float32): (1e-4, 1e-5),
    np.dtype(np.float16): (1e-2, 1e-2),
}
_NARROW = (2e-2, 2e-2)  # bfloat16 and the float8 types


@dataclass(frozen=True)
class Comparison:
    """How two lists of outputs compare.

    Attributes:
        ok: Whether every output agrees.
        max_error: The largest absolute difference seen (inf for a shape, dtype or NaN mismatch).
        message: What disagrees first, or '' when everything agrees.
    """

    ok: bool
    max_error: float
    message: str


def tolerance(dtype: np.dtype) -> tuple[float, float] | None:
    """`(rtol, atol)` for a float dtype, None for exact types (integers and bools)."""
    if dtype in TOLERANCES:
        return TOLERANCES[dtype]
    if dtype.kind == "f" or "float" in dtype.name:
        return _NARROW
    return None


def compare_arrays(actual: np.ndarray, expected: np.ndarray) -> Comparison:
    """Whether one output agrees with the expected one."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return Comparison(
            False,
            float("inf"),
            f"got {actual.dtype}{list(actual.shape)}, expected "
            f"{expected.dtype}{list(expected.shape)}",
        )
    tol = tolerance(expected.dtype)
    if tol is None:
        wrong = actual != expected
        count = int(np.count_nonzero(wrong))
        error = float(np.max(np.abs(actual.astype(np.float64) - expected))) if count else 0.0
        return Comparison(count == 0, error, f"{count} elements differ" if count else "")
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    special = ~np.isfinite(e) | ~np.isfinite(a)
    if np.any(special & ~((a == e) | (np.isnan(a) & np.isnan(e)))):
        return Comparison(False, float("inf"), "NaNs or infinities differ")
    finite = np.abs(e[~special])
    scale = max(1.0, float(finite.max())) if finite.size else 1.0
    rtol, atol = tol
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf where both are special
        diff = np.where(special, 0.0, np.abs(a - e))
    error = float(diff.max()) if diff.size else 0.0
    bad = diff > atol * scale + rtol * np.abs(np.where(special, 0.0, e))
    if np.any(bad):
        return Comparison(
            False, error, f"{int(np.count_nonzero(bad))} elements differ (max error {error:.3g})"
        )
    return Comparison(True, error, "")


def compare_outputs(actual: Sequence[np.ndarray], expected: Sequence[np.ndarray]) -> Comparison:
    """Whether every output agrees; the message names the first one that does not."""
    if len(actual) != len(expected):
        return Comparison(False, float("inf"), f"{len(actual)} outputs, expected {len(expected)}")
    worst = 0.0
    for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
        result = compare_arrays(a, e)
        worst = max(worst, result.max_error)
        if not result.ok:
            return Comparison(False, worst, f"output {index}: {result.message}")
    return Comparison(True, worst, "")
