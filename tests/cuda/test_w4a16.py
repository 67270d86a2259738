"""W4A16 kernels (codegen/w4a16*.cu): they compile without a GPU, the rule routes each shape, and
on a GPU every route and kernel configuration matches numpy.

On the GPU each product is compared twice: tightly with the weight rounded to the activation
type as the kernels round it (then only fp32 summation order and the output rounding differ),
and within half-precision tolerance with the exact dequantized weight.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from knopt.cuda import w4a16
from knopt.cuda.w4a16 import (
    BLOCK_SIZES,
    DEFAULT_GEMM,
    DEFAULT_GEMV,
    DEFAULT_STREAM,
    GEMV_MAX_M,
    STREAM_CANDIDATES,
    W4A16,
    GemmConfig,
    GemvConfig,
    KernelConfig,
    Route,
    StreamConfig,
    W4A16Operands,
)
from knopt.errors import CodegenError
from knopt.ir.dtype import DType
from tests.cuda.programs import loaded_nvrtc, slow_copy_kernel
from tests.cuda.quant import NUMPY, Device, random_nbits

SMS = 132  # an H200's multiprocessors


def test_w4a16_kernels_compile_for_sm_90(tmp_path, monkeypatch) -> None:
    # Every block size, both types, in one translation unit as a program's kernels are, each
    # with the code paths of the templates: a GEMV with and without a cluster, a GEMM with a
    # 16-column tile in a cluster and one with a 64-column tile alone, a stream GEMV (every
    # value of each knob in one format or another), and the dequantizer. (The other configs
    # differ from these only in template numbers.) Stream GEMVs with K split over warps and
    # with activations loaded ahead come beside each format's first.
    nvrtc = loaded_nvrtc()
    monkeypatch.setenv("KNOPT_CACHE_DIR", str(tmp_path))
    gemm = (GemmConfig(16, 4, split=2), GemmConfig(64, 2))
    stream = (
        (StreamConfig(1, rows=1, unroll=1), StreamConfig(1, rows=4, unroll=2, warps=8, split=2)),
        (
            StreamConfig(2, rows=2, unroll=2, warps=8),
            StreamConfig(1, rows=8, unroll=1, split=4, early=True),
        ),
        (StreamConfig(3, rows=4, unroll=1), StreamConfig(2, rows=2, unroll=2, split=4, ahead=True)),
        (StreamConfig(4, rows=1, unroll=8), StreamConfig(1, rows=2, warps=16, split=8)),
        (StreamConfig(1, rows=4, early=True), StreamConfig(1, rows=4, unroll=4, ahead=True)),
    )
    formats = [
        W4A16(
            DType.BF16 if i % 2 else DType.F16,
            block,
            (GemvConfig(split=2),) + ((GemvConfig(),) if block == 128 else ()),
            gemm,
            stream[i],
        )
        for i, block in enumerate(BLOCK_SIZES)
    ]
    cubin = nvrtc.compile_cubin("\n".join(f.source() for f in formats), "sm_90")
    assert cubin[:4] == b"\x7fELF"
    for name in (n for f in formats for n in f.kernel_names):
        assert name.encode() in cubin


@pytest.mark.parametrize(
    ("m", "n", "k", "block", "message"),
    [
        (1, 64, 100, 32, "multiple of 8"),
        (1, 64, 48, 16, "multiple of 32"),  # three blocks of 16, and no cuBLASLt handle
        (0, 64, 64, 32, "positive"),
        (1, 2**20, 4096, 128, "under 2 GiB"),
        (2**19, 64, 4096, 128, "A under 2"),
    ],
)
def test_sizes_the_kernels_cannot_take_are_refused(
    m: int, n: int, k: int, block: int, message: str
) -> None:
    with pytest.raises(CodegenError, match=message):
        W4A16(DType.F16, block).plan(m, n, k, SMS)


class _LibraryGemm:
    """Stands in for a cuBLASLt plan bound to a step (`knopt.cuda.blas.BoundGemm`)."""

    def __init__(self, step: Any) -> None:
        self.step = step
        self.workspace = (3 << 20) if step.bias is not None else (1 << 20)
        self.calls: list[tuple[dict[int, int], int]] = []

    def enqueue(self, addresses: dict[int, int], workspace: int, stream: int) -> None:
        self.calls.append((dict(addresses), workspace))


class _Library:
    """Stands in for `knopt.cuda.blas.Blas` on the CPU: plans cost no GPU."""

    def plan(self, step: Any) -> _LibraryGemm:
        return _LibraryGemm(step)


@pytest.mark.parametrize("m", [1, 5, 100, 512])
def test_a_k_only_the_dequantizer_takes_goes_that_route_at_any_m(m: int) -> None:
    w4 = W4A16(DType.BF16, 16)  # K = 1032: 65 blocks of 16, 1040 codes a row, not 32s
    assert not w4.kernels_take(1032) and w4.kernels_take(1024)
    library: Any = _Library()
    assert w4.plan(m, 200, 1032, SMS, blas=library).route is Route.DEQUANTIZE
    with pytest.raises(CodegenError, match="only the dequantize"):
        w4.plan(m, 200, 1032, SMS)
    with pytest.raises(CodegenError, match="only the dequantize"):
        w4.plan(m, 200, 1032, SMS, blas=library, config=DEFAULT_GEMM[0])


def test_unknown_formats_are_refused() -> None:
    with pytest.raises(CodegenError, match="block size 24"):
        W4A16(DType.F16, 24)
    with pytest.raises(CodegenError, match="float16 or bfloat16"):
        W4A16(DType.F32, 32)


@pytest.mark.parametrize(
    ("m", "n", "kernel", "grid"),
    [
        (1, 4096, "stream_c1_r4_u4_w4_e", (256, 1, 1)),  # 1024 warps: 7.8 an SM
        (2, 4096, "gemv_w8_d4_s1", (256, 1, 1)),  # 256 tiles fill 132 SMs
        (8, 4096, "gemv_w8_d4_s1", (256, 1, 1)),
        (1, 1024, "gemv_w8_d4_s4", (64, 1, 4)),  # 64 tiles: K split 4 ways in a cluster
        (1, 2048, "gemv_w8_d4_s2", (128, 1, 2)),
        (9, 4096, "gemm_m16_w4_d4_s4", (64, 1, 4)),
        (16, 4096, "gemm_m16_w4_d4_s4", (64, 1, 4)),
        (32, 4096, "gemm_m32_w4_d4_s4", (64, 1, 4)),
        (128, 4096, "gemm_m64_w4_d2_s4", (64, 2, 4)),
        (256, 4096, "gemm_m64_w4_d2_s2", (64, 4, 2)),  # 256 tiles need only two splits
        (4096, 4096, "gemm_m64_w4_d2_s1", (64, 64, 1)),  # no cuBLASLt handle: tensor cores
    ],
)
def test_the_rule_picks_a_kernel_and_split_per_shape(
    m: int, n: int, kernel: str, grid: tuple[int, int, int]
) -> None:
    plan = W4A16(DType.F16, 128).plan(m, n, 4096, SMS)
    assert (plan.kernel, plan.grid, plan.workspace) == (f"w4a16_f16_b128_{kernel}", grid, 0)
    assert plan.route is (Route.GEMV if m <= GEMV_MAX_M else Route.GEMM)
    assert isinstance(plan.config, StreamConfig) == kernel.startswith("stream")


def test_k_is_split_no_finer_than_two_chunks_a_split() -> None:
    plan = W4A16(DType.F16, 128).plan(1, 64, 256, SMS)  # two chunks of 128 k
    assert plan.grid == (4, 1, 1)
    plan = W4A16(DType.F16, 128).plan(1, 64, 512, SMS)
    assert plan.grid == (4, 1, 2)


def test_a_module_defines_each_kernel_once() -> None:
    w4 = W4A16(DType.F16, 128, stream=(StreamConfig(1), StreamConfig(1), StreamConfig(2)))
    assert w4.stream == (StreamConfig(1), StreamConfig(2))
    assert len(set(w4.kernel_names)) == len(w4.kernel_names)


def test_configs_outside_the_module_are_refused() -> None:
    w4 = W4A16(DType.F16, 128, (GemvConfig(),), (GemmConfig(16, 4),), (StreamConfig(2),))
    with pytest.raises(CodegenError, match="no GEMV"):
        w4.plan(1, 256, 512, SMS, config=GemvConfig(split=2))
    with pytest.raises(CodegenError, match="no GEMV"):
        w4.plan(9, 256, 512, SMS, config=GemvConfig())  # the GEMV holds 8 rows of A
    with pytest.raises(CodegenError, match="no kernel"):
        w4.plan(16, 256, 512, SMS, config=GemmConfig(32, 4))
    with pytest.raises(CodegenError, match="cuBLASLt handle"):
        w4.plan(16, 256, 512, SMS, config=Route.DEQUANTIZE)
    with pytest.raises(CodegenError, match="no stream GEMV"):
        w4.plan(1, 256, 512, SMS, config=StreamConfig(1))
    with pytest.raises(CodegenError, match="no stream GEMV"):
        w4.plan(3, 256, 512, SMS, config=StreamConfig(2))  # it holds 2 rows of A
    assert w4.plan(2, 256, 512, SMS, config=StreamConfig(2)).grid == (32, 1, 1)
    split = StreamConfig(1, rows=4, unroll=2, warps=8, split=2)  # 4 row groups of 2 warps
    plan = W4A16(DType.F16, 128, (), (), (split,)).plan(1, 4096, 4096, SMS, config=split)
    assert (plan.grid, plan.threads, split.block_rows) == ((256, 1, 1), 256, 16)
    # The rule falls back to what the module has.
    assert w4.plan(100, 256, 512, SMS).config == GemmConfig(16, 4)


@pytest.mark.parametrize(
    ("m", "n", "kernel", "grid"),
    [
        (1, 4096, "stream_c1_r4_u4_w4_e", (256, 1, 1)),  # 1024 warps: 7 an SM at least
        (2, 4096, "stream_c2_r2_u4_w4", (512, 1, 1)),
        (3, 4096, "stream_c4_r2_u2_w4", (512, 1, 1)),  # the fewest columns holding M
        (4, 11008, "stream_c4_r2_u2_w4", (1376, 1, 1)),
        (1, 1024, "gemv_w8_d4_s4", (64, 1, 4)),  # 512 warps leave SMs idle: the mma GEMV
        (5, 4096, "gemv_w8_d4_s1", (256, 1, 1)),
    ],
)
def test_up_to_its_limit_m_the_rule_takes_the_stream_gemv(
    monkeypatch: pytest.MonkeyPatch, m: int, n: int, kernel: str, grid: tuple[int, int, int]
) -> None:
    # Measured, the limit is M = 1; raised, the rule picks the fewest columns holding M.
    assert W4A16(DType.F16, 128).plan(2, 4096, 4096, SMS).kernel.endswith("gemv_w8_d4_s1")
    monkeypatch.setattr(w4a16, "STREAM_RULE_MAX_M", 4)
    plan = W4A16(DType.F16, 128).plan(m, n, 4096, SMS)
    assert (plan.kernel, plan.grid, plan.route) == (f"w4a16_f16_b128_{kernel}", grid, Route.GEMV)
    assert isinstance(plan.config, StreamConfig | GemvConfig)
    assert plan.threads == 32 * plan.config.warps


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"rows": 3}, "rows 1, 2, 4 or 8"),
        ({"cols": 5}, "cols 1..4"),
        ({"unroll": 0}, "unroll 1..8"),
        ({"warps": 33}, "warps 1..32"),
        ({"split": 3, "warps": 6}, "split 1, 2, 4 or 8"),
        ({"split": 8}, "dividing warps"),  # 4 warps a block
        ({"cols": 2, "rows": 4, "unroll": 8}, "about 290 registers"),
        ({"cols": 2, "rows": 4, "unroll": 4, "ahead": True}, "about 334 registers"),
        ({"ahead": True, "early": True}, "pick one"),
    ],
)
def test_stream_knobs_out_of_range_are_refused(knobs: dict[str, Any], message: str) -> None:
    with pytest.raises(CodegenError, match=message):
        StreamConfig(**knobs)


def test_stream_blocks_an_sm_leave_each_thread_its_registers() -> None:
    # The blocks `min_blocks` asks of the compiler leave each thread the registers it needs;
    # configurations where even one block cannot are refused.
    # (Of the knobs without split, ahead and rows of 8, fewer than half are refused.)
    refused = plain_refused = 0
    for cols, rows, unroll, warps, split, ahead in itertools.product(
        range(1, 5), (1, 2, 4, 8), range(1, 9), (1, 2, 4, 8, 16, 32), (1, 2, 4, 8), (False, True)
    ):
        if warps % split:
            continue
        try:
            config = StreamConfig(cols, rows, unroll, warps, split, ahead)
        except CodegenError:
            refused += 1
            plain_refused += rows < 8 and split == 1 and not ahead
            continue
        share = 2**16 // (config.min_blocks * 32 * warps)
        assert config.min_blocks >= 1 and share >= config.registers, config
    with pytest.raises(CodegenError, match="fewer warps"):
        StreamConfig(rows=4, warps=32)
    assert 0 < plain_refused < 4 * 3 * 8 * 6 // 2 and plain_refused < refused


def test_every_default_config_has_a_kernel_name() -> None:
    w4 = W4A16(DType.BF16, 32)
    names = w4.kernel_names
    assert len(set(names)) == len(DEFAULT_GEMV) + len(DEFAULT_STREAM) + len(DEFAULT_GEMM) + 1
    assert all(n.startswith("w4a16_bf16_b32_") for n in names)
    assert names[-1] == "w4a16_bf16_b32_dequantize"


class _Launches:
    """Stands in for `knopt.cuda.driver.Gpu`: records kernel launches instead of making them."""

    stream_handle = 0

    def __init__(self) -> None:
        self.args: list[tuple[Any, ...]] = []

    def launch(self, kernel: Any, grid: Any, block: Any, shared: int, args: Any) -> None:
        assert grid[0] >= 1 and block == (w4a16.DEQUANTIZE_THREADS, 1, 1) and shared == 0
        self.args.append(tuple(args))


def _inside(buffers: dict[str, tuple[int, int]], name: str, start: int, nbytes: int) -> None:
    base, size = buffers[name]
    assert base <= start and start + nbytes <= base + size, f"{name}: {start - base} + {nbytes}"


def _extent(operand: Any, element: int) -> int:
    """Bytes from a matrix's first element to past its last."""
    rows, cols = operand.rows, operand.cols
    return ((rows - 1) * operand.row_stride + (cols - 1) * operand.col_stride + 1) * element


