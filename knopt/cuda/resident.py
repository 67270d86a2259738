"""Resident key/value caches in a plan: buffers that outlive runs, appended to in place.

A resident pair (see `knopt.ir.kvcache`) is a cache input `past` and its grown output `present =
Concat(past, new)`. Both live in one buffer of the "resident" region, laid out for the cache's
capacity (`rows` positions), so strides do not change with the cached length: `past` is the
buffer's first `planned` rows, `present` its first `planned + added`. The Concat then writes
only the new rows (`copy_rows`), and attention reads the cache where it lies. After the run the
new rows move to the rows after the real ones (`relocate`), at a row read from device memory
(`pos`), so a static cache's plan and CUDA graph serve every step of a bucket. A present that
is computed otherwise stays a plan output, and its new rows are copied into the buffer.
When the new rows are a rotary embedding's result (the keys) that only the append reads, the
Rope kernel writes them into the buffer itself (`direct_appends`), and the copy goes away.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from knopt.cuda.cexpr import storage_type
from knopt.cuda.context import Buffer, LoweringContext
from knopt.cuda.gen.indexing import PLACEHOLDER, named
from knopt.cuda.layout import Layout
from knopt.cuda.steps import Arg, Buf, Launch
from knopt.cuda.templates import render
from knopt.errors import UnsupportedModelError
from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.program import Kernel, Program

RANK = 4  # copy_rows.cu indexes four axes; caches are [batch, heads, positions, head size]
THREADS = 256
MAX_BLOCKS = 4096  # copy_rows loops over the rest: enough blocks to fill an H200 many times
# Ops whose GPU kernels write their result through any strided layout (knopt/cuda/gen/rope.py),
# so they can write a cache's new rows where the cache keeps them.
STRIDED_WRITERS: frozenset[type[ops.Op]] = frozenset({ops.Rope})


@dataclass(frozen=True)
class ResidentSlot:
    """One cache: program tensors `input` (past) and `output` (present), growing on `axis`.

    Attributes:
        offset: Bytes from the start of the resident region to the cache's buffer.
        shape: The buffer's shape: the cache's, with `rows` positions on `axis`.
    """

    input: int
    output: int
    axis: int
    offset: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ResidentPlan:
    """The caches of one plan.

    Attributes:
        planned: The cached length the plan takes (rows of `past`).
        added: The positions a run appends.
        relocate: Move the new rows to row `*pos` after the run (static caches); otherwise
            they stay at row `planned`, which is then the real length.
        pos_offset: Bytes from the start of the resident region to the int32 `pos`.
        region_bytes: The resident region's size.
    """

    slots: tuple[ResidentSlot, ...]
    planned: int
    added: int
    relocate: bool
    pos_offset: int
    region_bytes: int

    def slot_of_output(self, tid: int) -> ResidentSlot | None:
        """The slot whose present is program tensor `tid`, if any."""
        return next((s for s in self.slots if s.output == tid), None)


def cache_layout(
    ctx: LoweringContext, slot: ResidentSlot, rows: int, dtype: DType
) -> tuple[Layout, int]:
    """The layout of the first `rows` positions of a cache's buffer, and the buffer's id."""
    buffer = _buffer(ctx, slot, dtype)
    full = Layout.contiguous(slot.shape)
    shape = list(slot.shape)
    shape[slot.axis] = rows
    return Layout(tuple(shape), _strides(full, shape)), buffer


def _strides(full: Layout, shape: list[int]) -> tuple[int, ...]:
    # The buffer's strides, with knopt's 0 for axes of size 1 (which may be larger in `full`).
    return tuple(0 if n == 1 else s for n, s in zip(shape, full.strides, strict=True))


def _buffer(ctx: LoweringContext, slot: ResidentSlot, dtype: DType) -> int:
    for buffer in ctx.buffers:
        if buffer.region == "resident" and buffer.offset == slot.offset:
            return buffer.id
    nbytes = int(np.prod(slot.shape)) * dtype.itemsize
    ctx.buffers.append(Buffer(len(ctx.buffers), nbytes, "resident", slot.offset))
    return len(ctx.buffers) - 1


def is_append(kernel: Kernel, slot: ResidentSlot) -> bool:
    """True when `kernel` computes the slot's present as `Concat(past, new)` on its axis."""
    return (
        isinstance(kernel.op, ops.Concat)
        and kernel.op.axis == slot.axis
        and len(kernel.inputs) == 2
        and kernel.inputs[0] == slot.input
    )


