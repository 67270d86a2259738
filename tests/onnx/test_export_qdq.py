"""Quantized models are written in the QDQ groups onnxruntime turns into integer kernels.

Each model is optimized by knopt and written; the file keeps its weights as 8-bit codes with a
DequantizeLinear, and onnxruntime (ORT_ENABLE_ALL) runs its products as QLinearConv, QGemm or
QLinearMatMul with the input model's codes. Outputs are compared with the input model's, both
run by onnxruntime: they may differ by one step of the output's quantization where a rounding
ties (the written file divides by `1 / c` where the input model divided by a scale s, and c is
`1 / s` rounded to float).
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import knopt
from knopt.ir import GraphBuilder
from knopt.ir.dtype import DType
from knopt.ir.graph import Graph, Value
from knopt.ir.op import Unary
from knopt.onnx.export import save_onnx
from tests.models import Fixture, fixtures
from tests.oracle import random_array, run_knopt

F32, I8, U8 = DType.F32, DType.I8, DType.U8
QUANTIZED = Path(__file__).parents[1] / "fixtures" / "quantized"


def _session(model: onnx.ModelProto, *, optimize: bool, saved: str | None = None) -> object:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    level = ort.GraphOptimizationLevel
    options.graph_optimization_level = level.ORT_ENABLE_ALL if optimize else level.ORT_DISABLE_ALL
    if saved is not None:
        options.optimized_model_filepath = saved
    return ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])


def _run(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], *, optimize: bool) -> list:
    return list(_session(model, optimize=optimize).run(None, dict(feeds)))  # type: ignore[attr-defined]


def _onnxruntime_graph(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model onnxruntime runs after its own optimizations (ORT_ENABLE_ALL)."""
    with tempfile.TemporaryDirectory() as folder:
        _session(model, optimize=True, saved=f"{folder}/optimized.onnx")
        return onnx.load(f"{folder}/optimized.onnx")


def _ops(model: onnx.ModelProto) -> Counter[str]:
    return Counter(node.op_type for node in model.graph.node)


def _initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _weights_are_codes(model: onnx.ModelProto, op_types: set[str]) -> None:
    """Every `op_types` node reads its weights from a DequantizeLinear of 8-bit codes."""
    producers = {name: node for node in model.graph.node for name in node.output}
    arrays = _initializers(model)
    products = [node for node in model.graph.node if node.op_type in op_types]
    assert products
    for node in products:
        dequantize = producers.get(node.input[1])
        assert dequantize is not None and dequantize.op_type == "DequantizeLinear", node.name
        assert arrays[dequantize.input[0]].dtype in (np.int8, np.uint8), node.name


def _assert_within_one_step(ours: list[np.ndarray], theirs: list[np.ndarray], step: float) -> None:
    for mine, expected in zip(ours, theirs, strict=True):
        assert mine.shape == expected.shape
        np.testing.assert_allclose(mine, expected, rtol=0, atol=step * 1.001)


# ---- a hand-made QDQ convolution ----------------------------------------------------------------