@pytest.mark.parametrize(
    ("m", "n", "k", "block", "dtype", "slice_rows"),
    [
        (512, 4096, 4096, 128, DType.F16, None),  # the benchmark's first dequantize row
        (1024, 11008, 4096, 128, DType.BF16, None),  # 86 MiB dequantized: two slices
        (600, 4096, 4096, 128, DType.F16, 128),  # 32 slices
        (512, 200, 1032, 16, DType.BF16, 128),  # K_pad 1040; a last slice of 72 rows
        (3, 136, 264, 16, DType.F16, None),  # K_pad 272 at small M; 264 is 8 past 256
    ],
)
def test_the_dequantize_route_stays_inside_its_buffers(
    monkeypatch: pytest.MonkeyPatch,
    m: int,
    n: int,
    k: int,
    block: int,
    dtype: DType,
    slice_rows: int | None,
) -> None:
    # Every range a dequantizer launch reads or writes (by the kernel's indexing: 8-byte pieces
    # of rows of K_pad / 2 bytes) and every matrix cuBLASLt is told about lies inside the
    # buffer it is given, with the alignment the GEMM plans assume.
    if slice_rows is not None:
        monkeypatch.setattr(w4a16, "DEQUANTIZE_LIMIT", slice_rows * k * dtype.itemsize)
    w4 = W4A16(dtype, block)
    library: Any = _Library()
    plan = w4.plan(m, n, k, SMS, blas=library)
    assert plan.route is Route.DEQUANTIZE
    element, blocks = dtype.itemsize, -(-k // block)
    row_bytes, zero_bytes = w4.padded_k(k) // 2, -(-blocks // 2)
    sizes = {
        "a": m * k * element,
        "b": n * row_bytes,
        "scales": n * blocks * element,
        "zeros": n * zero_bytes,
        "bias": n * element,
        "y": m * n * element,
        "workspace": plan.workspace,
    }
    buffers = {name: ((i + 1) << 40, size) for i, (name, size) in enumerate(sizes.items())}
    operands = W4A16Operands(**{name: base for name, (base, _) in buffers.items()})
    gpu = _Launches()
    plan.enqueue(gpu, {plan.kernel: None}, operands)  # type: ignore[arg-type]

    weight_end = operands.workspace + max(part.rows for part in plan.slices) * k * element
    assert [(p.first, p.rows) for p in plan.slices] == [
        (first, min(n - first, plan.slices[0].rows)) for first in range(0, n, plan.slices[0].rows)
    ]
    assert len(gpu.args) == len(plan.slices)
    for part, (b, scales, zeros, weight, *ints) in zip(plan.slices, gpu.args, strict=True):
        rows = int(ints[0])  # the kernel's (int32) rows and K
        assert (rows, int(ints[1])) == (part.rows, k) and weight == operands.workspace
        assert b % w4a16.DEQUANTIZE_PIECE == 0 and rows * row_bytes % w4a16.DEQUANTIZE_PIECE == 0
        _inside(buffers, "b", b, rows * row_bytes)
        _inside(buffers, "scales", scales, rows * blocks * element)
        _inside(buffers, "zeros", zeros, rows * zero_bytes)
        _inside(buffers, "workspace", weight, rows * k * element)
        assert weight + rows * k * element <= weight_end
        plain: Any = part.plain
        biased: Any = part.biased
        assert plain.calls == [] and len(biased.calls) == 1  # a bias was given
        (addresses, scratch), step = biased.calls[0], biased.step
        assert addresses[step.a.tensor] == operands.a and addresses[step.b.tensor] == weight
        _inside(buffers, "a", addresses[step.a.tensor], _extent(step.a, element))
        _inside(buffers, "workspace", weight, _extent(step.b, element))
        assert _extent(step.b, element) <= weight_end - weight
        _inside(buffers, "y", addresses[step.d.tensor], _extent(step.d, element))
        _inside(buffers, "bias", addresses[step.bias], step.d.cols * element)
        _inside(buffers, "workspace", scratch, biased.workspace)
        assert scratch >= weight_end
        for address in (addresses[step.d.tensor], addresses[step.bias], weight, scratch):
            assert address % 256 == 0  # the GEMM plans' alignment (Gemm's default)


# ---- on the GPU ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def device(gpu_available: bool) -> Device:
    if not gpu_available:
        pytest.skip("no usable NVIDIA GPU")
    from knopt.cuda.driver import Gpu

    return Device(Gpu())


@pytest.fixture(scope="module")
def blas(device: Device) -> Any:
    from knopt.cuda.blas import Blas

    return Blas()


_MODULES: dict[W4A16, dict[str, Any]] = {}


def _kernels(device: Device, w4: W4A16) -> dict[str, Any]:
    from knopt.cuda import nvrtc

    if w4 not in _MODULES:
        cubin = nvrtc.compile_cubin(w4.source(), device.gpu.arch)
        _MODULES[w4] = device.gpu.load(cubin, w4.kernel_names)
    return _MODULES[w4]


def _only(dtype: DType, block: int, config: KernelConfig | None) -> W4A16:
    """A module with one product kernel (and the dequantizer): quick to compile."""
    gemv = (config,) if isinstance(config, GemvConfig) else ()
    gemm = (config,) if isinstance(config, GemmConfig) else ()
    stream = (config,) if isinstance(config, StreamConfig) else ()
    return W4A16(dtype, block, gemv, gemm, stream)


def _check(
    device: Device,
    w4: W4A16,
    sizes: tuple[int, int, int],
    zeros: bool,
    bias: bool,
    config: KernelConfig | Route,
    blas: Any = None,
) -> None:
    m, n, k = sizes
    dtype, block = w4.dtype, w4.block
    rng = np.random.default_rng(m * 7919 + n * 31 + k + block)
    weight = random_nbits(rng, n, k, block, dtype, zeros)
    a = rng.standard_normal((m, k)).astype(NUMPY[dtype])
    b = rng.standard_normal(n).astype(NUMPY[dtype]) if bias else None
    plan = w4.plan(m, n, k, device.sm_count, blas=blas, config=config)
    operands = W4A16Operands(
        a=device.put(a),
        b=device.put(weight.b),
        scales=device.put(weight.scales),
        zeros=device.put(weight.zeros),
        bias=device.put(b),
        y=device.empty(m * n * 2),
        workspace=device.empty(plan.workspace),
    )
    plan.enqueue(device.gpu, _kernels(device, w4), operands)
    ours = device.get(operands.y, (m, n), NUMPY[dtype]).astype(np.float64)
    extra = 0.0 if b is None else b.astype(np.float64)
    rounded = a.astype(np.float64) @ weight.dequantized(dtype).T + extra
    exact = a.astype(np.float64) @ weight.dequantized().T + extra
    peak = float(np.abs(exact).max())
    ulp = 2.0**-10 if dtype is DType.F16 else 2.0**-7  # relative spacing near 1
    where = f"{plan.kernel} {sizes}"
    np.testing.assert_allclose(ours, rounded, rtol=ulp, atol=ulp * peak, err_msg=where)
    np.testing.assert_allclose(ours, exact, rtol=8 * ulp, atol=8 * ulp * peak, err_msg=where)


CASES = [
    # (m, n, k, block, zero points, bias): the GEMV up to m = 8, the GEMM above
    (1, 256, 512, 32, True, False),
    (3, 200, 1024, 128, True, True),  # N not a multiple of 16
    (8, 64, 4160, 64, False, True),  # K not a multiple of the 128-k chunk; K split 4 ways
    (5, 48, 96, 16, True, False),  # blocks of 16: two scales a lane
    (1, 4096, 4096, 128, True, False),
    (16, 256, 512, 32, True, True),  # K split over a cluster
    (37, 200, 1024, 128, True, False),  # M and N tails
    (128, 512, 2048, 256, False, True),
    (130, 72, 160, 16, True, True),
    (256, 4096, 4096, 128, True, False),
]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [DType.F16, DType.BF16], ids=lambda d: d.short)
@pytest.mark.parametrize(("m", "n", "k", "block", "zeros", "bias"), CASES)
def test_the_rules_kernel_matches_dequantize_then_matmul(
    device: Device, dtype: DType, m: int, n: int, k: int, block: int, zeros: bool, bias: bool
) -> None:
    config = W4A16(dtype, block).plan(m, n, k, device.sm_count).config
    assert config is not None
    _check(device, _only(dtype, block, config), (m, n, k), zeros, bias, config)