def direct_appends(program: Program, plan: ResidentPlan) -> dict[int, ResidentSlot]:
    """The new rows that their own kernel can write into the cache: program tensor -> slot.

    Such rows are computed by one of `STRIDED_WRITERS` alone (no fused prologue or epilogue),
    and read by the append and nothing else (no view, kernel or program output), so nothing
    needs them anywhere but in the cache.
    """
    readers: dict[int, int] = {}
    for kernel in program.kernels:
        for tid in kernel.inputs:
            readers[tid] = readers.get(tid, 0) + 1
    producers = {kernel.output: kernel for kernel in program.kernels}
    found = {}
    for kernel in program.kernels:
        slot = plan.slot_of_output(kernel.output)
        if slot is None or not is_append(kernel, slot):
            continue
        new = kernel.inputs[1]
        producer = producers.get(new)
        if (
            producer is not None
            and type(producer.op) in STRIDED_WRITERS
            and producer.prologue is None
            and producer.epilogue is None
            and readers[new] == 1
            and new not in program.outputs
        ):
            found[new] = slot
    return found


def new_rows(
    ctx: LoweringContext, plan: ResidentPlan, slot: ResidentSlot, dtype: DType
) -> tuple[Layout, int]:
    """Where a run's new rows of a cache go: rows `planned ...` of its buffer, and the buffer."""
    layout, buffer = cache_layout(ctx, slot, plan.planned + plan.added, dtype)
    return layout.slice(slot.axis, plan.planned, plan.planned + plan.added, 1), buffer


def rows_view(ctx: LoweringContext, tid: int, axis: int, start: int, count: int) -> int:
    """A plan tensor viewing rows `start ... start + count - 1` of `tid` along `axis`."""
    tensor = ctx.tensor(tid)
    layout = tensor.layout.slice(axis, start, start + count, 1)
    return ctx.add_tensor(tensor.dtype, layout, tensor.buffer)


def emit_append(ctx: LoweringContext, plan: ResidentPlan, slot: ResidentSlot, new: int) -> None:
    """Write the new positions into the cache's buffer, after its first `planned` rows.

    Nothing to do when their kernel wrote them there (`direct_appends`).
    """
    target = rows_view(ctx, slot.output, slot.axis, plan.planned, plan.added)
    written, source = ctx.tensor(target), ctx.tensor(new)
    if (written.buffer, written.layout) == (source.buffer, source.layout):
        return
    ctx.emit(copy_launch(ctx, [target], [new]))


def emit_relocation(ctx: LoweringContext, plan: ResidentPlan, pos: int) -> None:
    """After everything else: the new rows of each present move into its cache's buffer.

    With `plan.relocate` they go to row `*pos` (device memory, the real cached length);
    otherwise a present computed outside the buffer is copied to row `planned`, and one
    appended in place needs nothing.
    """
    sources, targets = [], []
    for slot in plan.slots:
        present = ctx.tensor(slot.output)
        in_place = ctx.buffers[present.buffer].region == "resident"
        if in_place and not plan.relocate:
            continue
        start = 0 if plan.relocate else plan.planned
        target = ctx.add_tensor(
            present.dtype, *cache_layout(ctx, slot, start + plan.added, present.dtype)
        )
        sources.append(rows_view(ctx, slot.output, slot.axis, plan.planned, plan.added))
        targets.append(rows_view(ctx, target, slot.axis, start, plan.added))
    row_stride = Layout.contiguous(plan.slots[0].shape).strides[plan.slots[0].axis]
    for group in _groups(ctx, sources, targets):
        ctx.emit(
            copy_launch(
                ctx,
                [targets[i] for i in group],
                [sources[i] for i in group],
                (pos, row_stride) if plan.relocate else None,
            )
        )


