"""W4A16 kernels (codegen/w4a16*.cu): they compile without a GPU, and on one they match numpy.

On the GPU each product is compared twice: tightly with the weight rounded to the activation
type as the kernels round it (then only fp32 summation order and the output rounding differ),
and within half-precision tolerance with the exact dequantized weight.
"""

from __future__ import annotations

import numpy as np
import pytest

from knopt.cuda.w4a16 import BLOCK_SIZES, GEMV_MAX_M, W4A16, W4A16Operands
from knopt.errors import CodegenError, CudaError
from knopt.ir.dtype import DType
from tests.cuda.quant import NUMPY, Device, random_nbits


def _nvrtc():
    pytest.importorskip("cuda.bindings.nvrtc")
    from knopt.cuda import nvrtc

    try:
        nvrtc.version()
    except (CudaError, RuntimeError) as err:
        pytest.skip(f"NVRTC cannot load: {err}")
    return nvrtc


def test_w4a16_kernels_compile_for_sm_90(tmp_path, monkeypatch) -> None:
    # Every block size, both types, in one translation unit as a program's kernels are.
    nvrtc = _nvrtc()
    monkeypatch.setenv("KNOPT_CACHE_DIR", str(tmp_path))
    types = (DType.F16, DType.BF16)
    formats = [W4A16(types[i % 2], block) for i, block in enumerate(BLOCK_SIZES)]
    cubin = nvrtc.compile_cubin("\n".join(f.source() for f in formats), "sm_90")
    assert cubin[:4] == b"\x7fELF"
    for name in (n for f in formats for n in f.kernel_names):
        assert name.encode() in cubin


@pytest.mark.parametrize(
    ("m", "n", "k", "block", "message"),
    [
        (1, 64, 100, 32, "multiple of 8"),
        (1, 64, 48, 16, "multiple of 32"),  # three blocks of 16
        (0, 64, 64, 32, "positive"),
    ],
)
def test_sizes_the_kernels_cannot_take_are_refused(
    m: int, n: int, k: int, block: int, message: str
) -> None:
    with pytest.raises(CodegenError, match=message):
        W4A16(DType.F16, block).check(m, n, k)


def test_unknown_formats_are_refused() -> None:
    with pytest.raises(CodegenError, match="block size 24"):
        W4A16(DType.F16, 24)
    with pytest.raises(CodegenError, match="float16 or bfloat16"):
        W4A16(DType.F32, 32)


def test_k_is_split_until_the_gpu_has_two_waves_of_tiles() -> None:
    w = W4A16(DType.F16, 128)
    assert w.splits(16, 4096, 4096, sm_count=132) == 5  # 64 tiles -> 320 blocks
    assert w.splits(4096, 4096, 4096, sm_count=132) == 1
    assert w.splits(16, 64, 256, sm_count=132) == 2  # no more splits than chunks
    assert w.workspace_bytes(1, 4096, 4096, sm_count=132) == 0  # the GEMV splits in a block
    assert w.workspace_bytes(16, 4096, 4096, sm_count=132) == 5 * 16 * 4096 * 4


@pytest.fixture(scope="module")
def device(gpu_available: bool) -> Device:
    if not gpu_available:
        pytest.skip("no usable NVIDIA GPU")
    from knopt.cuda.driver import Gpu

    return Device(Gpu())


CASES = [
    # (m, n, k, block, zero points, bias): the GEMV up to m = 8, the tiled kernel above
    (1, 256, 512, 32, True, False),
    (3, 200, 1024, 128, True, True),  # N not a multiple of 16
    (8, 64, 4160, 64, False, True),  # K not a multiple of the 128-k chunk
    (5, 48, 96, 16, True, False),  # blocks of 16: two scales a lane
    (1, 4096, 4096, 128, True, False),
    (16, 256, 512, 32, True, True),  # K split over blocks
    (37, 200, 1024, 128, True, False),  # M and N tails
    (128, 512, 2048, 256, False, True),
    (130, 72, 160, 16, True, True),
    (256, 4096, 4096, 128, True, False),  # no K split
]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [DType.F16, DType.BF16], ids=lambda d: d.short)
@pytest.mark.parametrize(("m", "n", "k", "block", "zeros", "bias"), CASES)
def test_w4a16_matches_dequantize_then_matmul(
    device: Device,
    dtype: DType,
    m: int,
    n: int,
    k: int,
    block: int,
    zeros: bool,
    bias: bool,
) -> None:
    from knopt.cuda import nvrtc

    rng = np.random.default_rng(m * 7919 + n * 31 + k + block)
    weight = random_nbits(rng, n, k, block, dtype, zeros)
    a = rng.standard_normal((m, k)).astype(NUMPY[dtype])
    b = rng.standard_normal(n).astype(NUMPY[dtype]) if bias else None
    w4 = W4A16(dtype, block)
    kernels = device.gpu.load(nvrtc.compile_cubin(w4.source(), device.gpu.arch), w4.kernel_names)
    operands = W4A16Operands(
        a=device.put(a),
        b=device.put(weight.b),
        scales=device.put(weight.scales),
        zeros=device.put(weight.zeros),
        bias=device.put(b),
        y=device.empty(m * n * 2),
        workspace=device.empty(w4.workspace_bytes(m, n, k, device.sm_count)),
    )
    w4.launch(device.gpu, kernels, operands, (m, n, k), device.sm_count)
    ours = device.get(operands.y, (m, n), NUMPY[dtype]).astype(np.float64)
    extra = 0.0 if b is None else b.astype(np.float64)
    rounded = a.astype(np.float64) @ weight.dequantized(dtype).T + extra
    exact = a.astype(np.float64) @ weight.dequantized().T + extra
    peak = float(np.abs(exact).max())
    ulp = 2.0**-10 if dtype is DType.F16 else 2.0**-7  # relative spacing near 1
    path = "gemv" if m <= GEMV_MAX_M else "gemm"
    np.testing.assert_allclose(ours, rounded, rtol=ulp, atol=ulp * peak, err_msg=path)
    np.testing.assert_allclose(ours, exact, rtol=8 * ulp, atol=8 * ulp * peak, err_msg=path)
