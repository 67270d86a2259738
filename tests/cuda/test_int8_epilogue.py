"""The int8 GEMM epilogue and prologue (codegen/int8_*.cu): they compile without a GPU, and on one
they equal numpy bit for bit (integer steps exact, each float step rounded once, in order)."""

from __future__ import annotations

import numpy as np
import pytest

from knopt.cuda.int8_epilogue import (
    PROLOGUE,
    EpilogueArgs,
    Int8Epilogue,
    column_offsets,
    launch_prologue,
    prologue_source,
)
from knopt.errors import CodegenError
from knopt.ir.dtype import DType
from tests.cuda.programs import loaded_nvrtc
from tests.cuda.quant import Device

EPILOGUES = [
    Int8Epilogue(DType.I8),
    Int8Epilogue(DType.U8),
    Int8Epilogue(DType.F16, "relu"),
    Int8Epilogue(DType.BF16),
    Int8Epilogue(DType.F32),
]


def test_int8_epilogues_and_prologue_compile_for_sm_90(tmp_path, monkeypatch) -> None:
    nvrtc = loaded_nvrtc()
    monkeypatch.setenv("KNOPT_CACHE_DIR", str(tmp_path))
    source = "\n".join([prologue_source(), *(e.source() for e in EPILOGUES)])
    cubin = nvrtc.compile_cubin(source, "sm_90")
    for name in [PROLOGUE, *(e.name for e in EPILOGUES)]:
        assert name.encode() in cubin


def test_requantizing_epilogues_take_no_activation() -> None:
    with pytest.raises(CodegenError, match="clamp by qmin"):
        Int8Epilogue(DType.U8, "relu")
    with pytest.raises(CodegenError, match="cannot write"):
        Int8Epilogue(DType.I32)


def test_column_offsets_turn_the_int8_product_into_the_zero_pointed_one(
    rng: np.random.Generator,
) -> None:
    a = rng.integers(-128, 128, (5, 12)).astype(np.int64)
    w = rng.integers(-128, 128, (7, 12)).astype(np.int64)
    a_zero, w_zero = 3, rng.integers(-5, 5, 7)
    expected = (a - a_zero) @ (w - w_zero[:, None]).T
    got = a @ w.T + column_offsets(w, a_zero, w_zero) - w_zero * a.sum(axis=1, keepdims=True)
    np.testing.assert_array_equal(got, expected)


@pytest.fixture(scope="module")
def device(gpu_available: bool) -> Device:
    if not gpu_available:
        pytest.skip("no usable NVIDIA GPU")
    from knopt.cuda.driver import Gpu

    return Device(Gpu())


def _kernels(device: Device, epilogue: Int8Epilogue) -> dict:
    from knopt.cuda import nvrtc

    source = prologue_source() + "\n" + epilogue.source()
    cubin = nvrtc.compile_cubin(source, device.gpu.arch)
    return device.gpu.load(cubin, [PROLOGUE, epilogue.name])


@pytest.mark.cuda
@pytest.mark.parametrize("out", [DType.U8, DType.I8])
def test_requantize_with_zero_points_and_channel_multipliers(
    device: Device, rng: np.random.Generator, out: DType
) -> None:
    m, n = 33, 70
    acc = rng.integers(-(2**20), 2**20, (m, n)).astype(np.int32)
    acc[0, :4] = [2**30, -(2**30), 0, 1]  # saturate both ways
    row_sum = rng.integers(-3000, 3000, m).astype(np.int32)
    w_zero = rng.integers(-20, 20, n).astype(np.int32)
    col_offset = rng.integers(-5000, 5000, n).astype(np.int32)
    multiplier = rng.uniform(1e-4, 3e-3, n).astype(np.float32)
    zero_point = 131 if out is DType.U8 else -7
    multiplier[1] = np.float32(0.5)  # every odd sum is a tie: half to even
    epilogue = Int8Epilogue(out)
    kernels = _kernels(device, epilogue)
    y = device.empty(m * n)
    args = EpilogueArgs(
        acc=device.put(acc),
        y=y,
        col_offset=device.put(col_offset),
        row_sum=device.put(row_sum),
        w_zero=device.put(w_zero),
        col_scale=device.put(multiplier),
        zero_point=zero_point,
    )
    epilogue.launch(device.gpu, kernels[epilogue.name], args, (m, n), device.sm_count)
    total = acc + col_offset - w_zero * row_sum[:, None]
    info = np.iinfo(out.numpy)
    scaled = total.astype(np.float32) * np.float32(1.0) * multiplier
    rounded = np.clip(np.rint(scaled), info.min - zero_point, info.max - zero_point)
    expected = (rounded + zero_point).astype(out.numpy)
    np.testing.assert_array_equal(device.get(y, (m, n), out.numpy), expected)


@pytest.mark.cuda
@pytest.mark.parametrize("epilogue", EPILOGUES[2:], ids=lambda e: e.name)
def test_dequantize_with_row_and_column_scales_bias_and_activation(
    device: Device, rng: np.random.Generator, epilogue: Int8Epilogue
) -> None:
    import ml_dtypes

    m, n = 19, 36
    acc = rng.integers(-(2**22), 2**22, (m, n)).astype(np.int32)
    row_scale = rng.uniform(1e-3, 1e-2, m).astype(np.float32)
    col_scale = rng.uniform(1e-3, 1e-2, n).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    numpy_out = {DType.F16: np.float16, DType.BF16: ml_dtypes.bfloat16, DType.F32: np.float32}
    dtype = np.dtype(numpy_out[epilogue.out])
    kernels = _kernels(device, epilogue)
    y = device.empty(m * n * dtype.itemsize)
    scale = np.float32(0.75)
    args = EpilogueArgs(
        acc=device.put(acc),
        y=y,
        row_scale=device.put(row_scale),
        col_scale=device.put(col_scale),
        scale=float(scale),
        bias=device.put(bias),
    )
    epilogue.launch(device.gpu, kernels[epilogue.name], args, (m, n), device.sm_count)
    f = acc.astype(np.float32) * scale * row_scale[:, None] * col_scale + bias
    if epilogue.activation == "relu":
        f = np.maximum(f, np.float32(0))
    np.testing.assert_array_equal(device.get(y, (m, n), dtype), f.astype(dtype))


@pytest.mark.cuda
@pytest.mark.parametrize("flip", [True, False])
def test_prologue_shifts_uint8_to_int8_and_sums_rows(
    device: Device, rng: np.random.Generator, flip: bool
) -> None:
    m, k = 9, 1000
    x = rng.integers(0, 256, (m, k)).astype(np.uint8)
    kernels = _kernels(device, Int8Epilogue(DType.I8))
    out, rowsum = device.empty(m * k), device.empty(m * 4)
    launch_prologue(device.gpu, kernels[PROLOGUE], device.put(x), out, rowsum, m, k, flip)
    expected = (x.astype(np.int16) - 128 if flip else x.view(np.int8)).astype(np.int8)
    np.testing.assert_array_equal(device.get(out, (m, k), np.int8), expected)
    np.testing.assert_array_equal(
        device.get(rowsum, (m,), np.int32), expected.astype(np.int32).sum(axis=1)
    )
