"""Plan a Program for the GPU: layouts for every tensor, steps for every kernel, one arena.

Views cost nothing: they are layouts over their source's buffer. Every other tensor gets a
buffer in a region: constants and inputs (filled before a run), outputs (kept until the next
run), the arena, where buffers whose lifetimes (first to last step touching them) do not
overlap share memory, or the resident region of key/value caches (`knopt.cuda.resident`).
Offsets are placed greedily by size (largest first, lowest offset that fits, as TFLite's arena
planner does), so reuse is by offset, not by equal sizes. The plan reports the arena's size
against the lower bound: the largest total of buffers alive at once.

A symbolic program is planned once per set of sizes (bound first, `knopt.ir.bind_program`).
The constant region holds exactly the program's constants, in tensor order, so its layout is
the same at every size and one upload of the weights serves every plan; constants a plan makes
for its sizes (the values of `Sizes`) go to the input region, filled once per plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from knopt.cuda.cexpr import check_dtype
from knopt.cuda.context import REGIONS, Buffer, LoweringContext, PlanTensor
from knopt.cuda.gen.attention_layout import assign_attention_layouts
from knopt.cuda.gen.channels_last import assign_layouts
from knopt.cuda.gen.elementwise import copy_launch
from knopt.cuda.layout import Layout
from knopt.cuda.lower import lower_kernel
from knopt.cuda.replay import KernelClasses, LoweringMemo, WatchedDict, kernel_classes
from knopt.cuda.resident import (
    ResidentPlan,
    cache_layout,
    direct_appends,
    emit_append,
    emit_relocation,
    is_append,
    new_rows,
)
from knopt.cuda.steps import Step, step_tensors
from knopt.errors import CodegenError, UnsupportedModelError
from knopt.ir.dtype import DType
from knopt.ir.program import Kernel, Program

ALIGNMENT = 256  # bytes: what cuBLASLt wants for D, and more than vector loads need


@dataclass
class Plan:
    """Everything the executor needs, as plain data.

    Attributes:
        constants: Buffer id -> the bytes to upload once.
        inputs: (name, plan tensor) per program input, in order.
        outputs: (name, plan tensor) per program output, in order.
        region_bytes: Size of each region.
        arena_lower_bound: The most bytes of arena buffers alive at any one step.
    """

    tensors: list[PlanTensor]
    buffers: list[Buffer]
    steps: list[Step]
    constants: dict[int, np.ndarray]
    inputs: list[tuple[str, int]]
    outputs: list[tuple[str, int]]
    region_bytes: dict[str, int] = field(default_factory=dict)
    arena_lower_bound: int = 0

    def memory_report(self) -> str:
        """The arena's size against its lower bound, and the other regions, in MiB."""
        arena = self.region_bytes.get("arena", 0)
        ratio = arena / self.arena_lower_bound if self.arena_lower_bound else 1.0
        parts = [
            f"arena {arena / 2**20:.2f} MiB (lower bound "
            f"{self.arena_lower_bound / 2**20:.2f} MiB, {ratio:.3f}x)"
        ]
        parts += [
            f"{region} {self.region_bytes.get(region, 0) / 2**20:.2f} MiB"
            for region in REGIONS
            if region != "arena"
        ]
        return ", ".join(parts)


