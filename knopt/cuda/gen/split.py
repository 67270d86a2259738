"""Strict-f32 GEMMs on TF32 tensor cores, split in three ("3xTF32").

Each f32 operand element is `x = hi + lo`: `hi` is `x` rounded to TF32 (10 mantissa bits) and
`lo = x - hi` is exact in f32, with |lo| <= 2^-11 |x|. Then

    a @ b = hi_a @ hi_b + hi_a @ lo_b + lo_a @ hi_b  (+ lo_a @ lo_b, below f32's rounding)

and TF32 keeps 11 of lo's at most 13 significant bits, so every product is good to about 2^-21
relative, and sums accumulate in f32: results stay at strict f32's error level (measured in
tests/cuda/test_split.py). The three products are ONE TF32 GEMM of thrice the depth, over
operands laid side by side, `[hi_a | hi_a | lo_a] @ [hi_b ; lo_b ; hi_b]`, with the step's
epilogue unchanged. Constant operands (weights) are split once on the host; any other operand
by a kernel (codegen/tf32_split.cu), once per tensor however many GEMMs read it. One difference
from strict f32 remains: an infinite operand element meets the zero `lo` of the other operand
(`inf * 0`), so a result strict f32 makes infinite comes out NaN.

Whether it pays is the cost model's roofline (`split_pays`): three times the arithmetic at the
TF32 rate and three times the operand reads, plus the splitting kernels, against one strict
GEMM at the f32 SIMT rate. Large GEMMs are compute-bound and win (the H200's TF32 tensor cores
are about 7x its f32 rate); at batch 1 weight reads dominate and three GEMMs' worth loses.
`KNOPT_SPLIT_F32` = auto (default) | always | never overrides the choice.
"""

from __future__ import annotations

import os

import numpy as np

from knopt.cuda.context import LoweringContext
from knopt.cuda.gen.indexing import PLACEHOLDER, blocks, decompose, index_type, named, offset
from knopt.cuda.layout import Layout
from knopt.cuda.steps import Buf, Launch, Operand
from knopt.cuda.templates import render
from knopt.errors import KnoptError
from knopt.ir.dtype import DType
from knopt.opt.cost import H200_GRAPH, DeviceProfile

SPLIT_ENV = "KNOPT_SPLIT_F32"
POLICIES = ("auto", "always", "never")
THREADS = 256
# TF32 tensor cores run at half the f16 rate on Ampere and Hopper (H100/H200: 495 against 990
# dense TFLOP/s), so the profile's f16 peak gives the TF32 one.
TF32_PER_F16 = 0.5
# (first, second, third) of each side: a = [hi | hi | lo] along K, b = [hi ; lo ; hi].
_PARTS = {"a": ("hi", "hi", "lo"), "b": ("hi", "lo", "hi")}


def policy() -> str:
    """The split policy from `KNOPT_SPLIT_F32` (auto, always or never).

    Raises:
        KnoptError: If the variable holds something else.
    """
    value = os.environ.get(SPLIT_ENV, "auto").strip().lower() or "auto"
    if value not in POLICIES:
        raise KnoptError(f"{SPLIT_ENV}={value!r} is not one of {', '.join(POLICIES)}")
    return value


def split_pays(
    m: int,
    n: int,
    k: int,
    batches: tuple[int, int, int],
    computed: tuple[bool, bool],
    profile: DeviceProfile = H200_GRAPH,
) -> bool:
    """Whether a 3xTF32 GEMM beats the strict one under `profile`'s roofline.

    Args:
        m: Rows of a and d.
        n: Columns of b and d.
        k: Columns of a, rows of b.
        batches: How many distinct a, b and d matrices there are (1 for a shared one).
        computed: Whether a and b need a splitting kernel (constants are split on the host).
        profile: The device's roofline figures.
    """
    item = DType.F32.itemsize
    a, b, d = (m * k * batches[0], k * n * batches[1], m * n * batches[2])
    flops = 2.0 * m * n * k * batches[2]
    bandwidth = profile.bandwidth
    strict = max((a + b + d) * item / bandwidth, flops / profile.peak["f32"])
    tf32 = profile.peak["f16"] * TF32_PER_F16
    split = max((3 * a + 3 * b + d) * item / bandwidth, 3 * flops / tf32)
    for size, is_computed in zip((a, b), computed, strict=True):
        if is_computed:  # read once, written three times
            split += profile.launch + 4 * size * item / bandwidth
    return split < strict


