"""Weight-only int4 matrix products (W4A16) on the GPU: codegen/w4a16*.cu and how to launch them.

`Y[M, N] = A[M, K] @ W[N, K]^T + bias` for float16 or bfloat16 A and a weight packed as
onnxruntime's `com.microsoft.MatMulNBits` stores it (4-bit codes two a byte along K, blocked
scales of A's type, optional packed 4-bit zero points), dequantized in registers: the weight
moves from memory at half a byte an element, a quarter of what float16 needs.

Two kernels share the dequantization and the tensor-core product (mma.m16n8k16, fp32
accumulation): for M <= 8 a bandwidth-bound one that splits K over the warps of a block, for
larger M a tiled one (64 x 64 outputs a block, A staged in shared memory) that splits K over
blocks when there are too few tiles to fill the GPU, adding the splits in a third kernel.
Sizes are launch arguments, so one compiled module (per activation type and block size) serves
every M, N and K. This module only plans and launches; it holds no device memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from knopt.cuda.templates import render
from knopt.errors import CodegenError
from knopt.ir.dtype import DType

if TYPE_CHECKING:
    from knopt.cuda.driver import Gpu

BLOCK_SIZES = (16, 32, 64, 128, 256)
GEMV_MAX_M = 8  # the mma's 8-column operand holds every row of A
GEMV_WARPS = 8
GEMM_THREADS = 128
GEMM_TILE = 64  # outputs a block, along M and along N
CHUNK = 128  # k a warp consumes per step
MAX_SPLITS = 8
_C_TYPES = {DType.F16: "__half", DType.BF16: "__nv_bfloat16"}


@dataclass(frozen=True)
class W4A16:
    """One weight format: activation type, block size; the sizes come at launch.

    Raises:
        CodegenError: If the type or block size has no kernel.
    """

    dtype: DType
    block: int

    def __post_init__(self) -> None:
        if self.dtype not in _C_TYPES:
            raise CodegenError(f"W4A16 takes float16 or bfloat16 activations, not {self.dtype}")
        if self.block not in BLOCK_SIZES:
            raise CodegenError(f"W4A16 block size {self.block} is not one of {BLOCK_SIZES}")

    @property
    def name(self) -> str:
        """The kernels' name prefix (`<name>_gemv`, `<name>_gemm`, `<name>_reduce`)."""
        return f"w4a16_{self.dtype.short}_b{self.block}"

    @property
    def kernel_names(self) -> tuple[str, str, str]:
        """The three kernels of the module."""
        return (f"{self.name}_gemv", f"{self.name}_gemm", f"{self.name}_reduce")

    def source(self) -> str:
        """The CUDA C++ of the module: the three kernels (including w4a16.cuh)."""
        return "\n".join(self.kernel_sources())

    def kernel_sources(self) -> tuple[str, str, str]:
        """Each kernel's CUDA C++ on its own (gemv, gemm, reduce), as launches hold them."""
        gemv, gemm, reduce = self.kernel_names
        t = _C_TYPES[self.dtype]
        return (
            render("w4a16_gemv.cu", NAME=gemv, T=t, BLOCK=self.block, WARPS=GEMV_WARPS),
            render("w4a16_gemm.cu", NAME=gemm, T=t, BLOCK=self.block),
            render("w4a16_reduce.cu", NAME=reduce, T=t),
        )

    def padded_k(self, k: int) -> int:
        """K rounded up to whole blocks: the length of a packed weight row, in codes."""
        return -(-k // self.block) * self.block

    def check(self, m: int, n: int, k: int) -> None:
        """Refuse sizes the kernels cannot take.

        Raises:
            CodegenError: If a size is not positive, K is not a multiple of 8 (16-byte rows of
                A) or K padded to blocks is not a multiple of 32 (16-byte weight loads).
        """
        if min(m, n, k) < 1:
            raise CodegenError(f"W4A16 sizes must be positive, got M={m}, N={n}, K={k}")
        if k % 8:
            raise CodegenError(f"W4A16 needs K to be a multiple of 8, got {k}")
        if self.padded_k(k) % 32:
            raise CodegenError(
                f"W4A16 needs K padded to blocks of {self.block} to be a multiple of 32, got "
                f"{self.padded_k(k)}"
            )

    def splits(self, m: int, n: int, k: int, sm_count: int) -> int:
        """How many ways the tiled kernel splits K: enough blocks for two waves, at most 8."""
        tiles = -(-n // GEMM_TILE) * -(-m // GEMM_TILE)
        chunks = -(-self.padded_k(k) // CHUNK)
        wanted = -(-2 * sm_count // tiles)
        return max(1, min(wanted, MAX_SPLITS, chunks))

    def workspace_bytes(self, m: int, n: int, k: int, sm_count: int) -> int:
        """Bytes of fp32 partial sums the launch needs (0 without a K split)."""
        if m <= GEMV_MAX_M:
            return 0
        splits = self.splits(m, n, k, sm_count)
        return 0 if splits == 1 else splits * m * n * 4

    def launch(
        self,
        gpu: Gpu,
        kernels: dict[str, Any],
        operands: W4A16Operands,
        sizes: tuple[int, int, int],
        sm_count: int,
    ) -> None:
        """Queue `Y = A @ W^T + bias` (device addresses in `operands`; 0 for absent ones).

        Raises:
            CodegenError: If the sizes are refused (see `check`) or a K split has no workspace.
        """
        m, n, k = sizes
        self.check(m, n, k)
        gemv, gemm, reduce = (kernels[name] for name in self.kernel_names)
        o = operands
        ints = (np.int32(m), np.int32(n), np.int32(k))
        if m <= GEMV_MAX_M:
            gemv_args = (o.a, o.b, o.scales, o.zeros, o.bias, o.y, *ints)
            gpu.launch(gemv, (-(-n // 16), 1, 1), (32 * GEMV_WARPS, 1, 1), 0, gemv_args)
            return
        splits = self.splits(m, n, k, sm_count)
        if splits > 1 and not o.workspace:
            raise CodegenError(f"{self.name}: a {splits}-way K split needs a workspace")
        grid = (-(-n // GEMM_TILE), -(-m // GEMM_TILE), splits)
        args = (o.a, o.b, o.scales, o.zeros, o.bias, o.y, o.workspace, *ints)
        gpu.launch(gemm, grid, (GEMM_THREADS, 1, 1), 0, args)
        if splits > 1:
            blocks = min(-(-m * n // 256), 4 * sm_count)
            sums = (o.workspace, o.bias, o.y, np.int32(m), np.int32(n), np.int32(splits))
            gpu.launch(reduce, (blocks, 1, 1), (256, 1, 1), 0, sums)


@dataclass(frozen=True)
class W4A16Operands:
    """Device addresses of one product's tensors (0 where an optional one is absent).

    Attributes:
        a: Activations [M, K], row-major, 16-byte aligned.
        b: Packed codes, uint8 [N, K_pad / 2] (MatMulNBits' [N, k_blocks, blob_size]).
        scales: [N, k_blocks] of the activation type.
        zeros: Packed 4-bit zero points, uint8 [N, ceil(k_blocks / 2)], or 0 for 8.
        bias: [N] of the activation type, or 0.
        y: The output [M, N].
        workspace: fp32 scratch of `W4A16.workspace_bytes` bytes, or 0 when that is 0.
    """

    a: int
    b: int
    scales: int
    y: int
    zeros: int = 0
    bias: int = 0
    workspace: int = 0
