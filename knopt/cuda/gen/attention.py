"""Attention: flash kernels that keep the scores out of memory, or GEMM, softmax, GEMM.

f16 and bf16 with head sizes that are multiples of 8 up to 256 run on tensor cores
(codegen/attention_mma.cu); when the query tiles alone would leave most multiprocessors idle
(decoding: one query row against a long cache), the keys are split over blocks and the last
block of each row tile to finish merges the parts in the same launch (`merge_splits` in
codegen/attention.cuh). Other float types and head sizes up to 256 take the exact kernel,
which computes in f32 (codegen/attention.cu); everything else materializes the scores (GEMM,
softmax, GEMM).

A constant bias that is a causal mask (models export it as such a bias) is not read: the
tensor-core kernel computes it from the indices and skips the key tiles it hides entirely.

Kernel sources depend only on compile-time facts: dtype, head sizes, tile shape and flags
(bias read, causal, operands aligned for 16-byte copies). Sequence lengths, head counts and
every stride are launch arguments (`Geometry`, `size_args`), so one compiled kernel serves every
size; the tile shape (`mma_tiles`) and the key split (`split_keys`) are chosen per size.

A tensor-core attention past decoding (more than DECODE_ROWS query rows) whose operands cuDNN
can read in place becomes an `Sdpa` step instead: cuDNN's fused attention, about 2.5x faster
than the kernel above on the H200 (BERT-base 8 x 128: 54 against 137 us a layer), with that
kernel kept in the step for when cuDNN declines the graph (`knopt.cuda.sdpa`). `KNOPT_SDPA=0`
keeps every attention on knopt's kernels.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass

import numpy as np

from knopt.cuda.cexpr import storage_type
from knopt.cuda.context import LoweringContext
from knopt.cuda.gen import rowwise
from knopt.cuda.gen.attention_nan import nan_rows_launch
from knopt.cuda.gen.attention_views import AttentionViews, attention_views
from knopt.cuda.gen.indexing import PLACEHOLDER, index_type, named
from knopt.cuda.gen.library import FusedEpilogue, gemm_step
from knopt.cuda.layout import Layout, merge_axes
from knopt.cuda.steps import Arg, Buf, Launch, Sdpa
from knopt.cuda.templates import render
from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.op import Binary
from knopt.ir.program import BinaryE, Kernel, Load

EXACT_DTYPES = frozenset({DType.F32, DType.F16, DType.BF16})
MMA_DTYPES = frozenset({DType.F16, DType.BF16})
MAX_HEAD = 256
MMA_HEAD_MULTIPLE = 8  # 16-byte rows; odd multiples of 8 are padded to 16 inside the kernel
THREADS = 128
LEAD_AXES = 3  # leading (batch, head) axes the kernels index; more fall back to GEMMs
MULTIPROCESSORS = 132  # an H200's
TARGET_BLOCKS = 2 * MULTIPROCESSORS  # blocks that keep every multiprocessor busy
DECODE_ROWS = 16  # up to this many query rows, one row tile whose warps split the keys
SDPA_ENV = "KNOPT_SDPA"  # "0": attentions stay on knopt's kernels (cuDNN's is the default)


@dataclass(frozen=True)
class Geometry:
    """The run-time facts of one attention: sizes and each operand's strides.

    Attributes:
        s: Query rows.
        t: Keys.
        d: The head size of q and k.
        e: The head size of v and out.
        lead: The sizes of three leading axes (heads = their product).
        strides: For q, k, v, bias and out: the strides of the leading axes, rows, columns.
        offsets: Each operand's element offset in its buffer (for alignment checks).
    """

    s: int
    t: int
    d: int
    e: int
    lead: tuple[int, ...]
    strides: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]

    @property
    def heads(self) -> int:
        """The number of (batch, head) pairs."""
        return self.lead[0] * self.lead[1] * self.lead[2]

    def extent(self) -> int:
        """One past the largest element offset any operand reaches."""
        matrices = ((self.s, self.d), (self.t, self.d), (self.t, self.e), (self.s, self.t))
        last = 0
        for (rows, cols), strides, start in zip(
            (*matrices, (self.s, self.e)), self.strides, self.offsets, strict=True
        ):
            dims = (*self.lead, rows, cols)
            reach = sum((n - 1) * abs(st) for n, st in zip(dims, strides, strict=True))
            last = max(last, abs(start) + reach + 1)
        return last


def geometry_of(layouts: tuple[Layout, ...]) -> Geometry | None:
    """The geometry of q, k, v, bias and out layouts; None if over LEAD_AXES leading axes remain.

    Leading axes are merged where every operand walks them densely together, as for any
    generated kernel.
    """
    q, _, v, _, out = layouts
    s, d = q.shape[-2:]
    t, e = v.shape[-2:]
    dims, strides = merge_axes(out.shape[:-2], [lay.strides[:-2] for lay in layouts])
    if len(dims) > LEAD_AXES:
        return None
    pad = LEAD_AXES - len(dims)
    lead = (1,) * pad + dims
    full = tuple(
        (*((0,) * pad + st), lay.strides[-2], lay.strides[-1])
        for st, lay in zip(strides, layouts, strict=True)
    )
    return Geometry(s, t, d, e, lead, full, tuple(lay.offset for lay in layouts))


class BiasMode(enum.Enum):
    """How a kernel treats the bias operand."""

    NONE = "none"  # all zeros: never read
    CAUSAL = "causal"  # a causal mask: computed from the indices, fully masked tiles skipped
    TENSOR = "tensor"  # read element by element


# A causal mask's hidden value may be finite (exporters write the dtype's lowest, -65504 in
# f16): exp(score + m - row max) underflows to exactly 0 in f32 once it is below -104, which
# holds for m <= -1e4 as long as every row's max score is above m + 104. A causal row always
# sees its diagonal key, so that fails only for scores below about -9896.
CAUSAL_HIDDEN = -1e4


def bias_mode(ctx: LoweringContext, bias: int, g: Geometry) -> BiasMode:
    """NONE or CAUSAL for a constant bias equal for every head that allows it, else TENSOR.

    CAUSAL: 0 where key <= row + t - s, at most CAUSAL_HIDDEN elsewhere, and t >= s (so every
    row sees a key: with a finite hidden value, a row that sees none would average them all).
    """
    layout = ctx.layout(bias)
    data = ctx.constants.get(ctx.tensor(bias).buffer)
    if data is None or any(g.strides[3][:3]):
        return BiasMode.TENSOR
    flat = np.ascontiguousarray(data).reshape(-1)
    row_stride, col_stride = g.strides[3][3:]
    if row_stride == col_stride == 0:  # one value for every score
        return BiasMode.NONE if flat[layout.offset] == 0 else BiasMode.TENSOR
    matrix = np.lib.stride_tricks.as_strided(
        flat[layout.offset :],
        (g.s, g.t),
        (row_stride * flat.itemsize, col_stride * flat.itemsize),
        writeable=False,
    )
    if np.all(matrix == 0):
        return BiasMode.NONE
    visible = np.arange(g.t)[None, :] <= np.arange(g.s)[:, None] + (g.t - g.s)
    if g.t >= g.s and np.all(matrix[visible] == 0) and np.all(matrix[~visible] <= CAUSAL_HIDDEN):
        return BiasMode.CAUSAL
    return BiasMode.TENSOR


@dataclass(frozen=True)
class MmaTiles:
    """The tile shape of the tensor-core kernel: warps along rows and keys, keys per tile."""

    warps_m: int
    warps_n: int
    block_n: int

    @property
    def block_m(self) -> int:
        """Query rows per block."""
        return 16 * self.warps_m


def mma_tiles(s: int, d: int, e: int) -> MmaTiles:
    """Prefill: 4 warps of 16 rows each; decoding (s <= 16): 4 warps splitting each key tile."""
    if s <= DECODE_ROWS:
        return MmaTiles(1, 4, 64)
    return MmaTiles(4, 1, 64 if max(_pad16(d), _pad16(e)) <= 128 else 32)


def _pad16(n: int) -> int:
    return -(-n // 16) * 16


def mma_shared_bytes(tiles: MmaTiles, d: int, e: int) -> int:
    """Dynamic shared memory bytes of the tensor-core kernel.

    That is q, two k and two v tiles (2 bytes per element, rows 16 bytes longer), or, if
    larger, the f32 merge of the warps' results when warps split the keys.
    """
    pitch_q, pitch_v = _pad16(d) + 8, _pad16(e) + 8
    tiles_bytes = 2 * (tiles.block_m * pitch_q + 2 * tiles.block_n * (pitch_q + pitch_v))
    if tiles.warps_n == 1:
        return tiles_bytes
    merge_bytes = 4 * tiles.warps_n * tiles.block_m * (2 + _pad16(e))
    return max(tiles_bytes, merge_bytes)


def split_keys(blocks: int, key_tiles: int) -> tuple[int, int]:
    """(splits, key tiles per split) for a grid of `blocks` row tiles.

    Splitting pays when the row tiles alone would not give every multiprocessor a block: then
    the keys are cut into about TARGET_BLOCKS / blocks ranges of whole tiles, none empty.
    """
    if blocks >= MULTIPROCESSORS or key_tiles < 2:
        return 1, key_tiles
    per = -(-key_tiles // -(-TARGET_BLOCKS // blocks))
    return -(-key_tiles // per), per


def mma_source(
    dtype: DType,
    d: int,
    e: int,
    tiles: MmaTiles,
    bias: BiasMode,
    vec: tuple[bool, ...],
    itype: str,
) -> tuple[str, str]:
    """The (name, source) of a tensor-core attention kernel; `vec`: 16-byte rows of q, k, v."""
    source = render(
        "attention_mma.cu",
        NAME=PLACEHOLDER,
        ELEM=storage_type(dtype),
        INDEX=itype,
        WARPS_M=tiles.warps_m,
        WARPS_N=tiles.warps_n,
        BLOCK_N=tiles.block_n,
        D=d,
        E=e,
        HAS_BIAS=_bool(bias is BiasMode.TENSOR),
        CAUSAL=_bool(bias is BiasMode.CAUSAL),
        VEC_Q=_bool(vec[0]),
        VEC_K=_bool(vec[1]),
        VEC_V=_bool(vec[2]),
    )
    return named("attention_mma", source)


def exact_source(
    dtype: DType,
    d: int,
    e: int,
    rows_per_thread: int,
    block_n: int,
    has_bias: bool,
    itype: str,
) -> tuple[str, str]:
    """The (name, source) of the f32-arithmetic attention kernel."""
    source = render(
        "attention.cu",
        NAME=PLACEHOLDER,
        ELEM=storage_type(dtype),
        INDEX=itype,
        ROWS_PER_THREAD=rows_per_thread,
        BLOCK_N=block_n,
        D=d,
        E=e,
        HAS_BIAS=_bool(has_bias),
    )
    return named("attention", source)


def _bool(flag: bool) -> str:
    return "true" if flag else "false"


def _index(itype: str) -> type[np.integer]:
    return np.int32 if itype == "int" else np.int64


def size_args(geometry: Geometry, scale: float, itype: str) -> tuple[np.generic, ...]:
    """scale, s_len, t_len, n1, n2 and the 25 strides: the kernels' scalar arguments in order."""
    g = geometry
    index = _index(itype)
    head: tuple[np.generic, ...] = (
        np.float32(scale),
        np.int32(g.s),
        np.int32(g.t),
        np.int32(g.lead[1]),
        np.int32(g.lead[2]),
    )
    return head + tuple(index(st) for strides in g.strides for st in strides)