def round_tf32(x: np.ndarray) -> np.ndarray:
    """`x` (f32) rounded to TF32, to nearest with ties to even; non-finite values kept."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0xFFF) + ((bits >> np.uint32(13)) & np.uint32(1))) & np.uint32(
        0xFFFFE000
    )
    hi = rounded.view(np.float32)
    truncated = (bits & np.uint32(0xFFFFE000)).view(np.float32)
    with np.errstate(invalid="ignore"):
        hi = np.where(np.isfinite(hi), hi, truncated)
    return np.where(np.isfinite(x), hi, x).astype(np.float32)


def split_host(x: np.ndarray, side: str) -> np.ndarray:
    """The split operand of `x` [batch, rows, cols]: parts side by side along K."""
    x = np.asarray(x, dtype=np.float32)
    hi = round_tf32(x)
    with np.errstate(invalid="ignore"):
        lo = np.where(np.isfinite(x), x - hi, np.float32(0))
    parts = {"hi": hi, "lo": lo.astype(np.float32)}
    axis = -1 if side == "a" else -2
    return np.concatenate([parts[p] for p in _PARTS[side]], axis=axis)


def split_operand(ctx: LoweringContext, operand: Operand, batch: int, side: str) -> Operand:
    """The dense split form of GEMM operand `operand` (side "a": m x k, "b": k x n).

    The split tensor is made once per operand (a constant on the host, else by a kernel
    appended now) and shared by later GEMMs reading the same operand.
    """
    count = batch if operand.batch_stride else 1
    rows, cols = operand.rows, operand.cols
    shape = (count, rows, 3 * cols) if side == "a" else (count, 3 * rows, cols)
    key = ("3xtf32", side, operand, count)
    if key not in ctx.derived:
        value = ctx.constant_value(
            operand.tensor,
            (count, rows, cols),
            (operand.batch_stride, operand.row_stride, operand.col_stride),
        )
        if value is not None:
            tid = ctx.new_constant(split_host(value, side), DType.F32, Layout.contiguous(shape))
        else:
            tid = ctx.new_tensor(shape, DType.F32)
            ctx.emit(split_launch(ctx, tid, operand, count, side))
        ctx.derived[key] = tid
    tid = ctx.derived[key]
    _, out_rows, out_cols = shape
    return Operand(tid, out_rows, out_cols, out_cols, 1, out_rows * out_cols if count > 1 else 0)


def split_launch(ctx: LoweringContext, out: int, operand: Operand, count: int, side: str) -> Launch:
    """The kernel writing the split of `operand` into dense `out` [count, rows', cols']."""
    rows, cols = operand.rows, operand.cols
    total = count * rows * cols
    source_layout = ctx.layout(operand.tensor)
    extent = abs(source_layout.offset) + (count - 1) * abs(operand.batch_stride)
    extent += (rows - 1) * operand.row_stride + (cols - 1) * operand.col_stride + 1
    itype = index_type(2 * 3 * total, 2 * extent)
    in_offset = offset("c", (operand.batch_stride, operand.row_stride, operand.col_stride))
    if side == "a":  # [count, rows, 3 cols]: the parts are cols apart along each row
        out_offset = offset("c", (3 * rows * cols, 3 * cols, 1))
        part = cols
    else:  # [count, 3 rows, cols]: the parts are rows apart
        out_offset = offset("c", (3 * rows * cols, cols, 1))
        part = rows * cols
    first, second, third = _PARTS[side]
    source = render(
        "tf32_split.cu",
        NAME=PLACEHOLDER,
        THREADS=THREADS,
        INDEX=itype,
        COUNT=total,
        COORDS="\n".join("  " + line for line in decompose("i", (count, rows, cols), "c", itype)),
        IN_OFFSET=in_offset,
        OUT_OFFSET=out_offset,
        PART=part,
        FIRST=first,
        SECOND=second,
        THIRD=third,
    )
    name, source = named("tf32_split", source)
    return Launch(
        name,
        source,
        (blocks(total, THREADS), 1, 1),
        (THREADS, 1, 1),
        (Buf(out), Buf(operand.tensor)),
    )
