"""The quantized products export as standard ONNX that onnxruntime runs to the same values.

IntMatMul and IntConv write int32 products of centered operands (exact: equal bit for bit),
Int4MatMul its weight unpacked by integer ops (equal within float rounding of the product).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from knopt.ir.builder import GraphBuilder
from knopt.ir.dtype import DType
from knopt.ir.shape import sym
from knopt.onnx.export import save_onnx
from tests.cuda.quant import random_nbits
from tests.oracle import run_knopt, run_onnxruntime

U8, I8 = DType.U8, DType.I8


def _codes(rng: np.random.Generator, shape: tuple[int, ...], dtype: DType) -> np.ndarray:
    info = np.iinfo(dtype.numpy)
    return rng.integers(int(info.min), int(info.max) + 1, shape).astype(dtype.numpy)


def test_int_matmul_exports_exactly(rng: np.random.Generator) -> None:
    b = GraphBuilder("case")
    a = b.input("a", (sym("batch"), 5, 24), U8)
    w = b.broadcast(b.constant(_codes(rng, (24, 7), I8)), (sym("batch"), 24, 7))
    zeros = b.view(b.constant(_codes(rng, (7,), I8)), (1, 1, 7))
    b.output(b.int_matmul(a, w, b.constant(np.uint8(131)), zeros), "y")
    graph = b.build()
    feeds = {"a": _codes(rng, (3, 5, 24), U8)}
    (expected,) = run_knopt(graph, feeds)
    (ours,) = run_onnxruntime(save_onnx(graph), feeds)
    np.testing.assert_array_equal(ours, expected)


@pytest.mark.parametrize(("atype", "btype"), [(U8, I8), (U8, U8), (I8, I8)])
def test_int_matmul_with_per_tensor_zero_points_is_one_matmul_integer(
    rng: np.random.Generator, atype: DType, btype: DType
) -> None:
    b = GraphBuilder("case")
    a = b.input("a", (sym("batch"), 5, 24), atype)
    w = b.broadcast(b.constant(_codes(rng, (24, 7), btype)), (sym("batch"), 24, 7))
    zero_b = b.broadcast(b.view(b.constant(_codes(rng, (), btype)), (1, 1, 1)), (1, 1, 7))
    b.output(b.int_matmul(a, w, b.constant(_codes(rng, (), atype)), zero_b), "y")
    graph = b.build()
    model = save_onnx(graph)
    assert Counter(n.op_type for n in model.graph.node)["MatMulInteger"] == 1
    feeds = {"a": _codes(rng, (3, 5, 24), atype)}
    (expected,) = run_knopt(graph, feeds)
    (ours,) = run_onnxruntime(model, feeds)
    np.testing.assert_array_equal(ours, expected)


def test_int_conv_exports_exactly(rng: np.random.Generator) -> None:
    b = GraphBuilder("case")
    x = b.input("x", (2, 4, 7, 6), I8)
    w = b.constant(_codes(rng, (6, 2, 3, 3), I8))
    zeros = b.view(b.constant(_codes(rng, (6,), I8)), (6, 1, 1, 1))
    y = b.int_conv(
        x,
        w,
        b.constant(np.int8(-5)),
        zeros,
        strides=(1, 2),
        pads=((1, 1), (0, 1)),
        dilations=(1, 1),
        groups=2,
    )
    b.output(y, "y")
    graph = b.build()
    feeds = {"x": _codes(rng, (2, 4, 7, 6), I8)}
    (expected,) = run_knopt(graph, feeds)
    (ours,) = run_onnxruntime(save_onnx(graph), feeds)
    np.testing.assert_array_equal(ours, expected)


@pytest.mark.parametrize(("xtype", "wtype"), [(I8, I8), (U8, I8), (U8, U8)])
def test_int_conv_with_per_tensor_zero_points_is_one_conv_integer(
    rng: np.random.Generator, xtype: DType, wtype: DType
) -> None:
    b = GraphBuilder("case")
    x = b.input("x", (2, 4, 7, 6), xtype)
    w = b.constant(_codes(rng, (6, 2, 3, 3), wtype))
    zero_w = b.broadcast(b.view(b.constant(_codes(rng, (1,), wtype)), (1, 1, 1, 1)), (6, 1, 1, 1))
    y = b.int_conv(
        x,
        w,
        b.constant(_codes(rng, (), xtype)),
        zero_w,
        strides=(1, 2),
        pads=((1, 1), (0, 1)),  # padded taps hold the zero point: they add nothing
        dilations=(2, 1),
        groups=2,
    )
    b.output(y, "y")
    graph = b.build()
    model = save_onnx(graph)
    assert Counter(n.op_type for n in model.graph.node) == Counter({"ConvInteger": 1})
    feeds = {"x": _codes(rng, (2, 4, 7, 6), xtype)}
    (expected,) = run_knopt(graph, feeds)
    (ours,) = run_onnxruntime(model, feeds)
    np.testing.assert_array_equal(ours, expected)


def test_int4_matmul_exports(rng: np.random.Generator) -> None:
    k, n, block = 40, 6, 16
    weight = random_nbits(rng, n, k, block, DType.F16, True)
    assert weight.zeros is not None
    b = GraphBuilder("case")
    a = b.input("a", (2, 3, k), DType.F32)
    scales = b.constant(weight.scales.astype(np.float32))
    y = b.int4_matmul(a, b.constant(weight.b), scales, b.constant(weight.zeros), block=block)
    b.output(y, "y")
    graph = b.build()
    feeds = {"a": rng.standard_normal((2, 3, k)).astype(np.float32)}
    (expected,) = run_knopt(graph, feeds)
    (ours,) = run_onnxruntime(save_onnx(graph), feeds)
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)
