"""The quantized products' CPU kernels against ONNX's integer ops and onnxruntime's MatMulNBits.

IntMatMul and IntConv are exact int32 arithmetic: they must equal MatMulInteger and
ConvInteger bit for bit (onnxruntime, and onnx's reference evaluator for the padding), over
the whole range of both 8-bit types. Int4MatMul must equal the imported MatMulNBits, whose
unpacking it replaces.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper

import knopt
from knopt.cpu.kernels import KERNELS
from knopt.ir import op as ops
from knopt.ir.dtype import DType
from tests.cuda.quant import NBitsWeight, random_nbits

EIGHT_BIT = (np.uint8, np.int8)


def _codes(rng: np.random.Generator, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(int(info.min), int(info.max) + 1, shape).astype(dtype)


def _one_node(op_type: str, inputs: list[np.ndarray], engine: str, **attrs: Any) -> np.ndarray:
    names = [f"in{i}" for i in range(len(inputs))]
    infos = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for n, a in zip(names, inputs, strict=True)
    ]
    node = helper.make_node(op_type, names, ["out"], **attrs)
    graph = helper.make_graph([node], "one", infos, [onnx.ValueInfoProto(name="out")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    feeds = dict(zip(names, inputs, strict=True))
    if engine == "reference":
        from onnx.reference import ReferenceEvaluator

        return np.asarray(ReferenceEvaluator(model).run(None, feeds)[0])  # type: ignore[index]
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, feeds)[0])


@pytest.mark.parametrize("a_type", EIGHT_BIT)
@pytest.mark.parametrize("b_type", EIGHT_BIT)
def test_int_matmul_equals_matmul_integer(
    rng: np.random.Generator, a_type: type, b_type: type
) -> None:
    a, b = _codes(rng, (2, 5, 64), a_type), _codes(rng, (64, 7), b_type)
    a[0, 0, :] = np.iinfo(a_type).min  # the largest products
    b[:, 0] = np.iinfo(b_type).min
    a_zero: np.ndarray = np.array(rng.integers(0, 20), dtype=a_type)
    b_zero = _codes(rng, (7,), b_type)  # per output column
    expected = _one_node("MatMulInteger", [a, b, a_zero, b_zero], "onnxruntime")
    batched = np.broadcast_to(b, (2, 64, 7))  # one weight for the batch, as the importer reads it
    za = np.broadcast_to(a_zero, a.shape)
    zb = np.broadcast_to(b_zero, batched.shape)
    ours = KERNELS[ops.IntMatMul](ops.IntMatMul(), a, batched, za, zb)
    assert ours.dtype == np.int32
    np.testing.assert_array_equal(ours, expected)


@pytest.mark.parametrize("x_type", EIGHT_BIT)
@pytest.mark.parametrize(
    ("strides", "pads", "dilations", "groups"),
    [((1, 1), ((1, 1), (1, 1)), (1, 1), 1), ((2, 1), ((0, 2), (1, 0)), (1, 2), 2)],
)
def test_int_conv_pads_with_the_zero_point_as_conv_integer(
    rng: np.random.Generator,
    x_type: type,
    strides: tuple[int, int],
    pads: tuple[tuple[int, int], ...],
    dilations: tuple[int, int],
    groups: int,
) -> None:
    x, w = _codes(rng, (2, 4, 7, 6), x_type), _codes(rng, (6, 4 // groups, 3, 2), np.int8)
    x_zero: np.ndarray = np.array(rng.integers(1, 20), dtype=x_type)
    w_zero = _codes(rng, (6,), np.int8)
    onnx_pads = [p[0] for p in pads] + [p[1] for p in pads]
    expected = _one_node(
        "ConvInteger",
        [x, w, x_zero, w_zero],
        "reference",
        strides=list(strides),
        pads=onnx_pads,
        dilations=list(dilations),
        group=groups,
    )
    op = ops.IntConv(strides, pads, dilations, groups)
    zw = np.broadcast_to(w_zero.reshape(6, 1, 1, 1), w.shape)
    ours = KERNELS[ops.IntConv](op, x, w, np.broadcast_to(x_zero, x.shape), zw)
    np.testing.assert_array_equal(ours, expected)


def _nbits_model(weight: NBitsWeight, k: int, block: int, with_zeros: bool) -> bytes:
    """A one-node com.microsoft.MatMulNBits model over A [3, k]."""
    n = weight.n
    inits = [
        onnx.numpy_helper.from_array(weight.b, "b"),
        onnx.numpy_helper.from_array(weight.scales.astype(np.float32), "scales"),
    ]
    inputs = ["a", "b", "scales"]
    if with_zeros:
        assert weight.zeros is not None
        inits.append(onnx.numpy_helper.from_array(weight.zeros, "zeros"))
        inputs.append("zeros")
    node = helper.make_node(
        "MatMulNBits", inputs, ["y"], domain="com.microsoft", K=k, N=n, bits=4, block_size=block
    )
    graph = helper.make_graph(
        [node],
        "nbits",
        [helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [3, k])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, n])],
        inits,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


@pytest.mark.parametrize(("k", "block", "with_zeros"), [(64, 16, True), (40, 32, False)])
def test_int4_matmul_equals_the_imported_matmul_nbits(
    rng: np.random.Generator, k: int, block: int, with_zeros: bool
) -> None:
    weight = random_nbits(rng, 6, k, block, DType.F16, with_zeros)
    a = rng.standard_normal((3, k)).astype(np.float32)
    imported = knopt.compile(_nbits_model(weight, k, block, with_zeros)).run(None, {"a": a})[0]
    blocks = -(-k // block)
    zeros = (
        weight.zeros if weight.zeros is not None else np.full((6, -(-blocks // 2)), 0x88, np.uint8)
    )
    op = ops.Int4MatMul(block)
    ours = KERNELS[ops.Int4MatMul](op, a, weight.b, weight.scales.astype(np.float32), zeros)
    np.testing.assert_allclose(ours, imported, rtol=1e-5, atol=1e-6)
    expected = a.astype(np.float64) @ weight.dequantized().T
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-4)