# Every compiled configuration (and those the benchmark adds), in one module a type, on shapes
# that reach its tails: a partial last tile in N and M, a K that ends inside a chunk (and a
# block), zero points and a bias. Blocks of 16 go through the rule's tests.
VARIANTS: tuple[GemvConfig | GemmConfig, ...] = (
    *DEFAULT_GEMV,
    GemvConfig(depth=2),
    GemvConfig(warps=4),
    GemvConfig(warps=4, split=2),
    *DEFAULT_GEMM,
)


@pytest.mark.cuda
@pytest.mark.parametrize("config", VARIANTS, ids=lambda c: c.suffix)
@pytest.mark.parametrize("dtype", [DType.F16, DType.BF16], ids=lambda d: d.short)
def test_every_kernel_config_matches_dequantize_then_matmul(
    device: Device, dtype: DType, config: GemvConfig | GemmConfig
) -> None:
    w4 = W4A16(
        dtype,
        64,
        tuple(c for c in VARIANTS if isinstance(c, GemvConfig)),
        tuple(c for c in VARIANTS if isinstance(c, GemmConfig)),
        (),
    )
    if isinstance(config, GemvConfig):
        shapes = [(1, 200, 2088), (7, 48, 1032), (8, 4096, 4096)]
    else:
        shapes = [(config.bm - 3, 200, 2088), (2 * config.bm + 5, 48, 1032), (37, 4096, 4096)]
    for i, (m, n, k) in enumerate(shapes):
        _check(device, w4, (m, n, k), i != 1, i != 0, config)


