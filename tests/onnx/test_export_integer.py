"""Dynamically quantized products written back as DynamicQuantizeLinear and MatMulInteger."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import knopt
from knopt.onnx.export import save_onnx
from tests.onnx.test_export_fused import ops_of
from tests.oracle import assert_same, run_onnxruntime


def _dynamically_quantized(rng: np.random.Generator) -> onnx.ModelProto:
    """`x [batch, 8] @ w [8, 6]`: w int8, x quantized at run time, as quantize_dynamic writes."""
    weights = rng.integers(-127, 128, (8, 6)).astype(np.int8)
    initializers = [
        numpy_helper.from_array(weights, "w"),
        numpy_helper.from_array(np.array(0.02, np.float32), "w_scale"),
        numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "bias"),
    ]
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "q_scale", "q_zero"]),
        helper.make_node("MatMulInteger", ["q", "w", "q_zero"], ["product"]),
        helper.make_node("Cast", ["product"], ["wide"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["q_scale", "w_scale"], ["scale"]),
        helper.make_node("Mul", ["wide", "scale"], ["scaled"]),
        helper.make_node("Add", ["scaled", "bias"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "dynamic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 6])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_dynamic_quantization_and_integer_product_are_their_ops(rng: np.random.Generator) -> None:
    model = _dynamically_quantized(rng)
    optimized = knopt.optimize(knopt.load(model.SerializeToString())).graph
    written = save_onnx(optimized)
    found = ops_of(written)
    assert found["DynamicQuantizeLinear"] == 1
    assert found["MatMulInteger"] == 1
    assert sum(found.values()) <= len(model.graph.node)
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal((4, 8)).astype(np.float32)
        assert_same(run_onnxruntime(written, {"x": x}), run_onnxruntime(model, {"x": x}))


def test_weights_beyond_int8_stay_an_int32_product(rng: np.random.Generator) -> None:
    from knopt.ir import GraphBuilder
    from knopt.ir.dtype import DType

    b = GraphBuilder("wide")
    x = b.input("x", (3, 4), DType.U8)
    centered = b.sub(b.cast(x, DType.I32), b.cast(b.constant(np.uint8(7)), DType.I32))
    b.output(b.matmul(centered, b.constant(np.full((4, 2), 300, np.int32))), "y")
    graph = b.build()
    written = save_onnx(graph)
    assert "MatMulInteger" not in ops_of(written)
    assert ops_of(written)["MatMul"] == 1


def test_dynamically_quantized_resnet_keeps_one_dynamic_quantization_per_conv() -> None:
    """resnet_dynamic: one DynamicQuantizeLinear per ConvInteger, as in the input model.

    The optimizer leaves twins of each Relu (one read for its range, one divided by the scale)
    and views a reduction as a scalar before its bound.
    """
    import json
    from pathlib import Path

    from tests.models import Fixture

    folder = Path(__file__).parents[1] / "fixtures" / "quantized"
    manifest = json.loads((folder / "manifest.json").read_text())
    (entry,) = [e for e in manifest["files"] if e["file"] == "resnet_dynamic.onnx"]
    original = onnx.load(folder / entry["file"])
    written = save_onnx(knopt.optimize(knopt.load(folder / entry["file"]), ilp=False).graph)
    assert ops_of(written)["DynamicQuantizeLinear"] == ops_of(original)["DynamicQuantizeLinear"]
    assert len(written.graph.node) <= len(original.graph.node)
    fixture = Fixture(entry["file"], entry["model"], entry["variant"], entry["inputs"])
    feeds = fixture.feeds(seed=6)
    assert_same(run_onnxruntime(written, feeds), run_onnxruntime(original, feeds))
