"""Random non-zero inputs."""

from __future__ import annotations

import numpy as np
import pytest

from knopt.errors import InputError
from knopt.ir import DType, GraphBuilder, sym
from knopt.testing.arrays import (
    describe_inputs,
    limit_array,
    limit_inputs,
    random_array,
    random_inputs,
)


@pytest.mark.parametrize(
    "dtype", [DType.F32, DType.F64, DType.F16, DType.I32, DType.I64, DType.U8, DType.BOOL]
)
def test_random_arrays_have_the_dtype_and_no_zeros(dtype: DType) -> None:
    array = random_array(np.random.default_rng(1), (50,), dtype)
    assert array.dtype == dtype.numpy
    if dtype is not DType.BOOL:
        assert np.all(array != 0)
        assert np.all(np.abs(array.astype(np.float64)) <= 5)


def test_inputs_follow_the_graph_and_symbolic_sizes_are_refused() -> None:
    g = GraphBuilder()
    g.output(g.input("x", (2, 3), DType.F32), "y")
    feeds = random_inputs(g.build(), np.random.default_rng(0))
    assert feeds["x"].shape == (2, 3)
    assert "x: float32[2, 3] in [" in describe_inputs(feeds)
    s = GraphBuilder()
    s.output(s.input("x", (sym("n"),), DType.F32), "y")
    with pytest.raises(InputError, match="'x'"):
        random_inputs(s.build(), np.random.default_rng(0))


@pytest.mark.parametrize(
    "dtype", [DType.I8, DType.U8, DType.I16, DType.U16, DType.I32, DType.I64, DType.U64]
)
def test_limit_arrays_reach_both_limits_and_hold_no_zeros(dtype: DType) -> None:
    array = limit_array(np.random.default_rng(2), (400,), dtype)
    info = np.iinfo(dtype.numpy)
    assert array.dtype == dtype.numpy
    assert np.all(array != 0)
    assert array.max() == info.max
    assert array.min() == (info.min if info.min < 0 else 1)


def test_limit_inputs_change_only_integer_inputs_and_need_one() -> None:
    g = GraphBuilder()
    x, n = g.input("x", (64,), DType.F32), g.input("n", (64,), DType.I8)
    g.output(x, "y")
    g.output(n, "m")
    feeds = limit_inputs(g.build(), np.random.default_rng(0))
    assert feeds is not None
    assert np.all(np.abs(feeds["x"]) <= 2.5)
    assert np.abs(feeds["n"].astype(np.int64)).max() >= 127
    floats = GraphBuilder()
    floats.output(floats.input("x", (3,), DType.F32), "y")
    assert limit_inputs(floats.build(), np.random.default_rng(0)) is None


def test_limit_arrays_are_for_integers_only() -> None:
    with pytest.raises(ValueError, match="F32 is no integer type"):
        limit_array(np.random.default_rng(0), (3,), DType.F32)
