"""int8 GEMMs on cuBLASLt's IMMA kernels (knopt/cuda/intgemm.py) equal numpy's integer products.

The last test runs a whole quantized MatMul as a model would: uint8 activations and uint8
weights with per-channel zero points, requantized to uint8 with a per-channel multiplier, and
compares it bit for bit with the integer reference that onnxruntime's kernels follow.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from knopt.errors import CodegenError
from knopt.ir.dtype import DType
from tests.cuda.quant import Device

intgemm = pytest.importorskip("knopt.cuda.intgemm", reason="needs nvmath-python")
FLOAT_OUTPUTS = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}


def test_sizes_imma_cannot_take_are_refused() -> None:
    with pytest.raises(CodegenError, match="multiples of 4"):
        intgemm.check_sizes(8, 30, 64)
    with pytest.raises(CodegenError, match="multiples of 4"):
        intgemm.check_sizes(8, 32, 66)


@pytest.fixture(scope="module")
def device(gpu_available: bool) -> Device:
    if not gpu_available:
        pytest.skip("no usable NVIDIA GPU")
    from knopt.cuda.driver import Gpu

    return Device(Gpu())


@pytest.fixture(scope="module")
def handle(device: Device) -> int:
    from knopt.cuda.blas import Blas

    return Blas().handle


def _gemm(device: Device, handle: int, a: np.ndarray, w: np.ndarray, output, alpha=None):
    (m, k), n = a.shape, w.shape[0]
    plan = intgemm.IntGemmPlan(handle, m, n, k, output)
    d = device.empty(plan.d_bytes)
    plan.enqueue(
        device.put(a),
        device.put(w),
        d,
        device.empty(plan.workspace),
        device.gpu.stream_handle,
        alpha=device.put(alpha),
    )
    return d, plan


@pytest.mark.cuda
@pytest.mark.parametrize(
    ("m", "n", "k"), [(1, 64, 64), (7, 100, 36), (128, 256, 512), (333, 1024, 4096)]
)
def test_int8_gemm_accumulates_exactly_in_int32(
    device: Device, handle: int, m: int, n: int, k: int
) -> None:
    rng = np.random.default_rng(m + n + k)
    a = rng.integers(-128, 128, (m, k)).astype(np.int8)
    w = rng.integers(-128, 128, (n, k)).astype(np.int8)
    a[0, :] = -128  # the extreme products
    w[0, :] = -128
    d, _ = _gemm(device, handle, a, w, intgemm.GemmOutput.I32)
    expected = a.astype(np.int64) @ w.astype(np.int64).T
    np.testing.assert_array_equal(device.get(d, (m, n), np.int32), expected)


@pytest.mark.cuda
def test_scaled_outputs_cublaslt_offers_match_numpy(device: Device, handle: int) -> None:
    m, n, k = 96, 128, 256
    supported = intgemm.supported_outputs(handle, m, n, k)
    print("cuBLASLt IMMA outputs:", [o.value for o in supported])  # shown with -s
    assert intgemm.GemmOutput.I32 in supported
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (m, k)).astype(np.int8)
    w = rng.integers(-128, 128, (n, k)).astype(np.int8)
    alpha = rng.uniform(1e-4, 2e-3, n).astype(np.float32)
    acc = (a.astype(np.int64) @ w.astype(np.int64).T).astype(np.float32)
    for output in supported:
        if output is intgemm.GemmOutput.I32:
            continue
        d, _ = _gemm(device, handle, a, w, output, alpha)
        if output is intgemm.GemmOutput.I8:
            got = device.get(d, (m, n), np.int8)
            expected = np.clip(np.rint(acc * alpha), -128, 127).astype(np.int8)
            wrong = int((got != expected).sum())
            assert wrong == 0, f"{wrong} of {got.size} int8 outputs differ from rint(alpha * acc)"
        else:
            dtype = FLOAT_OUTPUTS[output.value]
            got = device.get(d, (m, n), dtype).astype(np.float32)
            exact = dtype == np.float32
            np.testing.assert_allclose(got, acc * alpha, rtol=1e-6 if exact else 1e-2)


@pytest.mark.cuda
def test_quantized_matmul_with_zero_points_is_bit_exact(device: Device, handle: int) -> None:
    from knopt.cuda import nvrtc
    from knopt.cuda.int8_epilogue import (
        PROLOGUE,
        EpilogueArgs,
        Int8Epilogue,
        column_offsets,
        launch_prologue,
        prologue_source,
    )

    m, n, k = 50, 96, 320
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, (m, k)).astype(np.uint8)
    w = rng.integers(0, 256, (n, k)).astype(np.uint8)
    a_zero, w_zero, y_zero = 131, rng.integers(100, 156, n), 120
    a_scale, w_scale, y_scale = np.float32(0.02), rng.uniform(0.001, 0.01, n), np.float32(0.3)
    multiplier = (a_scale * w_scale.astype(np.float32) / y_scale).astype(np.float32)

    # int8 operands: a - 128 (on the device), w - 128 (once, on the host); zero points follow.
    w8 = (w.astype(np.int16) - 128).astype(np.int8)
    za, zw = a_zero - 128, (w_zero - 128).astype(np.int32)
    epilogue = Int8Epilogue(DType.U8)
    cubin = nvrtc.compile_cubin(prologue_source() + "\n" + epilogue.source(), device.gpu.arch)
    kernels = device.gpu.load(cubin, [PROLOGUE, epilogue.name])
    a8, rowsum = device.empty(m * k), device.empty(m * 4)
    launch_prologue(device.gpu, kernels[PROLOGUE], device.put(a), a8, rowsum, m, k, flip=True)
    plan = intgemm.IntGemmPlan(handle, m, n, k, intgemm.GemmOutput.I32)
    acc = device.empty(plan.d_bytes)
    plan.enqueue(a8, device.put(w8), acc, device.empty(plan.workspace), device.gpu.stream_handle)
    y = device.empty(m * n)
    args = EpilogueArgs(
        acc=acc,
        y=y,
        col_offset=device.put(column_offsets(w8, za, zw)),
        row_sum=rowsum,
        w_zero=device.put(zw),
        col_scale=device.put(multiplier),
        zero_point=y_zero,
    )
    epilogue.launch(device.gpu, kernels[epilogue.name], args, (m, n), device.sm_count)

    exact = (a.astype(np.int64) - a_zero) @ (w.astype(np.int64) - w_zero[:, None]).T
    scaled = exact.astype(np.float32) * multiplier
    expected = (np.clip(np.rint(scaled), -y_zero, 255 - y_zero) + y_zero).astype(np.uint8)
    np.testing.assert_array_equal(device.get(y, (m, n), np.uint8), expected)
