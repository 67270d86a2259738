"""The writer's reps: constants at their smallest broadcasting form, shapes that broadcast."""

from __future__ import annotations

import numpy as np

from knopt.ir import sym
from knopt.onnx.writer import MINIMIZE_MAX_ELEMENTS, broadcasts_to, joined_shape, minimal_array

BATCH = sym("batch")


def test_a_splat_becomes_one_value() -> None:
    small = minimal_array(np.full((2, 3, 4), 1.5, np.float32))
    assert small.shape == ()
    assert small.dtype == np.float32
    assert small == np.float32(1.5)


def test_a_nan_splat_is_a_splat_too() -> None:
    assert minimal_array(np.full((3,), np.nan, np.float32)).shape == ()


def test_leading_unit_axes_go_and_constant_axes_shrink() -> None:
    bias = np.arange(8, dtype=np.float32).reshape(1, 8, 1, 1)
    assert minimal_array(bias).shape == (8, 1, 1)
    rows = np.broadcast_to(np.arange(5, dtype=np.int64), (4, 5)).copy()
    small = minimal_array(rows)
    assert small.shape == (5,)
    np.testing.assert_array_equal(np.broadcast_to(small, rows.shape), rows)


def test_negative_zero_is_not_zero() -> None:
    values = np.array([[0.0, -0.0], [0.0, -0.0]], np.float32)
    assert minimal_array(values).shape == (2,)


def test_large_constants_keep_their_axes() -> None:
    rows = np.broadcast_to(np.arange(8, dtype=np.float32), (MINIMIZE_MAX_ELEMENTS, 8)).copy()
    assert minimal_array(rows).shape == rows.shape


def test_broadcasting_aligns_on_the_right() -> None:
    assert broadcasts_to((8, 1, 1), (BATCH, 8, 4, 4))
    assert broadcasts_to((), (BATCH, 3))
    assert broadcasts_to((BATCH, 1, 4), (BATCH, 3, 4))
    assert not broadcasts_to((8,), (BATCH, 8, 4))
    assert not broadcasts_to((2, BATCH, 4), (BATCH, 4))


def test_joined_shape_keeps_the_axes_some_operand_has() -> None:
    full = (BATCH, 4, 6, 6)
    assert joined_shape([(4, 1, 1), (BATCH, 1, 1, 6)], full) == (BATCH, 4, 1, 6)
    assert joined_shape([(), (1,)], full) == (1,)
