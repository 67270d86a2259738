"""Half-precision GEMVs of a decoding step on the CUDA cores, in place of cuBLASLt's.

A linear layer at M <= MAX_ROWS rows (a decoding step's tokens) reads its weight once and does
little arithmetic: its time is the weight's bytes at the memory's bandwidth plus what comes
before the first byte arrives. cuBLASLt's GEMVs reach about 76% of an H200's bandwidth there,
and, being library kernels, start only once the kernel ahead has finished. knopt's GEMV
(codegen/gemv.cu) is one of its own kernels: launched with programmatic dependent launch, its
blocks become resident while the kernel ahead (a norm, the attention) still runs, and load
their first pieces of the weight before they wait for it, so the weight streams in while the
small kernels of the step run.

It takes a `Gemm` step (`library.gemm_step`) where all of these hold, else the step stays a
cuBLASLt call: one matrix (batch 1) of at most MAX_ROWS rows; float16 or bfloat16 in half
precision; B a constant (a weight: never written, which the early loads need) stored [K, N]
row-major as ONNX MatMul keeps it; A row-major; K and N multiples of 8 and A, B 16-byte
aligned (16-byte loads); D dense; no activation (alpha, bias and residual are fused).
`KNOPT_GEMV=0` keeps every GEMM on cuBLASLt.

Each block owns 64 columns of the weight and shares K with the other SPLIT blocks of a thread
block cluster, SPLIT chosen so the grid has TARGET_BLOCKS blocks where K allows; the sums meet
in a fixed order (deterministic results). Sizes are launch arguments: one kernel per type,
column count (1, 2, 4 or 8 rows of A held) and split.

Measured on an H200 (benchmarks/gemv.py, the 16-layer decoder of benchmarks/decode.py, fresh
weights each launch; benchmarks/RESULTS.md, 2026-12-04): at M = 1 1.02-1.65x cuBLASLt's speed
(the small O and down projections gain most), at M = 2 0.97-1.42x, at M = 4 0.58-0.81x (its
fp32 FMAs on the CUDA cores), hence MAX_ROWS = 2; the fastest split of every layer gave
128-192 blocks. A batch-1 decoding step went from 1.008 to 0.914 ms.
"""

from __future__ import annotations

import os

import numpy as np

from knopt.cuda.context import LoweringContext
from knopt.cuda.gen.indexing import PLACEHOLDER, named
from knopt.cuda.steps import Buf, Gemm, Launch
from knopt.cuda.templates import render
from knopt.ir.dtype import DType

ENV = "KNOPT_GEMV"
MAX_ROWS = 2  # measured (module docstring): from 4 rows cuBLASLt is faster
TILE = 64  # columns of W a block (codegen/gemv.cu: 8 lanes of 8 columns)
THREADS = 256
K_LANES = THREADS // 8  # k-lanes a block: each takes chunks of 8 rows of W
SMS = 132  # an H200's multiprocessors (any count is correct; only the split changes)
TARGET_BLOCKS = SMS - SMS // 8  # about a block an SM: measured (module docstring)
SPLITS = (1, 2, 4, 8)  # blocks of a cluster (8: the portable cluster size)
_C_TYPES = {DType.F16: "__half", DType.BF16: "__nv_bfloat16"}
_PRECISIONS = {DType.F16: "fp16", DType.BF16: "bf16"}
NULL = np.uint64(0)  # an absent pointer argument


def enabled() -> bool:
    """Whether GEMMs that fit go to knopt's GEMV (`KNOPT_GEMV` is not "0")."""
    return os.environ.get(ENV, "1").strip() != "0"


def columns(rows: int) -> int:
    """Rows of A the kernel holds for `rows`: the next of 1, 2, 4, 8."""
    return next(c for c in (1, 2, 4, 8) if rows <= c)


def split_for(n: int, k: int) -> int:
    """Blocks sharing K: the fewest giving TARGET_BLOCKS blocks where each k-lane keeps a chunk.

    Fewer, larger blocks sum less across the cluster; on an H200 at M = 1 the fastest split
    of each layer of benchmarks/gemv.py gave 128 to 192 blocks, never twice that.
    """
    tiles = -(-n // TILE)
    usable = [s for s in SPLITS if s == 1 or k // 8 >= s * K_LANES]
    return next((s for s in usable if tiles * s >= TARGET_BLOCKS), usable[-1])


def fits(ctx: LoweringContext, step: Gemm) -> bool:
    """Whether the GEMV computes `step` (module docstring)."""
    a, b, d = step.a, step.b, step.d
    if not (
        enabled()
        and step.batch == 1
        and step.dtype in _C_TYPES
        and step.precision == _PRECISIONS[step.dtype]
        and step.activation == ""
        and a.rows <= MAX_ROWS
        and a.col_stride == 1
        and (a.rows == 1 or a.row_stride % 8 == 0)
        and b.row_stride == b.cols
        and b.col_stride == 1
        and b.cols % 8 == 0
        and b.rows % 8 == 0
        and d.row_stride == d.cols
        and d.col_stride == 1
        and (step.residual is None or step.residual.row_stride == d.cols)
    ):
        return False
    if ctx.buffers[ctx.tensor(b.tensor).buffer].region != "constant":
        return False
    return step.alignment[0] >= 16 and step.alignment[1] >= 16


def kernel_source(dtype: DType, cols: int, split: int, early: bool = True) -> str:
    """The CUDA C++ of one GEMV kernel (named by PLACEHOLDER until `named`)."""
    return render(
        "gemv.cu",
        NAME=PLACEHOLDER,
        T=_C_TYPES[dtype],
        COLS=cols,
        SPLIT=split,
        EARLY=str(early).lower(),
        CLUSTER=f"__cluster_dims__(1, {split}, 1)" if split > 1 else "",
        MIN_BLOCKS=2 if cols <= 2 else 1,
    )


def gemv_launch(step: Gemm, early: bool = True) -> Launch:
    """The launch computing `step` (which `fits`)."""
    a, b, d = step.a, step.b, step.d
    m, k, n = a.rows, a.cols, b.cols
    split = split_for(n, k)
    name, source = named("gemv", kernel_source(step.dtype, columns(m), split, early))
    bias = Buf(step.bias) if step.bias is not None else NULL
    residual = Buf(step.residual.tensor) if step.residual is not None else NULL
    args = (
        Buf(a.tensor),
        Buf(b.tensor),
        bias,
        residual,
        Buf(d.tensor),
        np.int32(m),
        np.int32(n),
        np.int32(k),
        np.int32(a.row_stride if m > 1 else k),
        np.float32(step.alpha),
    )
    return Launch(name, source, (-(-n // TILE), split, 1), (THREADS, 1, 1), args)