def build_plan(
    program: Program,
    precision: str = "f32",
    resident: ResidentPlan | None = None,
    classes: KernelClasses | None = None,
) -> Plan:
    """Lay out, lower and place a program whose sizes are all static.

    Kernels equal but for their tensors are lowered once at each layout of their tensors and
    replayed after that (`knopt.cuda.replay`).

    Args:
        program: The program, bound to its sizes.
        precision: How library calls compute ("f32", "tf32", "fp16", "bf16").
        resident: The key/value caches kept between runs, if any: their inputs and outputs
            are neither fed nor returned, but live in the resident region.
        classes: `kernel_classes` of the program or of the symbolic program it binds (found
            here when not given).

    Raises:
        UnsupportedModelError: If a tensor has a dtype or symbolic size the GPU cannot take.
        CodegenError: If lowering produces something inconsistent (a knopt bug).
    """
    ctx = LoweringContext(
        precision, constants=WatchedDict(keys_read=False), derived=WatchedDict(keys_read=True)
    )
    if classes is None:
        classes = kernel_classes(program)
    if len(classes) != len(program.kernels):
        raise CodegenError(
            f"{len(classes)} kernel classes for a program of {len(program.kernels)} kernels"
        )
    memo = LoweringMemo(ctx, classes, lower_kernel)
    cached = {s.input: s for s in resident.slots} if resident is not None else {}
    _lay_out_leaves(ctx, program, cached)
    assign_layouts(ctx, program)  # channels last for regions of half-precision convolutions
    assign_attention_layouts(ctx, program)  # attention outputs in the order they are read
    direct = direct_appends(program, resident) if resident is not None else {}
    for index, kernel in enumerate(program.kernels):
        ctx.where = _describe(kernel)
        if kernel.is_view:
            assert kernel.op is not None
            layout = memo.view_layout(index, kernel.op, ctx.layout(kernel.inputs[0]))
            _lay_out_view(ctx, kernel, layout)
            continue
        slot = resident.slot_of_output(kernel.output) if resident is not None else None
        out = ctx.tensors[kernel.output]
        if slot is not None and is_append(kernel, slot):
            out.layout, out.buffer = cache_layout(ctx, slot, out.shape[slot.axis], out.dtype)
            emit_append(ctx, resident, slot, kernel.inputs[1])  # type: ignore[arg-type]
            continue
        if kernel.output in direct:  # new rows of a cache, written where the cache keeps them
            assert resident is not None
            out.layout, out.buffer = new_rows(ctx, resident, direct[kernel.output], out.dtype)
        else:
            region = "output" if program.tensors[kernel.output].role == "output" else "arena"
            out.buffer = ctx.new_buffer(_nbytes(out), region)
        memo.lower(kernel, index)
    kept = {s.output for s in resident.slots} if resident is not None else set()
    outputs = []
    for name, tid in zip(program.output_names, program.outputs, strict=True):
        if tid not in kept:
            outputs.append((name, _output_tensor(ctx, tid)))
    if resident is not None:
        ctx.where = "resident caches"
        pos = ctx.add_tensor(DType.I32, Layout.contiguous((1,)), _pos_buffer(ctx, resident))
        emit_relocation(ctx, resident, pos)
    _move_size_constants(ctx, program)
    inputs = [
        (name, tid)
        for name, tid in zip(program.input_names, program.inputs, strict=True)
        if tid not in cached
    ]
    plan = Plan(ctx.tensors, ctx.buffers, ctx.steps, dict(ctx.constants), inputs, outputs)
    place_buffers(plan)
    if resident is not None:
        plan.region_bytes["resident"] = resident.region_bytes
    return plan


def _lay_out_leaves(ctx: LoweringContext, program: Program, cached: dict[int, Any]) -> None:
    """A plan tensor per program tensor; buffers for the inputs and constants."""
    inputs = set(program.inputs)
    checked: set[DType] = set()
    layouts: dict[tuple[object, ...], Layout] = {}  # tensors of one shape share a layout
    for tensor in program.tensors:
        dtype = tensor.type.dtype
        if dtype not in checked:
            check_dtype(dtype, f"tensor %{tensor.id}")
            checked.add(dtype)
        layout = layouts.get(tensor.type.shape)
        if layout is None:
            shape = _static_shape(tensor.type.shape, f"tensor %{tensor.id}")
            layout = layouts[tensor.type.shape] = Layout.contiguous(shape)
        ctx.tensors.append(PlanTensor(tensor.id, dtype, layout, -1))
        if tensor.id in cached:
            slot = cached[tensor.id]
            placed = cache_layout(ctx, slot, layout.shape[slot.axis], dtype)
            ctx.tensors[-1].layout, ctx.tensors[-1].buffer = placed
            continue
        # By membership, not role: a role says "output" when an input is an output too.
        if tensor.id in inputs or tensor.id in program.constants:
            region = "constant" if tensor.id in program.constants else "input"
            ctx.tensors[-1].buffer = ctx.new_buffer(_nbytes(ctx.tensors[-1]), region)
            if region == "constant":
                ctx.constants[ctx.tensors[-1].buffer] = np.ascontiguousarray(
                    program.constants[tensor.id]
                )


def _pos_buffer(ctx: LoweringContext, resident: ResidentPlan) -> int:
    ctx.buffers.append(Buffer(len(ctx.buffers), 4, "resident", resident.pos_offset))
    return len(ctx.buffers) - 1


def _move_size_constants(ctx: LoweringContext, program: Program) -> None:
    """Constants made for this plan's sizes leave the constant region for the input region."""
    weights = {ctx.tensors[tid].buffer for tid in program.constants}
    for buffer in ctx.buffers:
        if buffer.region == "constant" and buffer.id not in weights:
            buffer.region = "input"


def _static_shape(shape: tuple[object, ...], where: str) -> tuple[int, ...]:
    if not all(isinstance(d, int) for d in shape):
        raise UnsupportedModelError(
            f"{where}: shape {list(shape)} is symbolic; bind the sizes before planning "
            "(knopt.ir.bind_symbols)"
        )
    return tuple(int(d) for d in shape)  # type: ignore[call-overload]


