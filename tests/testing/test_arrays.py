"""Random non-zero inputs."""

from __future__ import annotations

import numpy as np
import pytest

from knopt.errors import InputError
from knopt.ir import DType, GraphBuilder, sym
from knopt.testing.arrays import describe_inputs, random_array, random_inputs


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
