"""com.microsoft.MatMulNBits (onnxruntime's weight-only int4/int8 MatMul) agrees with onnxruntime.

Weights are random packed bytes, so every code value and both nibbles of a byte occur; K is not
always a multiple of the block size (the padded tail of the last block must be ignored).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import knopt
from knopt.errors import UnsupportedModelError
from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.onnx_backend import KnoptBackend
from tests.oracle import run_onnxruntime

MS = "com.microsoft"


@dataclass(frozen=True)
class Case:
    """One MatMulNBits node: sizes, bits and which optional inputs it has."""

    k: int
    n: int
    bits: int = 4
    block: int = 32
    zero_points: str = "none"  # "none", "packed" or "float"
    bias: bool = False
    dtype: type = np.float32
    accuracy_level: int = 0
    batch: tuple[int, ...] = (3,)


def _model(case: Case, rng: np.random.Generator, g_idx: bool = False) -> onnx.ModelProto:
    blocks = -(-case.k // case.block)
    blob = case.block * case.bits // 8
    constants: dict[str, np.ndarray | None] = {
        "B": rng.integers(0, 256, (case.n, blocks, blob), dtype=np.uint8),
        "scales": rng.uniform(0.01, 0.1, (case.n, blocks)).astype(case.dtype),
        "zero_points": None,
        "g_idx": rng.integers(0, blocks, case.k).astype(np.int32) if g_idx else None,
        "bias": rng.standard_normal(case.n).astype(case.dtype) if case.bias else None,
    }
    if case.zero_points == "packed":
        width = -(-blocks * case.bits // 8)
        constants["zero_points"] = rng.integers(0, 256, (case.n, width), dtype=np.uint8)
    elif case.zero_points == "float":
        high = 2**case.bits - 1
        constants["zero_points"] = rng.uniform(0, high, (case.n, blocks)).astype(case.dtype)
    names = ["A", *(name if array is not None else "" for name, array in constants.items())]
    while not names[-1]:
        names.pop()
    attributes: dict[str, Any] = {
        "K": case.k,
        "N": case.n,
        "bits": case.bits,
        "block_size": case.block,
    }
    if case.accuracy_level:
        attributes["accuracy_level"] = case.accuracy_level
    node = helper.make_node("MatMulNBits", names, ["Y"], domain=MS, **attributes)
    element = helper.np_dtype_to_tensor_dtype(np.dtype(case.dtype))
    graph = helper.make_graph(
        [node],
        "matmul_nbits",
        [helper.make_tensor_value_info("A", element, [*case.batch, case.k])],
        [helper.make_tensor_value_info("Y", element, [*case.batch, case.n])],
        [numpy_helper.from_array(a, n) for n, a in constants.items() if a is not None],
    )
    imports = [helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)]
    return helper.make_model(graph, opset_imports=imports, ir_version=10)


def _feeds(case: Case, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"A": rng.standard_normal((*case.batch, case.k)).astype(case.dtype)}


def _assert_close(ours: np.ndarray, theirs: np.ndarray, dtype: type) -> None:
    assert ours.shape == theirs.shape
    assert ours.dtype == theirs.dtype
    scale = float(np.abs(theirs.astype(np.float32)).max())
    if dtype is np.float32:  # float32 sums in another order
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6 * scale)
    else:  # one float16 rounding of the float32 result, on both sides
        np.testing.assert_allclose(
            ours.astype(np.float32), theirs.astype(np.float32), rtol=2e-3, atol=2e-3 * scale
        )


CASES = [
    Case(64, 8, block=16),
    Case(64, 8, block=16, zero_points="packed"),
    Case(70, 12, block=32, zero_points="packed"),  # K padded; an odd count of zero points
    Case(96, 8, block=32, zero_points="float"),
    Case(256, 16, block=64, zero_points="packed", bias=True, batch=(2, 5)),
    Case(300, 24, block=128, zero_points="packed"),
    Case(512, 8, block=256),
    Case(96, 16, bits=8, block=32, zero_points="packed"),
    Case(96, 16, bits=8, block=16),
    Case(96, 16, bits=2, block=32, zero_points="packed", bias=True),
    Case(64, 8, block=16, zero_points="packed", dtype=np.float16),
    Case(64, 8, block=32, zero_points="float", bias=True, dtype=np.float16),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_matmul_nbits_matches_onnxruntime(rng: np.random.Generator, case: Case) -> None:
    model = _model(case, rng)
    feeds = _feeds(case, rng)
    (ours,) = KnoptBackend.run_model(model, feeds)
    (theirs,) = run_onnxruntime(model, feeds)
    _assert_close(ours, theirs, case.dtype)


def test_matmul_nbits_keeps_the_packed_weight(rng: np.random.Generator) -> None:
    case = Case(256, 16, block=64, zero_points="packed")
    graph = knopt.load(_model(case, rng).SerializeToString())
    constants = [n.op.data.array for n in graph.nodes if isinstance(n.op, ops.Constant)]
    assert any(c.dtype == np.uint8 and c.shape == (16, 4, 32) for c in constants)
    assert max(c.size for c in constants if c.dtype != np.uint8) < case.k * case.n
    assert {n.output.dtype for n in graph.nodes if isinstance(n.op, ops.MatMul)} == {DType.F32}


def test_accuracy_level_is_read_and_knopt_computes_at_full_precision(
    rng: np.random.Generator,
) -> None:
    # onnxruntime's CPU provider may quantize A to int8 per block at level 4; knopt does not.
    case = Case(256, 16, block=64, zero_points="packed", accuracy_level=4)
    model = _model(case, np.random.default_rng(1))
    full = _model(Case(256, 16, block=64, zero_points="packed"), np.random.default_rng(1))
    feeds = _feeds(case, rng)
    (ours,) = KnoptBackend.run_model(model, feeds)
    _assert_close(ours, run_onnxruntime(full, feeds)[0], np.float32)
    (level4,) = run_onnxruntime(model, feeds)
    assert np.abs(ours - level4).max() <= 0.02 * np.abs(level4).max()


def test_matmul_nbits_refuses_g_idx(rng: np.random.Generator) -> None:
    with pytest.raises(UnsupportedModelError, match="g_idx"):
        knopt.load(_model(Case(64, 8, block=16), rng, g_idx=True).SerializeToString())


def test_matmul_nbits_refuses_a_block_size_that_is_not_a_power_of_two(
    rng: np.random.Generator,
) -> None:
    model = _model(Case(64, 8, block=16), rng)
    attribute = next(a for a in model.graph.node[0].attribute if a.name == "block_size")
    attribute.i = 24
    with pytest.raises(UnsupportedModelError, match="block_size=24"):
        knopt.load(model.SerializeToString())
