"""Element types: every DType is an ONNX TensorProto code with facts, narrow ones compute wider."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx

from knopt.cpu.executor import run_graph
from knopt.ir.builder import GraphBuilder
from knopt.ir.dtype import COMPUTE_TYPE, DType
from knopt.ir.op import Binary


def test_every_dtype_is_the_onnx_code_of_the_same_numpy_type() -> None:
    for dtype in DType:
        assert onnx.helper.tensor_dtype_to_np_dtype(int(dtype)) == dtype.numpy


def test_ml_dtypes_types_have_a_wider_compute_type() -> None:
    narrow = {d for d in DType if d.numpy.type.__module__.startswith("ml_dtypes")}
    assert narrow == set(COMPUTE_TYPE)
    assert DType.BF16 in narrow


def test_float8_arithmetic_runs_in_float32_and_rounds_back() -> None:
    builder = GraphBuilder("f8")
    a = builder.input("a", (3,), DType.F8E4M3FN)
    b = builder.input("b", (3,), DType.F8E4M3FN)
    builder.output(builder.binary(Binary.ADD, a, b), "y")
    left = np.array([1.0, 2.5, -3.0], ml_dtypes.float8_e4m3fn)
    right = np.array([0.125, 0.25, 1.0], ml_dtypes.float8_e4m3fn)
    (y,) = run_graph(builder.build(), {"a": left, "b": right})
    assert y.dtype == ml_dtypes.float8_e4m3fn
    expected = (left.astype(np.float32) + right.astype(np.float32)).astype(y.dtype)
    np.testing.assert_array_equal(y.astype(np.float32), expected.astype(np.float32))


def test_int4_values_round_trip_through_int8_arithmetic() -> None:
    builder = GraphBuilder("i4")
    a = builder.input("a", (4,), DType.I4)
    builder.output(
        builder.binary(Binary.MUL, a, builder.constant(np.array(1, ml_dtypes.int4))), "y"
    )
    values = np.array([-8, -1, 3, 7], ml_dtypes.int4)
    (y,) = run_graph(builder.build(), {"a": values})
    np.testing.assert_array_equal(y.astype(np.int8), values.astype(np.int8))