def _qdq_conv(rng: np.random.Generator, per_channel: bool, activations: str) -> onnx.ModelProto:
    """`x -> Q -> DQ -> Conv(DQ(int8 w), DQ(int32 b)) -> Q -> DQ`, as quantize_static writes it."""
    dtype = np.int8 if activations == "int8" else np.uint8
    x_zero, y_zero = (3, -20) if activations == "int8" else (131, 108)
    w_scale: np.ndarray = np.array(0.013, np.float32)
    if per_channel:
        w_scale = np.array([0.011, 0.02, 0.017, 0.005], np.float32)
    x_scale, y_scale = np.float32(0.05), np.float32(0.08)
    arrays = {
        "x_scale": x_scale,
        "x_zero": np.array(x_zero, dtype),
        "y_scale": y_scale,
        "y_zero": np.array(y_zero, dtype),
        "w_codes": rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8),
        "w_scale": w_scale,
        "w_zero": np.zeros(w_scale.shape, np.int8),
        "b_codes": rng.integers(-2000, 2000, 4).astype(np.int32),
        "b_scale": (x_scale * w_scale).astype(np.float32),
        "b_zero": np.zeros(w_scale.shape, np.int32),
    }
    axis: dict[str, Any] = {"axis": 0} if per_channel else {}
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zero"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w_codes", "w_scale", "w_zero"], ["w"], **axis),
        helper.make_node("DequantizeLinear", ["b_codes", "b_scale", "b_zero"], ["b"], **axis),
        helper.make_node("Conv", ["xd", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["c", "y_scale", "y_zero"], ["cq"]),
        helper.make_node("DequantizeLinear", ["cq", "y_scale", "y_zero"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, 8, 8])],
        [numpy_helper.from_array(np.asarray(a), name) for name, a in arrays.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _qlinear_weights(model: onnx.ModelProto) -> list[np.ndarray]:
    """The weight codes of each QLinearConv onnxruntime runs."""
    optimized = _onnxruntime_graph(model)
    arrays = _initializers(optimized)
    convs = [n for n in optimized.graph.node if n.op_type == "QLinearConv"]
    return [arrays[node.input[3]] for node in convs]


@pytest.mark.parametrize("activations", ["int8", "uint8"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
def test_qdq_conv_keeps_its_int8_weights_and_runs_as_qlinear_conv(
    rng: np.random.Generator, per_channel: bool, activations: str
) -> None:
    model = _qdq_conv(rng, per_channel, activations)
    written = knopt.save(knopt.optimize(knopt.load(model.SerializeToString()), ilp=False))
    _weights_are_codes(written, {"Conv"})
    assert "Conv" not in _ops(_onnxruntime_graph(written))
    # onnxruntime multiplies the input model's codes, not codes it made of float weights.
    original = _initializers(model)["w_codes"]
    assert [np.array_equal(w, original) for w in _qlinear_weights(written)] == [True]
    x = random_array(rng, (2, 3, 8, 8), F32, low=-4, high=4)
    theirs = _run(model, {"x": x}, optimize=True)
    _assert_within_one_step(_run(written, {"x": x}, optimize=True), theirs, 0.08)


# ---- quantized ResNets ---------------------------------------------------------------------------


def _resnet_qdq(folder: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """resnet_dynamo18 quantized by onnxruntime's quantize_static (QDQ, int8), as benchmarked."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    (base,) = [f for f in fixtures() if f.file == "resnet_dynamo18.onnx"]

    class Calibration(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter([base.feeds(seed=seed) for seed in range(4)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    path = folder / "resnet_qdq.onnx"
    with contextlib.redirect_stderr(io.StringIO()):
        quantize_static(base.path, path, Calibration(), quant_format=QuantFormat.QDQ)
    return path, base.feeds(seed=5)


def _committed(file: str) -> tuple[Path, dict[str, np.ndarray]]:
    import json

    manifest = json.loads((QUANTIZED / "manifest.json").read_text())
    (entry,) = [e for e in manifest["files"] if e["file"] == file]
    fixture = Fixture(entry["file"], entry["model"], entry["variant"], entry["inputs"])
    return QUANTIZED / file, fixture.feeds(seed=5)


def _output_step(model: onnx.ModelProto) -> float:
    """The scale of the DequantizeLinear that makes the (one) output."""
    (output,) = model.graph.output
    (node,) = [n for n in model.graph.node if output.name in n.output]
    assert node.op_type == "DequantizeLinear"
    return float(_initializers(model)[node.input[1]])


@pytest.mark.parametrize("source", ["resnet_qdq", "resnet_qdq_u8s8_channel.onnx"])
def test_quantized_resnet_runs_every_product_as_an_integer_kernel(
    tmp_path: Path, source: str
) -> None:
    path, feeds = _resnet_qdq(tmp_path) if source == "resnet_qdq" else _committed(source)
    original = onnx.load(path)
    written = knopt.save(knopt.optimize(knopt.load(path), ilp=False))
    _weights_are_codes(written, {"Conv", "Gemm", "MatMul"})
    ops = _ops(_onnxruntime_graph(written))
    assert ops["QLinearConv"] == _ops(original)["Conv"] == 6
    assert ops["QGemm"] == 1
    assert not {"Conv", "ConvInteger", "Gemm", "MatMul", "MatMulInteger"} & set(ops)
    theirs = _run(original, feeds, optimize=True)
    _assert_within_one_step(_run(written, feeds, optimize=True), theirs, _output_step(original))


# ---- the pass on written graphs ----------------------------------------------------------------


def _fake_quantized(b: GraphBuilder, x: Value, scale: float, lo: float) -> Value:
    """rules/quantize.egg's float spelling of a quantization dequantized at once."""
    shape = x.shape
    rounded = b.unary(Unary.ROUND, x)
    low = b.scalar(lo, F32, shape)
    codes = b.clamp(b.where(b.unary(Unary.IS_NAN, rounded), low, rounded), lo=lo, hi=lo + 255)
    return b.mul(codes, b.scalar(scale, F32, shape))


def _integer_conv(rng: np.random.Generator) -> Graph:
    """An 8-bit convolution rescaled per channel, plus a bias, then quantized: as optimized."""
    b = GraphBuilder("case")
    x = b.input("x", (2, 4, 6, 6), U8)
    w = b.constant(rng.integers(-127, 128, (5, 4, 3, 3)).astype(np.int8))
    zeros = b.broadcast(b.constant(np.zeros((1, 1, 1, 1), np.int8)), (5, 4, 3, 3))
    product = b.int_conv(
        x, w, b.scalar(131, U8), zeros, strides=(1, 1), pads=((1, 1), (1, 1)), dilations=(1, 1)
    )
    rescale = b.constant(rng.uniform(0.001, 0.003, (1, 5, 1, 1)).astype(np.float32))
    bias = b.constant(rng.uniform(-2, 2, (1, 5, 1, 1)).astype(np.float32))
    shape = product.shape
    y = b.add(b.mul(b.cast(product, F32), b.broadcast(rescale, shape)), b.broadcast(bias, shape))
    b.output(_fake_quantized(b, y, 0.05, -128.0), "y")
    return b.build()


def test_integer_conv_before_a_quantization_is_a_qdq_conv(rng: np.random.Generator) -> None:
    graph = _integer_conv(rng)
    written = save_onnx(graph)
    assert {"ConvInteger", "Cast", "Mul"}.isdisjoint(_ops(written))
    assert _ops(_onnxruntime_graph(written))["QLinearConv"] == 1
    feeds = {"x": random_array(rng, (2, 4, 6, 6), U8, low=0, high=255)}
    expected = run_knopt(graph, feeds)
    for optimize in (False, True):
        _assert_within_one_step(_run(written, feeds, optimize=optimize), expected, 0.05)


def test_float_conv_keeps_float_weights(rng: np.random.Generator) -> None:
    """Weights of whole numbers in a float model: no quantization around, nothing to do."""
    b = GraphBuilder("case")
    x = b.input("x", (2, 3, 5, 5), F32)
    w = b.constant(rng.integers(-5, 6, (4, 3, 3, 3)).astype(np.float32))
    b.output(b.conv(x, w, strides=(1, 1), pads=((0, 0), (0, 0)), dilations=(1, 1), groups=1), "y")
    assert _ops(save_onnx(b.build())) == Counter({"Conv": 1})


def test_int8_codes_read_by_two_ops_are_uint8(rng: np.random.Generator) -> None:
    b = GraphBuilder("case")
    x = b.input("x", (2, 3, 5, 5), F32)
    codes = _fake_quantized(b, b.mul(x, b.scalar(20.0, F32, x.shape)), 0.05, -120.0)
    b.output(b.add(codes, codes), "y")
    b.output(b.unary(Unary.NEG, codes), "z")
    graph = b.build()
    written = save_onnx(graph)
    zero_points = [t for t in written.graph.initializer if t.data_type != TensorProto.FLOAT]
    assert zero_points and {t.data_type for t in zero_points} == {TensorProto.UINT8}
    feeds = {"x": random_array(rng, (2, 3, 5, 5), F32, low=-10, high=10)}
    expected = run_knopt(graph, feeds)
    for mine, theirs in zip(_run(written, feeds, optimize=False), expected, strict=True):
        np.testing.assert_array_equal(mine, theirs)
