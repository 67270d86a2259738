"""com.microsoft QLinear* ops (onnxruntime's QOperator quantization) agree with onnxruntime.

The importers follow onnxruntime's CPU kernels' float32 arithmetic step by step, so integer
outputs are equal, not merely within a quantization step.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import knopt
from knopt.errors import UnsupportedModelError
from knopt.onnx_backend import KnoptBackend
from tests.onnx.ops.node_models import node_model
from tests.oracle import run_onnxruntime

MS = "com.microsoft"


def _assert_matches(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    (ours,) = KnoptBackend.run_model(model, feeds)
    (theirs,) = run_onnxruntime(model, feeds)
    assert ours.shape == theirs.shape
    assert ours.dtype == theirs.dtype
    if ours.dtype.kind == "f":
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)
    else:
        np.testing.assert_array_equal(ours, theirs)


def _quantized(rng: np.random.Generator, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def _scale(value: float) -> np.ndarray:
    return np.array(value, np.float32)


@pytest.mark.parametrize("op_type", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_binary_ops_match_onnxruntime(
    rng: np.random.Generator, op_type: str, dtype: type
) -> None:
    a = _quantized(rng, (2, 3, 4, 5), dtype)
    c = _quantized(rng, (3, 1, 5), dtype)  # broadcasts
    model = node_model(
        op_type,
        {"a": a},
        ["y"],
        opset=17,
        domain=MS,
        constants={
            "a_scale": _scale(0.03),
            "a_zero": np.array(7, dtype),
            "c": c,
            "c_scale": _scale(0.05),
            "c_zero": np.array(-3 if dtype is np.int8 else 130, dtype),
            "y_scale": _scale(0.04 if op_type == "QLinearAdd" else 0.5),
            "y_zero": np.array(5, dtype),
        },
    )
    _assert_matches(model, {"a": a})


@pytest.mark.parametrize("op_type", ["QLinearSigmoid", "QLinearLeakyRelu"])
def test_qlinear_activations_match_onnxruntime(rng: np.random.Generator, op_type: str) -> None:
    x = _quantized(rng, (2, 3, 8), np.uint8)
    attributes = {"alpha": 0.2} if op_type == "QLinearLeakyRelu" else {}
    constants = {
        "x_scale": _scale(0.05),
        "x_zero": np.array(120, np.uint8),
        "y_scale": _scale(0.01 if op_type == "QLinearSigmoid" else 0.04),
        "y_zero": np.array(3, np.uint8),
    }
    model = node_model(
        op_type, {"x": x}, ["y"], opset=17, domain=MS, constants=constants, **attributes
    )
    _assert_matches(model, {"x": x})


def test_qlinear_global_average_pool_matches_onnxruntime(rng: np.random.Generator) -> None:
    x = _quantized(rng, (2, 5, 6, 7), np.uint8)
    constants = {
        "x_scale": _scale(0.07),
        "x_zero": np.array(100, np.uint8),
        "y_scale": _scale(0.02),
        "y_zero": np.array(110, np.uint8),
    }
    model = node_model(
        "QLinearGlobalAveragePool", {"x": x}, ["y"], opset=17, domain=MS, constants=constants
    )
    _assert_matches(model, {"x": x})


@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_qlinear_average_pool_matches_onnxruntime(
    rng: np.random.Generator, count_include_pad: int
) -> None:
    x = _quantized(rng, (1, 3, 7, 6), np.uint8)
    constants = {
        "x_scale": _scale(0.07),
        "x_zero": np.array(100, np.uint8),
        "y_scale": _scale(0.05),
        "y_zero": np.array(90, np.uint8),
    }
    model = node_model(
        "QLinearAveragePool",
        {"x": x},
        ["y"],
        opset=17,
        domain=MS,
        constants=constants,
        kernel_shape=[3, 3],
        strides=[2, 1],
        pads=[1, 1, 1, 1],
        ceil_mode=1,
        count_include_pad=count_include_pad,
    )
    _assert_matches(model, {"x": x})


def test_qlinear_concat_requantizes_each_input(rng: np.random.Generator) -> None:
    a = _quantized(rng, (2, 3, 4), np.uint8)
    c = _quantized(rng, (2, 5, 4), np.uint8)
    model = node_model(
        "QLinearConcat",
        {"y_scale": _scale(0.05)},
        ["y"],
        opset=17,
        domain=MS,
        constants={
            "y_zero": np.array(128, np.uint8),
            "a": a,
            "a_scale": _scale(0.05),
            "a_zero": np.array(128, np.uint8),
            "c": c,
            "c_scale": _scale(0.11),
            "c_zero": np.array(60, np.uint8),
        },
        axis=-2,
    )
    _assert_matches(model, {"y_scale": _scale(0.05)})


@pytest.mark.parametrize("quantized_output", [False, True])
@pytest.mark.parametrize("per_column", [False, True])
def test_qgemm_matches_onnxruntime(
    rng: np.random.Generator, quantized_output: bool, per_column: bool
) -> None:
    a = _quantized(rng, (3, 16), np.uint8)
    columns = 5 if per_column else 1
    constants = {
        "a_scale": _scale(0.02),
        "a_zero": np.array(120, np.uint8),
        "w": _quantized(rng, (5, 16), np.int8),
        "w_scale": rng.uniform(0.01, 0.03, columns).astype(np.float32),
        "w_zero": np.zeros(columns, np.int8),
        "c": rng.integers(-500, 500, 5).astype(np.int32),
    }
    if quantized_output:
        constants |= {"y_scale": _scale(0.3), "y_zero": np.array(128, np.uint8)}
    model = node_model(
        "QGemm", {"a": a}, ["y"], opset=17, domain=MS, constants=constants, transB=1, alpha=0.5
    )
    _assert_matches(model, {"a": a})


@pytest.mark.parametrize(("opset", "axis"), [(13, -1), (13, 1), (12, 1)])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_softmax_matches_onnxruntime(
    rng: np.random.Generator, opset: int, axis: int, dtype: type
) -> None:
    x = _quantized(rng, (2, 4, 6), dtype)
    signed = dtype is np.int8
    constants = {
        "x_scale": _scale(0.08),
        "x_zero": np.array(0 if signed else 128, dtype),
        "y_scale": _scale(1 / 256),
        "y_zero": np.array(-128 if signed else 0, dtype),
    }
    model = node_model(
        "QLinearSoftmax",
        {"x": x},
        ["y"],
        opset=17,
        domain=MS,
        constants=constants,
        axis=axis,
    )
    # The attribute `opset` (the Softmax version it replaced) clashes with node_model's own.
    model.graph.node[0].attribute.append(helper.make_attribute("opset", opset))
    _assert_matches(model, {"x": x})


def test_channels_last_pool_is_refused_by_name() -> None:
    x = np.zeros((1, 4, 4, 3), np.uint8)
    constants = {
        "x_scale": _scale(0.1),
        "x_zero": np.array(0, np.uint8),
        "y_scale": _scale(0.1),
        "y_zero": np.array(0, np.uint8),
    }
    model = node_model(
        "QLinearGlobalAveragePool",
        {"x": x},
        ["y"],
        opset=17,
        domain=MS,
        constants=constants,
        channels_last=1,
    )
    with pytest.raises(UnsupportedModelError, match=r"QLinearGlobalAveragePool.*channels_last"):
        knopt.load(model.SerializeToString())


def test_qlinear_add_with_infinite_scales_gives_the_lowest_value(rng: np.random.Generator) -> None:
    # quantize_static calibrates a -inf attention mask to an infinite scale; the sum is NaN,
    # which onnxruntime's x86 kernel turns into the lowest value.
    a = _quantized(rng, (2, 6), np.int8)
    model = node_model(
        "QLinearAdd",
        {"a": a},
        ["y"],
        opset=17,
        domain=MS,
        constants={
            "a_scale": _scale(0.02),
            "a_zero": np.array(-5, np.int8),
            "c": _quantized(rng, (2, 6), np.int8),
            "c_scale": _scale(np.inf),
            "c_zero": np.array(0, np.int8),
            "y_scale": _scale(np.inf),
            "y_zero": np.array(0, np.int8),
        },
    )
    _assert_matches(model, {"a": a})
