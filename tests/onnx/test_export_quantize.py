"""Quantizations written as QuantizeLinear and DequantizeLinear, whatever their IR spelling.

As written (ORT_DISABLE_ALL) the file computes exactly what knopt's executor does, except where
a product before a quantization joins its scale: there it may round apart at ties (one step of
the quantization), and onnxruntime fuses the quantization into the op before it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import numpy as np
import onnx
import pytest

from knopt.ir import GraphBuilder
from knopt.ir.dtype import DType
from knopt.ir.graph import Value
from knopt.ir.op import Reduction, Unary
from knopt.onnx.export import save_onnx
from tests.onnx.test_export_fused import BATCH, graph_of, onnxruntime_ops, ops_of
from tests.oracle import assert_same, random_array, run_knopt

F32 = DType.F32


def _run(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], *, optimize: bool) -> list:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    level = ort.GraphOptimizationLevel
    options.graph_optimization_level = level.ORT_ENABLE_ALL if optimize else level.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])
    return list(session.run(None, dict(feeds)))


def _codes(b: GraphBuilder, x: Value, lo: float, *, nan_first: bool = False) -> Value:
    """`clamp(round(x), lo, lo + 255)` with NaN taken to lo, the NaN test before or after."""
    rounded = b.unary(Unary.ROUND, x)
    low = b.scalar(lo, F32, x.shape)
    if nan_first:
        selected = b.where(b.unary(Unary.IS_NAN, rounded), low, rounded)
        return b.clamp(selected, lo=lo, hi=lo + 255.0)
    bounded = b.clamp(rounded, lo=lo, hi=lo + 255.0)
    return b.where(b.unary(Unary.IS_NAN, bounded), low, bounded)


# ---- as imported and as rules/quantize.egg leaves them ---------------------------------
@pytest.mark.parametrize(
    ("dtype", "zero_point"), [(onnx.TensorProto.INT8, 3), (onnx.TensorProto.UINT8, 128)]
)
def test_quantize_and_dequantize_are_the_linear_ops(
    rng: np.random.Generator, dtype: int, zero_point: int
) -> None:
    from onnx import helper, numpy_helper

    import knopt

    numpy_type = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    initializers = [
        numpy_helper.from_array(np.array(0.05, np.float32), "scale"),
        numpy_helper.from_array(np.array(zero_point, numpy_type), "zero"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 8])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    imported = knopt.optimize(knopt.load(model.SerializeToString())).graph
    written = save_onnx(imported)
    # The optimizer made the division by the scale a product: kept, since they round apart.
    assert ops_of(written) == Counter({"Mul": 1, "QuantizeLinear": 1, "DequantizeLinear": 1})
    x = random_array(rng, (3, 8), F32, low=-10, high=10)
    x[0, :4] = [np.nan, np.inf, -np.inf, 0.025]  # saturation, NaN and a tie
    # As written: onnxruntime's own QDQ rewrites may drop a Quantize-Dequantize pair.
    assert_same(
        _run(written, {"x": x}, optimize=False), run_knopt(imported, {"x": x}), rtol=0, atol=0
    )


@pytest.mark.parametrize(("lo", "dtype"), [(-130.0, "int8"), (0.0, "uint8"), (-100.0, "int8")])
def test_fake_quantization_is_quantize_then_dequantize_linear(
    rng: np.random.Generator, lo: float, dtype: str
) -> None:
    """rules/quantize.egg's float spelling of `q - zero`, times a scale: exact as Q then DQ."""

    def build(b: GraphBuilder) -> None:
        x = b.input("x", (BATCH, 8), F32)
        rounded = b.unary(Unary.ROUND, b.mul(x, b.scalar(32.1, F32, (BATCH, 8))))
        low = b.scalar(lo, F32, (BATCH, 8))
        select = b.where(b.unary(Unary.IS_NAN, rounded), low, rounded)
        codes = b.clamp(select, lo=lo, hi=lo + 255.0)
        b.output(b.mul(codes, b.scalar(0.031, F32, (BATCH, 8))), "y")

    graph = graph_of(build)
    written = save_onnx(graph)
    assert ops_of(written) == Counter({"Mul": 1, "QuantizeLinear": 1, "DequantizeLinear": 1})
    (zero,) = [t for t in written.graph.initializer if t.data_type != onnx.TensorProto.FLOAT]
    assert onnx.helper.tensor_dtype_to_np_dtype(zero.data_type) == np.dtype(dtype)
    x = random_array(rng, (3, 8), F32, low=-10, high=10)
    x[0, :5] = [np.nan, np.inf, -np.inf, 0.5 / 32.1, 1.5 / 32.1]  # saturation, NaN, ties
    assert_same(_run(written, {"x": x}, optimize=False), run_knopt(graph, {"x": x}), rtol=0, atol=0)