def is_vec(layout: Layout) -> bool:
    """True when 16-byte copies can read the rows of a 16-bit operand.

    That needs dense columns, and the offset and every other stride a multiple of 8 elements
    (buffers are 256-byte aligned; inputs bound in place are 16-byte aligned).
    """
    return layout.strides[-1] == 1 and all(
        st % 8 == 0 for st in (layout.offset, *layout.strides[:-1])
    )


def emit_attention(ctx: LoweringContext, kernel: Kernel) -> None:
    """softmax(q @ k^T * scale + bias) @ v."""
    op = kernel.op
    assert isinstance(op, ops.Attention)
    q, k, v, bias = kernel.inputs
    out = ctx.tensor(kernel.output)
    if out.layout.numel == 0:
        return
    layouts = (*(ctx.layout(x) for x in (q, k, v, bias)), out.layout)
    geometry = geometry_of(layouts)
    dtype = ctx.dtype(q)
    if geometry is None or not is_fused(dtype, geometry.t, geometry.d, geometry.e):
        _emit_unfused(ctx, kernel, op.scale)
    elif dtype in MMA_DTYPES and _mma_heads(geometry):
        _emit_mma(ctx, kernel, op.scale, geometry)
    else:
        ctx.emit(_exact_launch(ctx, kernel, op.scale, geometry))


