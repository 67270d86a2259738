"""Comparing outputs: exact for integers, tolerances scaled by magnitude for floats."""

from __future__ import annotations

import numpy as np

from knopt.testing.compare import compare_arrays, compare_outputs, tolerance


def test_float_errors_are_judged_against_the_magnitude_of_the_tensor() -> None:
    expected = np.array([1000.0, 1e-3], np.float32)
    near = expected + np.array([0.05, 0.005], np.float32)  # 5e-5 of the largest value
    assert compare_arrays(near, expected).ok
    assert not compare_arrays(expected + np.array([0.0, 0.02], np.float32), expected).ok


def test_integers_and_bools_compare_exactly() -> None:
    assert tolerance(np.dtype(np.int64)) is None
    result = compare_arrays(np.array([1, 2]), np.array([1, 3]))
    assert not result.ok and result.max_error == 1.0
    assert compare_arrays(np.array([True]), np.array([True])).ok


def test_nans_and_infinities_must_sit_at_the_same_places() -> None:
    a = np.array([np.nan, np.inf, 1.0], np.float32)
    assert compare_arrays(a, a.copy()).ok
    assert not compare_arrays(np.array([1.0, np.inf, 1.0], np.float32), a).ok


def test_shapes_dtypes_and_counts_must_agree() -> None:
    a = np.zeros(3, np.float32)
    assert not compare_arrays(a, np.zeros(3, np.float64)).ok
    assert not compare_arrays(a, np.zeros((3, 1), np.float32)).ok
    assert "2 outputs" in compare_outputs([a, a], [a]).message
    assert "output 1" in compare_outputs([a, a], [a, a + 1]).message