def _groups(ctx: LoweringContext, sources: list[int], targets: list[int]) -> list[list[int]]:
    """Runs of copies one launch can do: same shape and strides, evenly spaced in memory."""
    groups: list[list[int]] = []
    for i in range(len(sources)):
        if groups and _extends(ctx, sources, targets, groups[-1], i):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _extends(
    ctx: LoweringContext, sources: list[int], targets: list[int], group: list[int], i: int
) -> bool:
    for tensors in (sources, targets):
        a, b = ctx.tensor(tensors[group[0]]), ctx.tensor(tensors[i])
        if (a.dtype, a.layout.shape, a.layout.strides) != (
            b.dtype,
            b.layout.shape,
            b.layout.strides,
        ):
            return False
        if _spacing(ctx, [tensors[j] for j in (*group, i)]) is None:
            return False
    return True


def _element(ctx: LoweringContext, tid: int) -> int | None:
    """The element offset of a resident tensor from the region's start (None elsewhere)."""
    tensor = ctx.tensor(tid)
    buffer = ctx.buffers[tensor.buffer]
    if buffer.region != "resident" or buffer.offset % tensor.dtype.itemsize:
        return None
    return buffer.offset // tensor.dtype.itemsize + tensor.layout.offset


def _spacing(ctx: LoweringContext, tids: list[int]) -> int | None:
    """The even element spacing of tensors in memory: 0 for one, None if uneven or unknown."""
    if len(tids) == 1:
        return 0
    offsets = [_element(ctx, t) for t in tids]
    if None in offsets:
        return None
    steps = {b - a for a, b in itertools.pairwise(offsets)}  # type: ignore[operator]
    return steps.pop() if len(steps) == 1 else None


def copy_launch(
    ctx: LoweringContext,
    targets: list[int],
    sources: list[int],
    shift: tuple[int, int] | None = None,
) -> Launch:
    """The copy_rows launch copying each `sources[i]` into `targets[i]` (same shapes).

    Args:
        ctx: The plan being lowered.
        targets: Plan tensors written, evenly spaced in memory when there are several.
        sources: Plan tensors read, likewise.
        shift: (plan tensor of `pos`, elements per row): the targets start `*pos` rows on.

    Raises:
        UnsupportedModelError: If the tensors have more than four axes.
    """
    dst, src = ctx.tensor(targets[0]), ctx.tensor(sources[0])
    rank = len(src.layout.shape)
    if rank > RANK:
        raise UnsupportedModelError(f"{ctx.where}: resident caches have at most {RANK} axes")
    pad = RANK - rank
    dims = (1,) * pad + src.layout.shape
    src_strides = (0,) * pad + src.layout.strides
    dst_strides = (0,) * pad + dst.layout.strides
    text = render("copy_rows.cu", NAME=PLACEHOLDER, T=storage_type(src.dtype))
    name, text = named("copy_rows", text)
    total = len(targets) * int(np.prod(dims))
    blocks = max(1, min(MAX_BLOCKS, -(-total // THREADS)))
    pos: Arg = Buf(shift[0]) if shift is not None else np.uint64(0)
    args: tuple[Arg, ...] = (
        Buf(targets[0]),
        Buf(sources[0]),
        pos,
        *(np.int64(n) for n in (*dims, len(targets))),
        *(np.int64(s) for s in src_strides),
        np.int64(_spacing(ctx, sources) or 0),
        *(np.int64(s) for s in dst_strides),
        np.int64(_spacing(ctx, targets) or 0),
        np.int64(shift[1] if shift is not None else 0),
    )
    return Launch(name, text, (blocks, 1, 1), (THREADS, 1, 1), args)
