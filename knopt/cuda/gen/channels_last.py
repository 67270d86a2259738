"""Channels-last (NHWC) storage for regions of fp16/bf16 convolutions.

Tensor cores take convolutions channels last: for NCHW half-precision tensors cuDNN transposes
around an NHWC kernel or picks slower ones. Before lowering, `assign_layouts` finds regions:
the convolutions cuDNN can run channels last and the elementwise kernels between them, joined
by the 4-D activations they pass each other. Where a region holds at least `MIN_CONVS`
convolutions, every activation of it is stored channels last, so consecutive convolutions and
their residual adds never transpose. Kernels outside a region read such a tensor through its
strides (or copy it dense, as a GEMM or a reshape must); a convolution whose input comes from
outside reads one channels-last copy of it (`to_channels_last`, shared by every convolution that
reads the same tensor), and constant weights are permuted once, on the host.

This is the planner's form of "transposes at region borders": the layout is chosen here, by
the rule above, not by extraction over layout-annotated terms.
"""

from __future__ import annotations

from knopt.cuda.context import LoweringContext
from knopt.cuda.gen.elementwise import copy_launch
from knopt.cuda.layout import Layout, channels_last_strides
from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.kernel import KernelKind
from knopt.ir.program import Kernel, Program

MIN_CONVS = 2  # a lone convolution gains less than its two border transposes cost
HALF_TYPES = frozenset({DType.F16, DType.BF16})
CHANNEL_MULTIPLE = 8  # 16 bytes of f16: what cuDNN's channels-last tensor-core kernels need


def channels_last_layout(shape: tuple[int, ...]) -> Layout:
    """The dense channels-last layout of an N, C, spatial... shape."""
    return Layout(tuple(shape), channels_last_strides(shape))


def is_channels_last(layout: Layout) -> bool:
    """Whether `layout` is dense channels last (and not also row-major, as tiny tensors are)."""
    return (
        len(layout.shape) == 4
        and not layout.is_contiguous
        and layout == channels_last_layout(layout.shape)
    )


def is_channels_last_conv(program: Program, kernel: Kernel) -> bool:
    """Whether a kernel is a convolution cuDNN can run channels last on tensor cores."""
    op = kernel.op
    if not isinstance(op, ops.Conv) or op.groups != 1 or len(kernel.inputs) < 2:
        return False
    x, w = (program.tensors[t].type for t in kernel.inputs[:2])
    out = program.tensors[kernel.output].type
    return (
        len(out.shape) == 4
        and out.dtype in HALF_TYPES
        and x.dtype == w.dtype == out.dtype
        and isinstance(x.shape[1], int)
        and isinstance(out.shape[1], int)
        and x.shape[1] % CHANNEL_MULTIPLE == 0
        and out.shape[1] % CHANNEL_MULTIPLE == 0
    )


def _is_elementwise(program: Program, kernel: Kernel) -> bool:
    out = program.tensors[kernel.output].type
    elementwise = kernel.kind == KernelKind.ELEMENTWISE or (
        kernel.kind != "view" and type(kernel.op) in ops.ELEMENTWISE_OPS
    )
    return elementwise and len(out.shape) == 4 and out.dtype in HALF_TYPES


def assign_layouts(ctx: LoweringContext, program: Program) -> None:
    """Store the activations of every convolution region channels last (see the module)."""
    convs = [k for k in program.kernels if is_channels_last_conv(program, k)]
    if len(convs) < MIN_CONVS:
        return
    conv_outputs = {k.output for k in convs}
    members = [
        k for k in program.kernels if k.output in conv_outputs or _is_elementwise(program, k)
    ]
    # Region tensors: what region kernels write, unless the program hands it out.
    tensors = {k.output for k in members if program.tensors[k.output].role == "intermediate"}
    parent = {t: t for t in tensors}

    def root(t: int) -> int:
        while parent[t] != t:
            parent[t] = parent[parent[t]]
            t = parent[t]
        return t

    for kernel in members:
        if kernel.output not in tensors:
            continue
        for t in kernel.inputs:
            if t in tensors:
                parent[root(t)] = root(kernel.output)
    counts: dict[int, int] = {}
    for kernel in convs:
        if kernel.output in tensors:
            counts[root(kernel.output)] = counts.get(root(kernel.output), 0) + 1
    for t in tensors:
        if counts.get(root(t), 0) >= MIN_CONVS:
            ctx.tensors[t].layout = channels_last_layout(ctx.tensors[t].shape)


def to_channels_last(ctx: LoweringContext, tid: int) -> int:
    """`tid` if stored channels last, else its channels-last copy (made once per tensor)."""
    shape = ctx.tensor(tid).shape
    target = channels_last_layout(shape)
    if ctx.layout(tid) == target:
        return tid
    key = ("channels_last", tid)
    if key not in ctx.derived:
        value = ctx.constant_value(tid)
        if value is not None:  # weights: permuted on the host, once
            memory = value.transpose(0, *range(2, len(shape)), 1)
            ctx.derived[key] = ctx.new_constant(memory, ctx.dtype(tid), target)
        else:
            buffer = ctx.new_buffer(max(target.numel, 1) * ctx.dtype(tid).itemsize, "arena")
            copy = ctx.add_tensor(ctx.dtype(tid), target, buffer)
            launch = copy_launch(ctx, copy, tid)
            if launch is not None:
                ctx.emit(launch)
            ctx.derived[key] = copy
    return ctx.derived[key]