# Stream GEMVs: every value of each knob, at every M they hold, on shapes that reach their
# tails: N past a warp's rows and a block's warps (and, K split over warps, a block whose last
# row group lies past N), K in whole rounds of 1024 codes a warp with and without a last
# partial one (K ending inside a block; split, rounds dealt to some parts and not others, a
# part with none), zero points and a bias or not. Those the benchmark times come too.
STREAM_VARIANTS = tuple(
    dict.fromkeys(
        (
            *DEFAULT_STREAM,
            StreamConfig(1, rows=1, unroll=1),
            StreamConfig(1, rows=1, unroll=8),
            StreamConfig(1, rows=2, unroll=4),
            StreamConfig(3, rows=4, unroll=2),
            StreamConfig(2, rows=1, unroll=2, warps=8),
            StreamConfig(2, rows=8, unroll=1, warps=8, split=8),
            StreamConfig(4, rows=2, unroll=2, split=2, ahead=True),
            StreamConfig(2, rows=2, unroll=2, warps=8, split=2, early=True),
            StreamConfig(1, rows=1, unroll=1, early=True),
            *STREAM_CANDIDATES,
        )
    )
)


@pytest.mark.cuda
@pytest.mark.parametrize("config", STREAM_VARIANTS, ids=lambda c: c.suffix)
@pytest.mark.parametrize("dtype", [DType.F16, DType.BF16], ids=lambda d: d.short)
def test_every_stream_config_matches_dequantize_then_matmul(
    device: Device, dtype: DType, config: StreamConfig
) -> None:
    w4 = W4A16(dtype, 64, (), (), STREAM_VARIANTS)
    c = config.cols
    shapes = [
        (c, 203, 2088, True, False),  # K_pad 2112: two whole rounds and 2 pieces of a third
        (1, 4099, 4096, False, True),  # four whole rounds
        ((c + 1) // 2, 77, 8256, True, True),  # eight whole rounds and a part: the ring turns
        (max(1, c - 1), 33, 192, True, True),  # only a partial round
    ]
    for m, n, k, zeros, bias in shapes:
        _check(device, w4, (m, n, k), zeros, bias, config)


@pytest.mark.cuda
@pytest.mark.parametrize("block", BLOCK_SIZES)
@pytest.mark.parametrize("dtype", [DType.F16, DType.BF16], ids=lambda d: d.short)
def test_the_stream_gemv_takes_every_block_size(device: Device, dtype: DType, block: int) -> None:
    # K = 3104: a partial last round at every block size, K ending inside a block from 64 up;
    # blocks of 16 give a piece two scales and zero points.
    config = StreamConfig(2, rows=4, unroll=2)
    w4 = _only(dtype, block, config)
    _check(device, w4, (2, 130, 3104), True, True, config)
    _check(device, w4, (1, 61, 3104), False, False, config)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [DType.F16, DType.BF16], ids=lambda d: d.short)
