"""Layouts of views agree with numpy's strided views."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

from knopt.cuda.layout import Layout, contiguous_strides, merge_axes, view_layout
from knopt.ir import op as ops


def _read(base: np.ndarray, layout: Layout) -> np.ndarray:
    item = base.itemsize
    flat = base.reshape(-1)
    start = flat[layout.offset :]
    return as_strided(start, layout.shape, [s * item for s in layout.strides])


def _check(base: np.ndarray, layout: Layout, expected: np.ndarray) -> None:
    np.testing.assert_array_equal(_read(base, layout), expected)


def test_contiguous_strides_zero_for_unit_axes() -> None:
    assert contiguous_strides((2, 1, 3)) == (3, 0, 1)


@pytest.mark.parametrize(
    "op", [ops.Permute((2, 0, 1)), ops.Slice(1, 1, 4, 2), ops.Flip(2), ops.Slice(2, 0, 3)]
)
def test_views_address_the_same_elements_as_numpy(op: ops.Op) -> None:
    from knopt.cpu.kernels import KERNELS

    base = np.arange(60).reshape(3, 4, 5)
    layout = view_layout(op, Layout.contiguous(base.shape))
    assert layout is not None
    _check(base, layout, KERNELS[type(op)](op, base))


def test_broadcast_uses_zero_strides() -> None:
    base = np.arange(5).reshape(1, 5)
    layout = view_layout(ops.Broadcast((4, 5)), Layout.contiguous((1, 5)))
    assert layout is not None and layout.strides == (0, 1)
    _check(base, layout, np.broadcast_to(base, (4, 5)))


def test_reshape_of_a_slice_keeps_strides_where_possible() -> None:
    base = np.arange(48).reshape(4, 12)
    sliced = Layout.contiguous((4, 12)).slice(0, 0, 4, 2)
    viewed = sliced.reshape((2, 3, 4))
    assert viewed is not None
    _check(base, viewed, base[::2].reshape(2, 3, 4))


def test_reshape_of_a_transpose_needs_a_copy() -> None:
    assert Layout.contiguous((3, 4)).permute((1, 0)).reshape((12,)) is None


def test_merge_axes_merges_dense_neighbours_only() -> None:
    dims, strides = merge_axes((2, 3, 4), [(12, 4, 1), (0, 4, 1)])
    assert dims == (2, 12)
    assert strides == [(12, 1), (0, 1)]
    dims, strides = merge_axes((2, 1, 4), [(4, 0, 1)])
    assert dims == (8,) and strides == [(1,)]
