"""Test helpers: random non-zero inputs, and running models on knopt and on the oracles."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx

import knopt
from knopt.ir.dtype import DType
from knopt.ir.graph import Graph


def random_array(
    rng: np.random.Generator,
    shape: Sequence[int],
    dtype: DType,
    *,
    low: float = -3.0,
    high: float = 3.0,
) -> np.ndarray:
    """Random values of `dtype` in `[low, high)`, never zero (bools are random)."""
    shape = tuple(shape)
    if dtype is DType.BOOL:
        return rng.random(shape) < 0.5
    if dtype.is_float:
        values = rng.uniform(low, high, shape)
        values = np.where(np.abs(values) < 1e-2, 0.5, values)
        return values.astype(dtype.numpy)
    lo = max(int(low), 1) if not dtype.is_signed else int(low)
    ints = rng.integers(lo, max(int(high), lo + 1) + 1, shape)
    ints = np.where(ints == 0, 1, ints)
    return ints.astype(dtype.numpy)


def run_knopt(graph: Graph, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The graph's outputs on knopt's CPU executor."""
    return knopt.compile(graph).run(None, feeds)


def run_onnxruntime(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The model's outputs on onnxruntime's CPU provider, single-threaded."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return list(session.run(None, dict(feeds)))


def run_reference(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The model's outputs on onnx's reference evaluator."""
    from onnx.reference import ReferenceEvaluator

    return [np.asarray(a) for a in ReferenceEvaluator(model).run(None, dict(feeds))]


def assert_same(
    ours: Sequence[np.ndarray],
    theirs: Sequence[np.ndarray],
    *,
    rtol: float = 1e-4,
    atol: float = 1e-5,
) -> None:
    """Equal counts, shapes, dtypes and values (within tolerance for floats)."""
    assert len(ours) == len(theirs)
    for mine, expected in zip(ours, theirs, strict=True):
        expected = np.asarray(expected)
        assert mine.shape == expected.shape
        assert mine.dtype == expected.dtype
        if np.issubdtype(mine.dtype, np.floating) or mine.dtype == DType.BF16.numpy:
            np.testing.assert_allclose(
                mine.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol
            )
        else:
            np.testing.assert_array_equal(mine, expected)