@pytest.mark.parametrize(
    ("m", "n", "k", "block", "zeros", "bias"),
    [
        (512, 200, 1032, 16, True, True),  # K_pad = 1040: only the dequantizer takes it
        (5, 72, 1032, 16, False, True),  # ... at any M
        (600, 4096, 4096, 128, True, False),
    ],
)
def test_dequantize_then_cublaslt_matches(
    device: Device,
    blas: Any,
    monkeypatch: pytest.MonkeyPatch,
    dtype: DType,
    m: int,
    n: int,
    k: int,
    block: int,
    zeros: bool,
    bias: bool,
) -> None:
    # Slices of 128 rows (256-byte aligned outputs for cuBLASLt) force several rounds.
    monkeypatch.setattr(w4a16, "DEQUANTIZE_LIMIT", 128 * k * dtype.itemsize)
    plan = W4A16(dtype, block).plan(m, n, k, device.sm_count, blas=blas)
    assert plan.route is Route.DEQUANTIZE and len(plan.slices) == -(-n // 128)
    _check(device, _only(dtype, block, None), (m, n, k), zeros, bias, Route.DEQUANTIZE, blas)


@pytest.mark.cuda
def test_every_route_at_m512_n4096_k4096_also_in_a_graph(device: Device, blas: Any) -> None:
    # The benchmark's first row whose rule takes the dequantize route (N = K = 4096, blocks of
    # 128, zero points), with the GEMMs it times there: each eagerly, then as it is timed, a
    # CUDA graph of several launches replayed twice. The output starts as NaN each time.
    m, n, k, block, dtype = 512, 4096, 4096, 128, DType.F16
    configs = tuple(c for c in DEFAULT_GEMM if c.bm == 64)
    w4 = W4A16(dtype, block, (), configs, ())
    assert w4.plan(m, n, k, device.sm_count, blas=blas).route is Route.DEQUANTIZE
    kernels = _kernels(device, w4)
    rng = np.random.default_rng(512)
    weight = random_nbits(rng, n, k, block, dtype, True)
    a = rng.standard_normal((m, k)).astype(NUMPY[dtype])
    rounded = a.astype(np.float64) @ weight.dequantized(dtype).T
    ulp, peak = 2.0**-10, float(np.abs(rounded).max())
    inputs = {
        "a": device.put(a),
        "b": device.put(weight.b),
        "scales": device.put(weight.scales),
        "zeros": device.put(weight.zeros),
    }
    gpu = device.gpu
    choices: tuple[GemmConfig | Route, ...] = (Route.DEQUANTIZE, *configs)
    for choice in choices:
        plan = w4.plan(m, n, k, device.sm_count, blas=blas, config=choice)
        operands = W4A16Operands(
            **inputs, y=device.empty(m * n * 2), workspace=device.empty(plan.workspace)
        )
        for graph in (False, True):
            gpu.fill(operands.y, 0xFF, m * n * 2)
            if graph:
                gpu.begin_capture()
                for _ in range(3):
                    plan.enqueue(gpu, kernels, operands)
                executable = gpu.end_capture()
                gpu.replay(executable)
                gpu.replay(executable)
                gpu.sync()
                gpu.release_graph(executable)
            else:
                plan.enqueue(gpu, kernels, operands)
            ours = device.get(operands.y, (m, n), NUMPY[dtype]).astype(np.float64)
            where = f"{plan.kernel} {'in a graph' if graph else 'eagerly'}"
            np.testing.assert_allclose(ours, rounded, rtol=ulp, atol=ulp * peak, err_msg=where)


@pytest.mark.cuda
@pytest.mark.parametrize(
    "config",
    [
        StreamConfig(1, rows=4, early=True),
        StreamConfig(2, rows=2, unroll=2, warps=8, split=2, early=True),
    ],
    ids=lambda c: c.suffix,
)
def test_an_early_stream_gemv_reads_what_the_kernel_ahead_wrote(
    device: Device, config: StreamConfig
) -> None:
    # The early GEMV loads its weight while the kernel ahead still runs, but its activations
    # only after that kernel has written them: here they are zero until a slow kernel copies
    # them in, eagerly and in a CUDA graph (where the launches keep their programmatic edges).
    m, n, k, block, dtype = config.cols, 4096, 4096, 128, DType.F16
    gpu = device.gpu
    copy = slow_copy_kernel(gpu)
    w4 = _only(dtype, block, config)
    kernels = _kernels(device, w4)
    rng = np.random.default_rng(4096)
    weight = random_nbits(rng, n, k, block, dtype, True)
    a = rng.standard_normal((m, k)).astype(np.float16)
    rounded = a.astype(np.float64) @ weight.dequantized(dtype).T
    ulp, peak = 2.0**-10, float(np.abs(rounded).max())
    plan = w4.plan(m, n, k, device.sm_count, config=config)
    assert plan.config == config
    zeros = np.zeros_like(a)
    operands = W4A16Operands(
        a=device.put(zeros),
        b=device.put(weight.b),
        scales=device.put(weight.scales),
        zeros=device.put(weight.zeros),
        y=device.empty(m * n * 2),
    )
    src = device.put(a)
    args = (operands.a, src, np.int32(a.size), np.int64(200_000))  # ~0.1 ms of spinning
    for graph in (False, True):
        gpu.upload(operands.a, zeros)
        gpu.fill(operands.y, 0xFF, m * n * 2)
        if graph:
            gpu.begin_capture()
            gpu.launch(copy, (4, 1, 1), (256, 1, 1), 0, args)
            plan.enqueue(gpu, kernels, operands)
            executable = gpu.end_capture()
            gpu.replay(executable)
            gpu.sync()
            gpu.release_graph(executable)
        else:
            gpu.launch(copy, (4, 1, 1), (256, 1, 1), 0, args)
            plan.enqueue(gpu, kernels, operands)
        ours = device.get(operands.y, (m, n), np.float16).astype(np.float64)
        where = f"{plan.kernel} {'in a graph' if graph else 'eagerly'}"
        np.testing.assert_allclose(ours, rounded, rtol=ulp, atol=ulp * peak, err_msg=where)
