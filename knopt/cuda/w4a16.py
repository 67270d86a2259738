"""Weight-only int4 matrix products (W4A16) on the GPU: codegen/w4a16*.cu and how to launch them.

`Y[M, N] = A[M, K] @ W[N, K]^T + bias` for float16 or bfloat16 A and a weight packed as
onnxruntime's `com.microsoft.MatMulNBits` stores it (4-bit codes two a byte along K, blocked
scales of A's type, optional packed 4-bit zero points), dequantized in registers: the weight
moves from memory at half a byte an element, a quarter of what float16 needs.

Three routes, chosen per shape by `W4A16.plan` (Route):

* GEMV, M <= 8: memory-bound. Two kernel families. The mma GEMV (GemvConfig): a 16-row tile
  of W a block on the tensor cores, K split over its warps, each with several chunks of weight
  loads in flight, and over the blocks of a thread block cluster when N has too few tiles to
  fill the GPU (their sums meet in distributed shared memory). The stream GEMV (StreamConfig,
  M <= STREAM_MAX_M, codegen/w4a16_stream.cuh): on the CUDA cores, a few rows of W a warp over
  the whole of K, 16-byte loads of codes that bypass L1, products in paired T FMAs, the lanes'
  sums met by shuffles. The rule takes the stream GEMV at M <= STREAM_RULE_MAX_M (1) where
  N gives every SM STREAM_MIN_WARPS warps: measured on an H200 at N = K = 4096 it takes
  4.7 us at M = 1 (4 rows a warp) against the mma GEMV's 5.5, while at M = 2 and 4 the mma
  GEMV is faster (5.3 against 6.1 us, 5.8 against 8.9). The rule's stream GEMV loads its
  first pieces of the weight before it waits for the kernel ahead (`StreamConfig.early`):
  back to back 3.9-4.0 us against 4.5 (weights out of L2: 4.4-4.5 against 5.4), 2.5x and
  2.8-3.0x torch's fp16 GEMV.
* GEMM, larger M: the weight tile in registers, A staged in shared memory by cp.async, K split
  over a cluster likewise.
* DEQUANTIZE, M >= DEQUANTIZE_MIN_M with a cuBLASLt handle: the weight dequantized to A's type
  into the workspace (in slices of at most DEQUANTIZE_LIMIT bytes), then cuBLASLt's GEMM. At
  large M the GEMM's work dwarfs one pass over the weight, and cuBLASLt's wgmma kernels
  outrun the mma.sync tensor-core kernel. It is also the route, at any M, for a K the GEMV
  and GEMM kernels cannot take (`W4A16.kernels_take`: blocks of 16 making K_pad 16 mod 32).

The rule, from what an H200 should do at N = K = 4096 (8.4 MB of int4 weight, scales and zero
points; about 4 TB/s from HBM, ~600 TFLOP/s of mma.sync; torch's fp16 GEMV reads 33.5 MB in
9.2 us): at M <= 8 the GEMV streams the weight in ~2.1 us while its ~200 instructions a KB of
weight a warp take ~1.5 us of issue, so ~3 us with the launch; up to M = 64 the GEMM is still
memory-bound (~4-6 us, torch ~9 us); at M = 128-256 it is bound by mma.sync (~4 GFLOP a 128
rows: ~10 us against torch's 13.5 us); from M = 512 dequantizing (~10 us: 8 MB read, 32 MB
written) and cuBLASLt's GEMM (~600+ TFLOP/s) beat the GEMM's ~43 us. A K split over a
cluster is taken when the tiles alone leave SMs idle. `benchmarks/quantized.py --w4a16-only`
times every configuration beside the rule's pick, to check these numbers. Measured
(2026-12-03, H200, N = K = 4096; benchmarks/RESULTS.md): the GEMV is the fastest variant at
M <= 8 (5.5-6.3 us); the GEMM is not memory-bound as expected (14 us at M = 16, 30 us at 64,
50 us at 128, 83-93 us at 256), while dequantize + cuBLASLt takes 31 us at M = 64 (a tie),
37 us at 128 and 256, 47 us at 512: so DEQUANTIZE_MIN_M is 128, not the 512 expected.

All routes round each weight once to A's type as `(code - zero) * scale`. The mma kernels and
the dequantize route multiply on the tensor cores and accumulate in fp32, so they agree to
fp32 summation order; the stream GEMV sums each lane's products of 32 codes in A's type (8
a half-precision slot, two chains) before fp32, so it agrees with them to that rounding
(each addition to 2^-11 of those partial sums for float16, 2^-8 for bfloat16). Sizes are
launch arguments: one compiled module (per activation type and block size) serves every M, N
and K. This module only plans and launches; it holds no device memory.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from knopt.cuda.templates import render
from knopt.errors import CodegenError
from knopt.ir.dtype import DType

if TYPE_CHECKING:
    from knopt.cuda.blas import Blas, BoundGemm
    from knopt.cuda.driver import Gpu
    from knopt.cuda.steps import Gemm

BLOCK_SIZES = (16, 32, 64, 128, 256)
GEMV_MAX_M = 8  # the mma's 8-column operand holds every row of A
CHUNK = 128  # k a warp consumes per step
GEMM_WARPS = 4
SPLITS = (1, 2, 4)  # cluster sizes the default module is compiled for
DEQUANTIZE_MIN_M = 128  # measured (module docstring): from M = 128 it beats every GEMM variant
DEQUANTIZE_LIMIT = 64 * 2**20  # bytes of dequantized weight a slice (whole 128-row groups:
# outputs 256-byte aligned, as cuBLASLt's heuristic assumes)
DEQUANTIZE_THREADS = 256
DEQUANTIZE_PIECE = 8  # bytes of codes (16 k) a dequantizer thread reads: rows are kp / 2 bytes
STREAM_MAX_M = 4  # rows of A a stream GEMV holds at most (StreamConfig.cols)
STREAM_RULE_MAX_M = 1  # measured (module docstring): the stream GEMV wins at M = 1 only
STREAM_MIN_WARPS = 7  # warps an SM that N must give the stream GEMV (which splits no K) for
# the rule to take it: N = 4096 at 4 rows a warp gives 7.8 on 132 SMs, where it was timed;
# with fewer, the mma GEMV splits K over a cluster instead
_REGISTER_STEPS = (64, 80, 96, 128, 168, 255)  # a thread's share at 32, 24, 20, 16, 12, 8 warps
_ALIGN = 256
_C_TYPES = {DType.F16: "__half", DType.BF16: "__nv_bfloat16"}
_PRECISION = {DType.F16: "fp16", DType.BF16: "bf16"}


class Route(enum.Enum):
    """How one product is computed."""

    GEMV = "gemv"
    GEMM = "gemm"
    DEQUANTIZE = "dequantize+cublaslt"


@dataclass(frozen=True)
class GemvConfig:
    """One compiled GEMV: warps a block, chunks of weights in flight a warp, blocks a cluster."""

    warps: int = 8
    depth: int = 4
    split: int = 1

    @property
    def suffix(self) -> str:
        """The kernel name's tail."""
        return f"gemv_w{self.warps}_d{self.depth}_s{self.split}"


