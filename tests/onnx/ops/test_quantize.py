"""Quantization import: QuantizeLinear, DequantizeLinear and QLinear ops agree with onnxruntime."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from knopt.onnx_backend import KnoptBackend
from tests.onnx.ops.node_models import assert_matches, node_model


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16])
def test_per_axis_quantize_rounds_half_to_even_and_saturates(
    rng: np.random.Generator, dtype: type
) -> None:
    x = rng.uniform(-300, 300, (2, 3, 4)).astype(np.float32)
    x[0, 0, :2] = [0.5, 1.5]  # ties go to the even neighbour
    constants: dict[str, np.ndarray] = {
        "scale": np.array([0.5, 1.0, 2.0], np.float32),
        "zero": np.array([1, 2, 3], dtype),
    }
    model = node_model("QuantizeLinear", {"x": x}, ["y"], opset=21, constants=constants, axis=1)
    assert_matches(model, {"x": x}, rtol=0, atol=0)


def test_blocked_dequantize_matches_onnxruntime(rng: np.random.Generator) -> None:
    x = rng.integers(-128, 128, (2, 6)).astype(np.int8)
    constants: dict[str, np.ndarray] = {
        "scale": rng.uniform(0.1, 1, (2, 3)).astype(np.float32),
        "zero": rng.integers(-5, 5, (2, 3)).astype(np.int8),
    }
    model = node_model(
        "DequantizeLinear", {"x": x}, ["y"], opset=21, constants=constants, axis=1, block_size=2
    )
    assert_matches(model, {"x": x})


def test_qlinear_conv_with_per_channel_weights_matches_onnxruntime(
    rng: np.random.Generator,
) -> None:
    x = rng.integers(0, 256, (1, 2, 5, 5)).astype(np.uint8)
    constants: dict[str, np.ndarray] = {
        "x_scale": np.array(0.05, np.float32),
        "x_zero": np.array(128, np.uint8),
        "w": rng.integers(-127, 128, (3, 2, 3, 3)).astype(np.int8),
        "w_scale": rng.uniform(0.01, 0.05, 3).astype(np.float32),
        "w_zero": np.zeros(3, np.int8),
        "y_scale": np.array(0.2, np.float32),
        "y_zero": np.array(10, np.uint8),
        "bias": rng.integers(-100, 100, 3).astype(np.int32),
    }
    model = node_model("QLinearConv", {"x": x}, ["y"], opset=10, constants=constants, pads=[1] * 4)
    assert_matches(model, {"x": x}, rtol=0, atol=1)


def test_dynamic_quantize_linear_matches_onnxruntime(rng: np.random.Generator) -> None:
    x = rng.uniform(-2, 5, (3, 4)).astype(np.float32)
    model = node_model("DynamicQuantizeLinear", {"x": x}, ["y", "scale", "zero"], opset=11)
    assert_matches(model, {"x": x})


@pytest.mark.parametrize("zero", [np.uint8(128), np.int8(-100), np.int8(100), np.uint16(1000)])
def test_quantize_saturates_infinities_and_huge_values(rng: np.random.Generator, zero: Any) -> None:
    # A -inf attention mask quantized by a QDQ model: values beyond int32 must saturate, not
    # wrap through an integer conversion; NaN gives the lowest value, as onnxruntime does.
    x = np.concatenate(
        [
            np.array([np.inf, -np.inf, np.nan, 1e10, -1e10, 2.5, -2.5], np.float32),
            rng.uniform(-100, 100, 9).astype(np.float32),
        ]
    )
    constants = {"scale": np.array(0.5, np.float32), "zero": np.array(zero)}
    model = node_model("QuantizeLinear", {"x": x}, ["y"], opset=21, constants=constants)
    assert_matches(model, {"x": x}, rtol=0, atol=0)


def _int4_matmul_model(
    rng: np.random.Generator, dtype: Any, k: int, n: int, block: int, zero: bool
) -> onnx.ModelProto:
    """`x @ DequantizeLinear(w)` with int4/uint4 w blocked along K, as `MatMulNBitsQuantizer`
    writes in its QDQ format (axis 0, scales [k_blocks, N])."""
    info = ml_dtypes.iinfo(dtype)
    blocks = -(-k // block)
    tensors = [
        helper.make_tensor(
            "w",
            helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
            [k, n],
            rng.integers(info.min, info.max + 1, (k, n)).astype(dtype).astype(np.int8).ravel(),
        ),
        numpy_helper.from_array(rng.uniform(0.01, 0.1, (blocks, n)).astype(np.float32), "scale"),
    ]
    if zero:
        tensors.append(
            helper.make_tensor(
                "zero",
                helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                [blocks, n],
                rng.integers(info.min, info.max + 1, (blocks, n)).astype(np.int8).ravel(),
            )
        )
    dq = helper.make_node(
        "DequantizeLinear",
        ["w", "scale", *(["zero"] if zero else [])],
        ["wf"],
        axis=0,
        block_size=block,
    )
    mm = helper.make_node("MatMul", ["x", "wf"], ["y"])
    graph = helper.make_graph(
        [dq, mm],
        "int4_matmul",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3, k])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3, n])],
        tensors,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


@pytest.mark.parametrize("dtype", [ml_dtypes.int4, ml_dtypes.uint4])
@pytest.mark.parametrize(("k", "n", "block", "zero"), [(64, 8, 16, True), (200, 48, 32, False)])
def test_blocked_int4_dequantize_before_matmul_matches_onnxruntime(
    rng: np.random.Generator, dtype: Any, k: int, n: int, block: int, zero: bool
) -> None:
    # The second size has more elements than import-time folding evaluates, and a short last
    # block: the dequantization stays in the graph.
    model = _int4_matmul_model(rng, dtype, k, n, block, zero)
    x = rng.standard_normal((2, 3, k)).astype(np.float32)
    assert_matches(model, {"x": x}, oracle="reference", rtol=1e-5, atol=1e-5)
    # onnxruntime fuses DequantizeLinear + MatMul into MatMulNBits at accuracy level 4 by
    # default (int8 activations on this CPU); at level 0 it computes what the model says.
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    (ours,) = KnoptBackend.run_model(model, {"x": x})
    np.testing.assert_allclose(ours, session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)