def test_nan_test_before_the_saturation_is_still_quantize_linear(rng: np.random.Generator) -> None:
    """As the optimizer reorders the importer's spelling: round, shift, NaN test, saturate."""

    def build(b: GraphBuilder) -> None:
        x = b.input("x", (BATCH, 8), F32)
        shifted = b.add(
            b.unary(Unary.ROUND, b.div(x, b.scalar(0.07, F32, (BATCH, 8)))),
            b.scalar(127.0, F32, (BATCH, 8)),
        )
        low = b.scalar(0.0, F32, (BATCH, 8))
        selected = b.where(b.unary(Unary.IS_NAN, shifted), low, shifted)
        b.output(b.cast(b.clamp(selected, lo=0.0, hi=255.0), DType.U8), "q")

    graph = graph_of(build)
    written = save_onnx(graph)
    assert ops_of(written) == Counter({"QuantizeLinear": 1})
    x = random_array(rng, (3, 8), F32, low=-10, high=10)
    x[0, :4] = [np.nan, np.inf, -np.inf, 0.035]  # saturation, NaN and a tie
    assert_same(_run(written, {"x": x}, optimize=False), run_knopt(graph, {"x": x}), rtol=0, atol=0)


def test_fake_quantization_with_a_per_channel_scale_is_per_axis_dequantize_linear(
    rng: np.random.Generator,
) -> None:
    """A LayerNorm's scale folded into the dequantization after it: one scale per channel."""
    scales = rng.uniform(0.01, 0.05, 8).astype(np.float32)

    def build(b: GraphBuilder) -> None:
        x = b.input("x", (BATCH, 4, 8), F32)
        codes = _codes(b, b.mul(x, b.scalar(32.1, F32, x.shape)), -120.0, nan_first=True)
        b.output(b.mul(codes, b.broadcast(b.constant(scales), x.shape)), "y")

    graph = graph_of(build)
    written = save_onnx(graph)
    assert ops_of(written) == Counter({"Mul": 1, "QuantizeLinear": 1, "DequantizeLinear": 1})
    (dequantize,) = [n for n in written.graph.node if n.op_type == "DequantizeLinear"]
    assert [a.i for a in dequantize.attribute if a.name == "axis"] == [2]
    x = random_array(rng, (3, 4, 8), F32, low=-10, high=10)
    assert_same(_run(written, {"x": x}, optimize=False), run_knopt(graph, {"x": x}), rtol=0, atol=0)


def _fake_quantized(b: GraphBuilder, x: Value, scale: float) -> Value:
    """x quantized to int8 (zero point 0) by `scale` and dequantized, as the optimizer writes it."""
    codes = _codes(b, b.mul(x, b.scalar(1 / scale, F32, x.shape)), -128.0)
    return b.mul(codes, b.scalar(scale, F32, x.shape))


def _within_one_step(ours: list, theirs: list, step: float) -> None:
    for mine, expected in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(mine, expected, rtol=0, atol=step * 1.001)


def test_product_before_the_quantization_of_an_add_is_its_scale(
    rng: np.random.Generator,
) -> None:
    """`(DQ(a) + DQ(b)) * c` quantized: QuantizeLinear(sum, 1 / c), which onnxruntime fuses."""

    def build(b: GraphBuilder) -> None:
        shape = (BATCH, 4, 8)
        a, c = b.input("a", shape, F32), b.input("c", shape, F32)
        total = b.add(
            b.mul(
                _codes(b, b.mul(a, b.scalar(20.0, F32, shape)), -128.0), b.scalar(0.05, F32, shape)
            ),
            b.mul(
                _codes(b, b.mul(c, b.scalar(10.0, F32, shape)), -128.0), b.scalar(0.1, F32, shape)
            ),
        )
        codes = _codes(b, b.mul(total, b.scalar(12.5, F32, shape)), -128.0)
        b.output(b.mul(codes, b.scalar(0.08, F32, shape)), "y")

    graph = graph_of(build)
    written = save_onnx(graph)
    assert ops_of(written)["Mul"] == 2  # the graph inputs' products stay exact
    assert onnxruntime_ops(written)["QLinearAdd"] == 1
    feeds = {n: random_array(rng, (3, 4, 8), F32, low=-5, high=5) for n in ("a", "c")}
    for optimize in (False, True):
        _within_one_step(_run(written, feeds, optimize=optimize), run_knopt(graph, feeds), 0.08)


def test_spatial_sum_times_c_before_a_quantization_is_global_average_pool(
    rng: np.random.Generator,
) -> None:
    """The optimizer folds the mean's 1 / N and the quantization's 1 / s into one product."""

    def build(b: GraphBuilder) -> None:
        x = b.input("x", (BATCH, 4, 5, 5), F32)
        dequantized = b.mul(
            _codes(b, b.mul(x, b.scalar(20.0, F32, x.shape)), 0.0), b.scalar(0.05, F32, x.shape)
        )
        total = b.reduce(Reduction.SUM, dequantized, axes=(2, 3))
        codes = _codes(b, b.mul(total, b.scalar(1 / (25 * 0.02), F32, total.shape)), -128.0)
        b.output(b.mul(codes, b.scalar(0.02, F32, total.shape)), "y")

    graph = graph_of(build)
    written = save_onnx(graph)
    assert "ReduceSum" not in ops_of(written) and ops_of(written)["GlobalAveragePool"] == 1
    assert onnxruntime_ops(written)["QLinearGlobalAveragePool"] == 1
    feeds = {"x": random_array(rng, (3, 4, 5, 5), F32, low=0, high=10)}
    for optimize in (False, True):
        _within_one_step(_run(written, feeds, optimize=optimize), run_knopt(graph, feeds), 0.02)