@dataclass(frozen=True)
class StreamConfig:
    """One compiled stream GEMV: A rows, W rows a warp, loads in flight a lane, warps a block.

    `cols` rows of A are held (M <= cols); a row group of `split` warps owns `rows` rows of W,
    each warp one of `split` parts of K (whose sums meet in shared memory), and each lane keeps
    `unroll` 16-byte loads of codes of every one of them in flight, with the activations they
    meet if `ahead` (else those are loaded just before their use). A block holds
    `warps / split` row groups. With `early`, the first `unroll` loads of every row are issued
    before the kernel waits for the one ahead of it on the stream (programmatic dependent
    launch, knopt/cuda/driver.py), so the weight streams in while that kernel finishes: only
    for a weight, scales and zero points no kernel writes (`W4A16Operands`), and not with
    `ahead` (activations are the kernel ahead's output).

    Raises:
        CodegenError: If a knob is out of range, or its registers would not fit a thread.
    """

    cols: int = 1
    rows: int = 2
    unroll: int = 4
    warps: int = 4
    split: int = 1
    ahead: bool = False
    early: bool = False

    def __post_init__(self) -> None:
        if not (
            1 <= self.cols <= STREAM_MAX_M
            and self.rows in (1, 2, 4, 8)
            and 1 <= self.unroll <= 8
            and 1 <= self.warps <= 32
            and self.split in (1, 2, 4, 8)
            and self.warps % self.split == 0
        ):
            raise CodegenError(
                f"stream GEMV {self}: needs cols 1..{STREAM_MAX_M}, rows 1, 2, 4 or 8, unroll "
                "1..8, warps 1..32 and split 1, 2, 4 or 8 dividing warps"
            )
        if self.early and self.ahead:
            raise CodegenError(
                f"stream GEMV {self}: early loads the weight before the kernel ahead has "
                "finished, and ahead loads activations (its output) with it: pick one"
            )
        if self.registers > _REGISTER_STEPS[-1]:
            raise CodegenError(
                f"stream GEMV {self}: its ring and sums need about {self.registers} registers "
                f"a thread, more than {_REGISTER_STEPS[-1]}: lower rows, unroll or cols"
            )
        if self.min_blocks * self._share * 32 * self.warps > 2**16:
            raise CodegenError(
                f"stream GEMV {self}: a block of {self.warps} warps leaves a thread fewer than "
                f"the {self.registers} registers it needs: fewer warps"
            )

    @property
    def suffix(self) -> str:
        """The kernel name's tail."""
        base = f"stream_c{self.cols}_r{self.rows}_u{self.unroll}_w{self.warps}"
        tail = (f"_k{self.split}" if self.split > 1 else "") + ("_a" if self.ahead else "")
        return base + tail + ("_e" if self.early else "")

    @property
    def block_rows(self) -> int:
        """Rows of W (output features) a block."""
        return self.rows * self.warps // self.split

    @property
    def registers(self) -> int:
        """About the registers a thread needs without spilling.

        Fitted to what ptxas (CUDA 13.0, sm_90, both types, blocks of 16 and 128) needs over
        every knob, to within a step of _REGISTER_STEPS: the ring (6 a row and load: codes,
        scale, zero point), the sums in T (a row and column), A (a column), pointers (a row);
        with `ahead`, A's pieces in the ring too (16 a column and load, and their pointers).
        """
        r, u, c = self.rows, self.unroll, self.cols
        ahead = 16 * c * u + 16 if self.ahead else 0
        return 6 * r * u + 3 * r * c + 9 * c + 12 * r + u + ahead

    @property
    def _share(self) -> int:
        return next(r for r in _REGISTER_STEPS if r >= self.registers)

    @property
    def min_blocks(self) -> int:
        """Blocks an SM the registers must allow: the most whose share holds `registers`."""
        return max(1, 2**16 // (self._share * 32 * self.warps))


@dataclass(frozen=True)
class GemmConfig:
    """One compiled GEMM: A rows a block, chunks of weights in flight a warp, blocks a cluster."""

    bm: int
    depth: int
    split: int = 1
    warps: int = GEMM_WARPS

    @property
    def suffix(self) -> str:
        """The kernel name's tail."""
        return f"gemm_m{self.bm}_w{self.warps}_d{self.depth}_s{self.split}"

    @property
    def rows(self) -> int:
        """Rows of W (output features) a block."""
        return 16 * self.warps

    @property
    def min_blocks(self) -> int:
        """Blocks an SM the registers must allow: 4 (128 a thread), 3 with 64 accumulators."""
        return 3 if self.bm >= 64 else 4


def gemm_depth(bm: int) -> int:
    """Chunks of weights in flight a warp: 4 while the accumulators leave room, else 2."""
    return 4 if bm <= 32 else 2


GEMM_BMS = (16, 32, 64)
DEFAULT_GEMV = tuple(GemvConfig(split=s) for s in SPLITS)
# Each holds the row groups of N = 4096 in one wave on 132 SMs (min_blocks) and 4 loads of
# codes in flight a lane, 2 at 4 columns. At one column, 4 rows a warp was the fastest of
# the 8 settings timed (4.7 us against 5.0-9.6); the others are the best guesses.
DEFAULT_STREAM = (StreamConfig(1, rows=4, early=True), StreamConfig(2), StreamConfig(4, unroll=2))
# Stream GEMVs built for latency at M = 1 (N = K = 4096: 8.4 MB of weight, ~64 KB an SM of
# 132), for benchmarks/quantized.py to time beside the rule's pick; the rule takes none yet.
# Each loads all of a lane's share of codes (and with `ahead` activations) before using any,
# and all but the last two fit N = 4096 in one wave of 132 SMs (min_blocks, from registers):
STREAM_CANDIDATES = (
    StreamConfig(1, rows=4, ahead=True),  # the default, A loaded with the codes: 8 warps an SM
    StreamConfig(1, rows=4, unroll=2, warps=8, split=2),  # K in halves: 16 warps an SM
    StreamConfig(1, rows=4, unroll=2, split=2),  # the same in blocks of 4 warps
    StreamConfig(1, rows=8, unroll=2, split=2),  # 8 rows: half as many A loads a code
    StreamConfig(1, rows=4, unroll=1, split=4),  # one round a warp: 20 of 31 warps an SM at once
    StreamConfig(1, rows=2, unroll=1, warps=8, split=4),  # 32 of 62 warps an SM at once
    # Weight loads before the wait for the kernel ahead (`early`), as the rule's pick:
    StreamConfig(1, rows=2, early=True),  # 2 rows: twice the warps
    StreamConfig(1, rows=4, unroll=2, warps=8, split=2, early=True),  # all of K early
    StreamConfig(1, rows=4, unroll=1, split=4, early=True),  # all of K early, 4x the warps
    StreamConfig(1, rows=8, unroll=2, split=2, early=True),  # all of K early, half the A loads
)
DEFAULT_GEMM = tuple(GemmConfig(bm, gemm_depth(bm), s) for bm in GEMM_BMS for s in SPLITS)
KernelConfig = GemvConfig | StreamConfig | GemmConfig


@dataclass(frozen=True)
class W4A16Operands:
    """Device addresses of one product's tensors (0 where an optional one is absent).

    The weight (`b`, `scales`, `zeros`) is a constant: no kernel on the stream may write it,
    for the rule's stream GEMV reads it before the kernel ahead has finished (`StreamConfig`).

    Attributes:
        a: Activations [M, K], row-major, 16-byte aligned.
        b: Packed codes, uint8 [N, K_pad / 2] (MatMulNBits' [N, k_blocks, blob_size]).
        scales: [N, k_blocks] of the activation type.
        zeros: Packed 4-bit zero points, uint8 [N, ceil(k_blocks / 2)], or 0 for 8.
        bias: [N] of the activation type, or 0.
        y: The output [M, N].
        workspace: Scratch of the plan's `workspace` bytes, or 0 when that is 0.
    """

    a: int
    b: int
    scales: int
    y: int
    zeros: int = 0
    bias: int = 0
    workspace: int = 0


def _float_gemm(blas: Blas, step: Gemm) -> BoundGemm:
    """The cuBLASLt plan of a float GEMM (only int8 products plan as anything else)."""
    return cast("BoundGemm", blas.plan(step))


@dataclass(frozen=True)
class _Slice:
    """Rows [first, first + rows) of W, dequantized and multiplied by one cuBLASLt GEMM.

    Attributes:
        plain: The GEMM without a bias.
        biased: The GEMM with the bias epilogue.
    """

    first: int
    rows: int
    plain: BoundGemm
    biased: BoundGemm


@dataclass(frozen=True, eq=False)
class W4A16Plan:
    """One product ready to enqueue.

    Attributes:
        route: GEMV, GEMM or DEQUANTIZE.
        config: The GEMV (mma or stream) or GEMM configuration (None for DEQUANTIZE).
        kernel: The name of the W4A16 kernel it launches (for DEQUANTIZE, the dequantizer).
        grid: That kernel's grid (for DEQUANTIZE, of one slice).
        threads: Threads a block.
        workspace: Bytes of scratch the caller passes as `W4A16Operands.workspace`.
    """

    owner: W4A16
    sizes: tuple[int, int, int]
    route: Route
    config: KernelConfig | None
    kernel: str
    grid: tuple[int, int, int]
    threads: int
    workspace: int = 0
    slices: tuple[_Slice, ...] = field(default=())

    def enqueue(self, gpu: Gpu, kernels: dict[str, Any], operands: W4A16Operands) -> None:
        """Queue the product on the GPU's stream (device addresses in `operands`).

        Raises:
            CodegenError: If the plan needs a workspace and `operands` has none.
        """
        m, n, k = self.sizes
        o = operands
        if self.workspace and not o.workspace:
            raise CodegenError(f"{self.kernel}: the {self.route.value} route needs a workspace")
        kernel = kernels[self.kernel]
        ints = (np.int32(m), np.int32(n), np.int32(k))
        if self.route is not Route.DEQUANTIZE:
            gpu.launch(
                kernel,
                self.grid,
                (self.threads, 1, 1),
                0,
                (o.a, o.b, o.scales, o.zeros, o.bias, o.y, *ints),
            )
            return
        w4 = self.owner
        blocks = -(-k // w4.block)
        row_bytes, zero_bytes = w4.padded_k(k) // 2, -(-blocks // 2)
        element = w4.dtype.itemsize
        weight = o.workspace
        library = o.workspace + _aligned(self.slices[0].rows * k * element)
        for part in self.slices:
            first, rows = part.first, part.rows
            pieces = rows * row_bytes // DEQUANTIZE_PIECE
            grid = (min(-(-pieces // self.threads), self.grid[0]), 1, 1)
            gpu.launch(
                kernel,
                grid,
                (self.threads, 1, 1),
                0,
                (
                    o.b + first * row_bytes,
                    o.scales + first * blocks * element,
                    o.zeros + first * zero_bytes if o.zeros else 0,
                    weight,
                    np.int32(rows),
                    np.int32(k),
                ),
            )
            addresses = {0: o.a, 1: weight, 2: o.y + first * element}
            gemm = part.plain
            if o.bias:
                addresses[3] = o.bias + first * element
                gemm = part.biased
            gemm.enqueue(addresses, library, gpu.stream_handle)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


@dataclass(frozen=True)
class W4A16:
    """One weight format (activation type, block size) and the kernels compiled for it.

    Attributes:
        gemv: The mma GEMV configurations the module holds (the rule picks among them).
        gemm: The GEMM configurations likewise.
        stream: The stream GEMV configurations likewise.

    Raises:
        CodegenError: If the type or block size has no kernel.
    """

    dtype: DType
    block: int
    gemv: tuple[GemvConfig, ...] = DEFAULT_GEMV
    gemm: tuple[GemmConfig, ...] = DEFAULT_GEMM
    stream: tuple[StreamConfig, ...] = DEFAULT_STREAM

    def __post_init__(self) -> None:
        if self.dtype not in _C_TYPES:
            raise CodegenError(f"W4A16 takes float16 or bfloat16 activations, not {self.dtype}")
        if self.block not in BLOCK_SIZES:
            raise CodegenError(f"W4A16 block size {self.block} is not one of {BLOCK_SIZES}")
        for family in ("gemv", "gemm", "stream"):  # a kernel is defined once a module
            object.__setattr__(self, family, tuple(dict.fromkeys(getattr(self, family))))

    @property
    def name(self) -> str:
        """The kernels' name prefix (`<name>_gemv_...`, `<name>_stream_...`, ...)."""
        return f"w4a16_{self.dtype.short}_b{self.block}"

    def kernel_name(self, config: KernelConfig | None) -> str:
        """The kernel of a configuration (None: the dequantizer)."""
        return f"{self.name}_{config.suffix if config else 'dequantize'}"

    @property
    def kernel_names(self) -> tuple[str, ...]:
        """Every kernel of the module."""
        return tuple(self.kernel_name(c) for c in self._configs())

    def _configs(self) -> list[KernelConfig | None]:
        return [*self.gemv, *self.stream, *self.gemm, None]

    def source(self) -> str:
        """The CUDA C++ of the module: its kernels (including w4a16.cuh)."""
        return "\n".join(self.kernel_source(c) for c in self._configs())

    def kernel_source(self, config: KernelConfig | None) -> str:
        """The CUDA C++ of one configuration's kernel (None: the dequantizer)."""
        t = _C_TYPES[self.dtype]
        if isinstance(config, GemvConfig):
            return render(
                "w4a16_gemv.cu",
                NAME=self.kernel_name(config),
                T=t,
                BLOCK=self.block,
                WARPS=config.warps,
                DEPTH=config.depth,
                SPLIT=config.split,
                CLUSTER=_cluster(config.split),
                MIN_BLOCKS=max(1, 16 // config.warps),  # 128 registers a thread at most
            )
        if isinstance(config, StreamConfig):
            return render(
                "w4a16_stream.cu",
                NAME=self.kernel_name(config),
                T=t,
                BLOCK=self.block,
                COLS=config.cols,
                ROWS=config.rows,
                UNROLL=config.unroll,
                WARPS=config.warps,
                SPLIT=config.split,
                AHEAD=str(config.ahead).lower(),
                EARLY=str(config.early).lower(),
                MIN_BLOCKS=config.min_blocks,
            )
        if isinstance(config, GemmConfig):
            return render(
                "w4a16_gemm.cu",
                NAME=self.kernel_name(config),
                T=t,
                BLOCK=self.block,
                WARPS=config.warps,
                BM=config.bm,
                DEPTH=config.depth,
                SPLIT=config.split,
                CLUSTER=_cluster(config.split),
                MIN_BLOCKS=config.min_blocks,
            )
        return render("w4a16_dequantize.cu", NAME=self.kernel_name(None), T=t, BLOCK=self.block)

    def padded_k(self, k: int) -> int:
        """K rounded up to whole blocks: the length of a packed weight row, in codes."""
        return -(-k // self.block) * self.block

    def check(self, m: int, n: int, k: int) -> None:
        """Refuse sizes no route can take.

        Raises:
            CodegenError: If a size is not positive, K is not a multiple of 8 (16-byte rows of
                A and of the dequantized weight), or the packed weight has 2^31 bytes or more,
                or A 2^31 elements (the kernels' 32-bit offsets).
        """
        if min(m, n, k) < 1:
            raise CodegenError(f"W4A16 sizes must be positive, got M={m}, N={n}, K={k}")
        if n * self.padded_k(k) // 2 >= 2**31:
            raise CodegenError(
                f"W4A16 weights must be under 2 GiB packed, got N={n}, K={k}: split N"
            )
        if m * k >= 2**31:
            raise CodegenError(f"W4A16 needs A under 2^31 elements, got M={m}, K={k}: split M")
        if k % 8:
            raise CodegenError(f"W4A16 needs K to be a multiple of 8, got {k}")

    def kernels_take(self, k: int) -> bool:
        """Whether the GEMV and GEMM kernels take K (the DEQUANTIZE route takes any `check` does).

        Their lanes load 16 bytes (32 codes) of a weight row at a time, so K padded to blocks
        must be a multiple of 32; the dequantizer reads 8 bytes at a time (DEQUANTIZE_PIECE).
        """
        return self.padded_k(k) % 32 == 0

    def plan(
        self,
        m: int,
        n: int,
        k: int,
        sm_count: int,
        blas: Blas | None = None,
        config: KernelConfig | Route | None = None,
    ) -> W4A16Plan:
        """How to compute one product: the rule's route and kernel, or `config`'s.

        The rule: M <= 8 takes the mma GEMV (but M <= STREAM_RULE_MAX_M the default stream
        GEMV with the fewest columns that hold M, if N gives every SM STREAM_MIN_WARPS warps
        of it), M >= DEQUANTIZE_MIN_M with `blas` the DEQUANTIZE
        route, anything else the GEMM with the smallest column tile that holds M (16, 32, 64);
        a K the kernels cannot take (`kernels_take`) goes the DEQUANTIZE route at any M.
        A cluster splits K into the fewest parts (of those compiled) that make two blocks an SM
        (one for the GEMV, whose blocks hold 8 warps), keeping two chunks a part.

        Args:
            m: Rows of A.
            n: Rows of W (output features).
            k: The reduced dimension.
            sm_count: The GPU's multiprocessors.
            blas: A cuBLASLt handle, which allows the DEQUANTIZE route.
            config: A compiled configuration to use instead of the rule's (benchmarks and
                tests), or Route.DEQUANTIZE (which needs `blas`).

        Raises:
            CodegenError: If the sizes are refused (see `check`), `config` is not compiled in
                or does not fit M, DEQUANTIZE is asked for without `blas`, or the kernels
                cannot take K and there is no `blas` (or `config` names a kernel).
        """
        self.check(m, n, k)
        kernels = self.kernels_take(k)
        if config is Route.DEQUANTIZE or (
            config is None and blas is not None and (m >= DEQUANTIZE_MIN_M or not kernels)
        ):
            if blas is None:
                raise CodegenError(f"{self.name}: the dequantize route needs a cuBLASLt handle")
            return self._dequantize_plan(m, n, k, sm_count, blas)
        if not kernels:
            raise CodegenError(
                f"{self.name}: the GEMV and GEMM kernels need K padded to blocks of {self.block} "
                f"to be a multiple of 32, got {self.padded_k(k)}: only the dequantize + cuBLASLt "
                "route takes it (give a cuBLASLt handle)"
            )
        if config is None:
            config = self._rule(m, n, k, sm_count)
        return self._kernel_plan(config, m, n, k)

    def _kernel_plan(self, config: KernelConfig | Route, m: int, n: int, k: int) -> W4A16Plan:
        """The launch of one of the module's kernels at these sizes.

        Raises:
            CodegenError: If `config` is not compiled in the module or does not fit M.
        """
        if isinstance(config, GemvConfig):
            if config not in self.gemv or m > GEMV_MAX_M:
                raise CodegenError(f"{self.name}: no GEMV {config} for M={m} in this module")
            route, grid = Route.GEMV, (-(-n // 16), 1, config.split)
        elif isinstance(config, StreamConfig):
            if config not in self.stream or m > config.cols:
                raise CodegenError(f"{self.name}: no stream GEMV {config} for M={m} in this module")
            route, grid = Route.GEMV, (-(-n // config.block_rows), 1, 1)
        elif isinstance(config, GemmConfig) and config in self.gemm:
            route, grid = Route.GEMM, (-(-n // config.rows), -(-m // config.bm), config.split)
        else:
            raise CodegenError(f"{self.name}: no kernel {config} in this module")
        kernel = self.kernel_name(config)
        return W4A16Plan(self, (m, n, k), route, config, kernel, grid, 32 * config.warps)

    def _rule(self, m: int, n: int, k: int, sm_count: int) -> KernelConfig:
        stream = self._stream_rule(m, n, sm_count)
        if stream is not None:
            return stream
        chunks = -(-self.padded_k(k) // CHUNK)
        if m <= GEMV_MAX_M:
            gemv = [c for c in self.gemv if c == GemvConfig(split=c.split)] or list(self.gemv)
            return _fewest_splits(gemv, -(-n // 16), sm_count, chunks)
        bm = next((b for b in GEMM_BMS if m <= b), GEMM_BMS[-1])
        gemm = [c for c in self.gemm if c.bm == bm and c.depth == gemm_depth(bm)]
        gemm = gemm or [c for c in self.gemm if c.bm >= min(m, GEMM_BMS[-1])] or list(self.gemm)
        tiles = -(-n // gemm[0].rows) * -(-m // gemm[0].bm)
        return _fewest_splits(gemm, tiles, 2 * sm_count, chunks)

    def _stream_rule(self, m: int, n: int, sm_count: int) -> StreamConfig | None:
        """The stream GEMV the rule takes at M, or None (then the mma GEMV).

        That is, up to M = STREAM_RULE_MAX_M, the default configuration with the fewest
        columns that hold M, if its rows give every SM STREAM_MIN_WARPS warps.
        """
        if m > STREAM_RULE_MAX_M:
            return None
        holding = [c for c in self.stream if m <= c.cols]
        defaults = [c for c in holding if c in DEFAULT_STREAM] or holding
        config = min(defaults, key=lambda c: c.cols, default=None)
        if config is None or -(-n // config.rows) * config.split < STREAM_MIN_WARPS * sm_count:
            return None
        return config

    def _dequantize_plan(self, m: int, n: int, k: int, sm_count: int, blas: Blas) -> W4A16Plan:
        from knopt.cuda.steps import Gemm, Operand

        element = self.dtype.itemsize
        rows = min(n, max(128, DEQUANTIZE_LIMIT // (k * element) // 128 * 128))
        slices = []
        for first in range(0, n, rows):
            width = min(rows, n - first)
            plain = Gemm(
                a=Operand(0, m, k, k, 1, 0),
                b=Operand(1, k, width, 1, k, 0),  # W^T: the dequantized rows, K apart
                d=Operand(2, m, width, n, 1, 0),
                batch=1,
                dtype=self.dtype,
                precision=_PRECISION[self.dtype],
            )
            biased = replace(plain, bias=3)
            slices.append(_Slice(first, width, _float_gemm(blas, plain), _float_gemm(blas, biased)))
        library = max(max(s.plain.workspace, s.biased.workspace) for s in slices)
        grid = (8 * sm_count, 1, 1)  # the most blocks of a slice; fewer when it is small
        return W4A16Plan(
            self,
            (m, n, k),
            Route.DEQUANTIZE,
            None,
            self.kernel_name(None),
            grid,
            DEQUANTIZE_THREADS,
            _aligned(rows * k * element) + library,
            tuple(slices),
        )

    def workspace_bytes(self, m: int, n: int, k: int, sm_count: int) -> int:
        """Bytes of scratch the rule's plan without cuBLASLt needs (none)."""
        return self.plan(m, n, k, sm_count).workspace

    def launch(
        self,
        gpu: Gpu,
        kernels: dict[str, Any],
        operands: W4A16Operands,
        sizes: tuple[int, int, int],
        sm_count: int,
    ) -> None:
        """Queue `Y = A @ W^T + bias` by the rule's plan without cuBLASLt (a GEMV or GEMM).

        Raises:
            CodegenError: If the sizes are refused (see `check`).
        """
        self.plan(*sizes, sm_count).enqueue(gpu, kernels, operands)


def _cluster(split: int) -> str:
    return f"__cluster_dims__(1, 1, {split})" if split > 1 else ""


def _fewest_splits(configs: list[Any], tiles: int, wanted: int, chunks: int) -> Any:
    """The config with the fewest K splits giving `wanted` blocks, two chunks a split at least."""
    usable = sorted(
        (c for c in configs if c.split == 1 or chunks >= 2 * c.split), key=lambda c: c.split
    ) or sorted(configs, key=lambda c: c.split)
    for config in usable:
        if tiles * config.split >= wanted:
            return config
    return usable[-1]