def is_fused(dtype: DType, t: int, d: int, e: int) -> bool:
    """Whether an attention runs as one kernel (or cuDNN's SDPA), not as GEMM, softmax, GEMM.

    Fused kernels write `out` through whatever strides it has; the unfused GEMMs write it dense.
    """
    return t > 0 and d > 0 and dtype in EXACT_DTYPES and max(d, e) <= MAX_HEAD


def _mma_heads(g: Geometry) -> bool:
    return all(0 < n <= MAX_HEAD and n % MMA_HEAD_MULTIPLE == 0 for n in (g.d, g.e))


def _tensor_args(kernel: Kernel) -> tuple[Arg, ...]:
    q, k, v, bias = kernel.inputs
    return (Buf(kernel.output), Buf(q), Buf(k), Buf(v), Buf(bias))


@dataclass(frozen=True)
class MmaGrid:
    """The per-size launch shape of the tensor-core kernel.

    Attributes:
        blocks: Row tiles, heads * ceil(s / block_m) (the grid's x).
        splits: Key ranges (the grid's y); the last block of a row tile merges them.
        chunk: Keys per range, whole tiles.
        workspace: f32 elements of partial results (0 without a split).
    """

    blocks: int
    splits: int
    chunk: int
    workspace: int


def mma_grid(g: Geometry, tiles: MmaTiles) -> MmaGrid:
    """How the tensor-core kernel covers `g`: row tiles, and key splits when they are few."""
    blocks = g.heads * -(-g.s // tiles.block_m)
    splits, per = split_keys(blocks, -(-g.t // tiles.block_n))
    workspace = splits * g.heads * g.s * (_pad16(g.e) + 2) if splits > 1 else 0
    return MmaGrid(blocks, splits, per * tiles.block_n, workspace)


def _emit_mma(ctx: LoweringContext, kernel: Kernel, scale: float, g: Geometry) -> None:
    bias = bias_mode(ctx, kernel.inputs[3], g)
    launch = _mma_launch(ctx, kernel, scale, g, bias)
    step = sdpa_step(ctx, kernel, scale, g, bias, launch) if sdpa_enabled() else None
    ctx.emit(launch if step is None else step)


def _mma_launch(
    ctx: LoweringContext, kernel: Kernel, scale: float, g: Geometry, bias: BiasMode
) -> Launch:
    tiles = mma_tiles(g.s, g.d, g.e)
    grid = mma_grid(g, tiles)
    dtype = ctx.dtype(kernel.inputs[0])
    itype = index_type(2 * max(g.extent(), grid.workspace))
    vec = tuple(is_vec(ctx.layout(x)) for x in kernel.inputs[:3])
    name, source = mma_source(dtype, g.d, g.e, tiles, bias, vec, itype)
    # With one split the kernel writes `out` itself and never reads its workspace or tickets.
    ws = tickets = kernel.output
    if grid.splits > 1:
        ws = ctx.new_tensor((grid.workspace,), DType.F32)
        # Zero when uploaded, and zero again after every launch (the last block resets it).
        tickets = ctx.new_constant(
            np.zeros(grid.blocks, np.int32), DType.I32, Layout.contiguous((grid.blocks,))
        )
    tail = (np.int32(g.heads), np.int32(grid.chunk), np.int32(grid.splits))
    args = (*_tensor_args(kernel), Buf(ws), Buf(tickets), *size_args(g, scale, itype), *tail)
    shared = mma_shared_bytes(tiles, g.d, g.e)
    return Launch(name, source, (grid.blocks, grid.splits, 1), (THREADS, 1, 1), args, shared)


# ---- cuDNN's fused attention -----------------------------------------------------------------


def sdpa_enabled() -> bool:
    """Whether attentions cuDNN may serve are given to it (`KNOPT_SDPA` is not "0")."""
    return os.environ.get(SDPA_ENV, "1").strip() != "0"


def sdpa_step(
    ctx: LoweringContext,
    kernel: Kernel,
    scale: float,
    g: Geometry,
    bias: BiasMode,
    direct: Launch,
) -> Sdpa | None:
    """The cuDNN step of a tensor-core attention, or None if it stays knopt's kernel.

    Prefill only (decoding keeps the split kernel), on operands whose rows 16-byte copies read
    (what cuDNN's kernels load), with a bias cuDNN can broadcast: whether cuDNN then takes the
    graph is decided when the plan runs (`knopt.cuda.sdpa`), `direct` otherwise.
    """
    q, k, v, bias_tid = kernel.inputs
    if g.s <= DECODE_ROWS or not all(is_vec(ctx.layout(x)) for x in (q, k, v, kernel.output)):
        return None
    views = sdpa_views(g, bias)
    if views is None:
        return None
    if bias is BiasMode.TENSOR and (
        ctx.dtype(bias_tid) != ctx.dtype(q) or ctx.layout(bias_tid).offset % 8 != 0
    ):
        return None
    q_view, k_view, v_view, out_view, bias_view = views
    return Sdpa(
        q,
        k,
        v,
        kernel.output,
        bias_tid if bias is BiasMode.TENSOR else None,
        q_view,
        k_view,
        v_view,
        out_view,
        bias_view,
        scale,
        bias is BiasMode.CAUSAL,
        ctx.dtype(q),
        direct,
        (
            nan_rows_launch(ctx.dtype(q), bias_tid, bias_view, kernel.output, out_view)
            if bias_view is not None
            else None
        ),
    )


def sdpa_views(g: Geometry, bias: BiasMode) -> AttentionViews | None:
    """q, k, v, out and bias (None unless read) as cuDNN views, or None (`attention_views`)."""
    return attention_views((g.s, g.t, g.d, g.e), g.lead, g.strides, bias is BiasMode.TENSOR)


def _exact_launch(ctx: LoweringContext, kernel: Kernel, scale: float, g: Geometry) -> Launch:
    rows_per_thread = 1
    while rows_per_thread < 4 and g.heads * -(-g.s // (32 * rows_per_thread)) >= TARGET_BLOCKS:
        rows_per_thread *= 2
    block_n = 64 if max(g.d, g.e) <= 128 else 32
    block_m = 16 * rows_per_thread
    itype = index_type(2 * g.extent())
    name, source = exact_source(
        ctx.dtype(kernel.inputs[0]),
        g.d,
        g.e,
        rows_per_thread,
        block_n,
        bias_mode(ctx, kernel.inputs[3], g) is not BiasMode.NONE,
        itype,
    )
    floats = (
        block_m * (g.d + 1)
        + block_n * (g.d + 1)
        + block_n * (-(-g.e // 8) * 8)
        + block_m * (block_n + 1)
    )
    return Launch(
        name,
        source,
        (g.heads * -(-g.s // block_m), 1, 1),
        (THREADS, 1, 1),
        (*_tensor_args(kernel), *size_args(g, scale, itype)),
        shared=4 * floats,
    )


def _emit_unfused(ctx: LoweringContext, kernel: Kernel, scale: float) -> None:
    q, k, v, bias = kernel.inputs
    dtype = ctx.dtype(q)
    s = ctx.tensor(q).shape[-2]
    t = ctx.tensor(k).shape[-2]
    lead = ctx.tensor(kernel.output).shape[:-2]
    scores = ctx.new_tensor((*lead, s, t), dtype)
    kl = ctx.layout(k)
    rank = len(kl.shape)
    transposed = ctx.add_tensor(
        dtype, kl.permute([*range(rank - 2), rank - 1, rank - 2]), ctx.tensor(k).buffer
    )
    ctx.emit(gemm_step(ctx, q, transposed, scores, FusedEpilogue(alpha=scale)))
    probabilities = ctx.new_tensor((*lead, s, t), dtype)
    softmax = Kernel(
        "softmax",
        ops.Softmax(rank - 1),
        (scores, bias),
        probabilities,
        prologue=BinaryE(Binary.ADD, Load(0), Load(1)),
    )
    rowwise.emit_softmax(ctx, softmax)
    ctx.emit(gemm_step(ctx, probabilities, v, kernel.output, FusedEpilogue()))
