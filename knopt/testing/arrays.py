"""Random non-zero inputs of moderate magnitude, the inputs every differential test uses.

Zeros hide bugs (a dropped term times zero is still zero) and large values hide nothing but
overflow, so floats are drawn with magnitudes in `[low, high]` and a random sign, integers from
a small range without zero, and bools at random. Where overflow is the point (a rule that is
wrong only when a sum or product wraps), `limit_inputs` draws integers near their limits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import ml_dtypes
import numpy as np

from knopt.errors import InputError
from knopt.ir.dtype import DType
from knopt.ir.graph import Graph
from knopt.ir.shape import static_dims


def random_array(
    rng: np.random.Generator,
    shape: Sequence[int],
    dtype: DType,
    *,
    low: float = 0.25,
    high: float = 2.5,
) -> np.ndarray:
    """Random values of `dtype`, never zero: floats have magnitudes in `[low, high]`.

    Integers are drawn from `[-5, 5]` (unsigned ones from `[1, 5]`), bools at random.
    """
    shape = tuple(shape)
    if dtype is DType.BOOL:
        return rng.random(shape) < 0.5
    if dtype.is_float:
        magnitude = rng.uniform(low, high, shape)
        sign = np.where(rng.random(shape) < 0.5, -1.0, 1.0)
        return (sign * magnitude).astype(dtype.numpy)
    lo = -5 if dtype.is_signed else 1
    values = rng.integers(lo, 6, shape)
    return np.where(values == 0, 1, values).astype(dtype.numpy)


def random_inputs(graph: Graph, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One random non-zero array per input of `graph`, by input name.

    Raises:
        InputError: If an input has a symbolic size (bind it first with `bind_symbols`).
    """
    feeds = {}
    for name, value in zip(graph.input_names, graph.inputs, strict=True):
        shape = static_dims(value.shape)
        if shape is None:
            raise InputError(f"input '{name}' has symbolic sizes {value.shape}; bind them first")
        feeds[name] = random_array(rng, shape, value.dtype)
    return feeds


def limit_array(rng: np.random.Generator, shape: Sequence[int], dtype: DType) -> np.ndarray:
    """Random non-zero integers of `dtype`, half of them at or near the type's limits.

    The values near the limits are the extremes, one step inside them, about half of them
    (sums overflow) and about the square root of the largest (products overflow), with both
    signs where the type has them; the other half are small, as `random_array` draws them.

    Raises:
        ValueError: If `dtype` is not an integer type.
    """
    if not dtype.is_int:
        raise ValueError(f"{dtype.name} is no integer type")
    info = ml_dtypes.iinfo(dtype.numpy)  # numpy's iinfo knows no 4-bit integers
    lo, hi = int(info.min), int(info.max)
    root = math.isqrt(hi) + 1
    near = {lo, lo + 1, hi - 1, hi, hi // 2 + 1, root, -root, lo // 2 - 1, -(hi // 2 + 1)}
    pool = np.array(sorted(v for v in near if lo <= v <= hi and v != 0), dtype=dtype.numpy)
    shape = tuple(shape)
    small = random_array(rng, shape, dtype)
    picked = pool[rng.integers(0, len(pool), shape)]
    return np.where(rng.random(shape) < 0.5, picked, small).astype(dtype.numpy)


def limit_inputs(graph: Graph, rng: np.random.Generator) -> dict[str, np.ndarray] | None:
    """Inputs whose integers are near their types' limits (`limit_array`), other inputs random.

    None if the graph has no integer input, so nothing would differ from `random_inputs`.

    Raises:
        InputError: If an input has a symbolic size (bind it first with `bind_symbols`).
    """
    if not any(value.dtype.is_int for value in graph.inputs):
        return None
    feeds = random_inputs(graph, rng)
    for name, value in zip(graph.input_names, graph.inputs, strict=True):
        if value.dtype.is_int:
            feeds[name] = limit_array(rng, feeds[name].shape, value.dtype)
    return feeds


def describe_inputs(feeds: Mapping[str, np.ndarray]) -> str:
    """One line per input: name, dtype, shape and value range."""
    lines = []
    for name, array in feeds.items():
        text = f"{name}: {array.dtype}{list(array.shape)}"
        if array.size and array.dtype != np.bool_:
            text += f" in [{array.min():.4g}, {array.max():.4g}]"
        lines.append(text)
    return "\n".join(lines)