def _nbytes(tensor: PlanTensor) -> int:
    return max(tensor.layout.numel, 1) * tensor.dtype.itemsize


def _describe(kernel: Kernel) -> str:
    what = kernel.kind if kernel.op is None else f"{kernel.kind}:{kernel.op.name}"
    names = f" ({', '.join(kernel.names[:2])})" if kernel.names else ""
    return f"kernel %{kernel.output} = {what}{names}"


def _lay_out_view(ctx: LoweringContext, kernel: Kernel, layout: Layout | None) -> None:
    """The view's layout over its source's buffer (`layout`), or a dense copy when None."""
    (source,) = kernel.inputs
    target = ctx.tensors[kernel.output]
    if layout is not None:
        target.layout = layout
        target.buffer = ctx.tensors[source].buffer
        return
    # A reshape the strides cannot express: copy the source densely, then view that.
    copy = ctx.new_tensor(ctx.tensors[source].shape, ctx.dtype(source))
    launch = copy_launch(ctx, copy, source)
    if launch is not None:
        ctx.emit(launch)
    target.layout = Layout.contiguous(target.shape)
    target.buffer = ctx.tensors[copy].buffer


def _output_tensor(ctx: LoweringContext, tid: int) -> int:
    tensor = ctx.tensors[tid]
    buffer = ctx.buffers[tensor.buffer]
    if buffer.region == "output" and tensor.layout == Layout.contiguous(tensor.shape):
        return tid
    # Views, inputs and constants that are outputs get a copy of their own, so results are
    # dense and stay valid until the next run whatever the arena does.
    copy = ctx.new_tensor(tensor.shape, tensor.dtype, region="output")
    launch = copy_launch(ctx, copy, tid)
    if launch is not None:
        ctx.emit(launch)
    return copy


def place_buffers(plan: Plan) -> None:
    """Set every buffer's lifetime and offset, and the plan's region sizes and lower bound."""
    for index, step in enumerate(plan.steps):
        for tid in step_tensors(step):
            buffer = plan.buffers[plan.tensors[tid].buffer]
            if buffer.first < 0:
                buffer.first = index
            buffer.last = index
    for region in REGIONS:
        members = [b for b in plan.buffers if b.region == region]
        if region == "resident":  # placed in advance, the same for every plan
            continue
        if region == "arena":
            live = [b for b in members if b.first >= 0]
            for b in members:
                if b.first < 0:
                    b.offset = 0
            plan.region_bytes[region] = assign_offsets(live)
            plan.arena_lower_bound = lower_bound(live)
            continue
        total = 0
        for b in members:
            b.offset = total
            total += align(b.nbytes)
        plan.region_bytes[region] = total


def align(nbytes: int) -> int:
    """`nbytes` rounded up to the alignment every buffer gets."""
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


def assign_offsets(buffers: list[Buffer]) -> int:
    """Greedy-by-size placement: each buffer at the lowest offset free for its whole lifetime.

    Returns:
        The bytes the placement needs.
    """
    placed: list[tuple[int, int, int, int]] = []  # (offset, end, first, last)
    size = 0
    for buffer in sorted(buffers, key=lambda b: (-align(b.nbytes), b.first, b.id)):
        need = align(buffer.nbytes)
        first, last = buffer.first, buffer.last
        # Clashes in order of offset (among equal offsets the order cannot change the result).
        clashes = sorted([(o, end) for o, end, f, la in placed if f <= last and first <= la])
        offset = 0
        for other, end in clashes:
            if offset + need <= other:
                break
            offset = max(offset, end)
        buffer.offset = offset
        placed.append((offset, offset + need, first, last))
        size = max(size, offset + need)
    return size


def lower_bound(buffers: list[Buffer]) -> int:
    """The largest total size of buffers alive at the same step."""
    events: dict[int, int] = {}
    for b in buffers:
        events[b.first] = events.get(b.first, 0) + align(b.nbytes)
        events[b.last + 1] = events.get(b.last + 1, 0) - align(b.nbytes)
    best = current = 0
    for step in sorted(events):
        current += events[step]
        best = max(best, current)
    return best


def check_plan(plan: Plan) -> None:
    """Check that no two arena buffers alive at once overlap in memory.

    Raises:
        CodegenError: If two do (a planner bug).
    """
    arena = sorted(
        (b for b in plan.buffers if b.region == "arena" and b.first >= 0), key=lambda b: b.offset
    )
    for i, a in enumerate(arena):
        for b in arena[i + 1 :]:
            if b.offset >= a.offset + align(a.nbytes):
                break
            if a.first <= b.last and b.first <= a.last:
                raise CodegenError(f"arena buffers {a.id} and {b.id} overlap while both live")
