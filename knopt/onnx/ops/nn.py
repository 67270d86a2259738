"""Importers of ONNX neural-network ops: convolution, pooling, normalization, Gemm, softmax."""

from __future__ import annotations

import numpy as np
import onnx

from knopt.ir.dtype import DType
from knopt.ir.graph import Value
from knopt.ir.op import Binary, PadMode, PoolKind, Reduction, Unary
from knopt.ir.shape import Dim, numel
from knopt.onnx.context import Attributes, ImportContext, OnnxValue, importer
from knopt.onnx.ops.common import (
    PoolWindow,
    axis_of,
    float_dtype,
    matmul,
    scalar_like,
    static_dim,
)
from knopt.onnx.ops.image import max_pool_indices
from knopt.onnx.ops.tensor import pad_signed

MAX_SPATIAL = 3


def _per_channel(ctx: ImportContext, v: Value, rank: int) -> Value:
    """A `[C]` vector viewed as `[C, 1, ...]` so that it broadcasts over `[N, C, *spatial]`.

    Raises:
        UnsupportedModelError: If `v` is not a vector.
    """
    (channels,) = ctx.shape_of(v, 1, "a per-channel input (scale, bias, mean or variance)")
    return ctx.builder.view(v, (channels, *(1,) * (rank - 2)))


def window_attributes(
    ctx: ImportContext, attrs: Attributes, x: Value, kernel: list[int], dilations_ok: bool = True
) -> tuple[list[int], list[tuple[int, int]], list[int]]:
    """Strides, pads (with auto_pad resolved) and dilations of a conv or pool node.

    Raises:
        UnsupportedModelError: If the attributes do not fit the input or auto_pad is unknown.
    """
    spatial = x.rank - 2
    if not 1 <= spatial <= MAX_SPATIAL:
        raise ctx.fail(f"{spatial}-d windows are not supported (1-d to 3-d are)")
    strides = attrs.ints("strides", [1] * spatial)
    dilations = attrs.ints("dilations", [1] * spatial) if dilations_ok else [1] * spatial
    pads = attrs.ints("pads", [0] * (2 * spatial))
    auto_pad = attrs.string("auto_pad", "NOTSET")
    if len(strides) != spatial or len(dilations) != spatial or len(pads) != 2 * spatial:
        raise ctx.fail("strides, dilations and pads must match the number of spatial axes")
    pairs = [(pads[i], pads[i + spatial]) for i in range(spatial)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pairs = []
        for i in range(spatial):
            size = x.shape[2 + i]
            if not isinstance(size, int):
                raise ctx.fail_symbolic("auto_pad SAME on a symbolic spatial size is not supported")
            out = -(-size // strides[i])
            total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - size)
            small, large = total // 2, total - total // 2
            pairs.append((small, large) if auto_pad == "SAME_UPPER" else (large, small))
    elif auto_pad == "VALID":
        pairs = [(0, 0)] * spatial
    elif auto_pad != "NOTSET":
        raise ctx.fail(f"auto_pad '{auto_pad}' is not supported")
    return strides, pairs, dilations


@importer("Conv")
def _conv(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x, w, bias = ctx.inputs(node, count=(2, 3))
    attrs = ctx.attributes(node)
    kernel = attrs.ints("kernel_shape", [static_dim(ctx, d, "kernel size") for d in w.shape[2:]])
    strides, pads, dilations = window_attributes(ctx, attrs, x, kernel)
    groups = attrs.int("group", 1)
    b = ctx.builder
    y = b.conv(x, w, strides=strides, pads=tuple(pads), dilations=dilations, groups=groups)
    if bias is not None:
        y = b.add(y, _per_channel(ctx, bias, y.rank))
    return [y]


@importer("ConvTranspose")
def _conv_transpose(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x, w, bias = ctx.inputs(node, count=(2, 3))
    attrs = ctx.attributes(node)
    spatial = x.rank - 2
    kernel = attrs.ints("kernel_shape", [static_dim(ctx, d, "kernel size") for d in w.shape[2:]])
    strides = attrs.ints("strides", [1] * spatial)
    dilations = attrs.ints("dilations", [1] * spatial)
    groups = attrs.int("group", 1)
    output_padding = attrs.ints("output_padding", [0] * spatial)
    pads = _transpose_pads(ctx, attrs, x, kernel, strides, dilations, output_padding)
    b = ctx.builder
    y = _dilate(ctx, x, strides)
    # A transposed conv is a conv of the stride-dilated input with the flipped, transposed
    # kernel, padded by (k - 1) * d minus the requested padding on each side.
    widths = [(0, 0), (0, 0)] + [
        (
            (kernel[i] - 1) * dilations[i] - pads[i][0],
            (kernel[i] - 1) * dilations[i] - pads[i][1] + output_padding[i],
        )
        for i in range(spatial)
    ]
    y = pad_signed(ctx, y, widths, PadMode.CONSTANT, 0.0)
    c_in, m_per_group = w.shape[0], w.shape[1]
    assert isinstance(c_in, int) and isinstance(m_per_group, int)
    wg = b.view(w, (groups, c_in // groups, m_per_group, *kernel))
    wg = b.permute(wg, (0, 2, 1, *range(3, 3 + spatial)))
    wt = b.view(wg, (groups * m_per_group, c_in // groups, *kernel))
    for i in range(spatial):
        wt = b.flip(wt, axis=2 + i)
    y = b.conv(
        y, wt, strides=[1] * spatial, pads=((0, 0),) * spatial, dilations=dilations, groups=groups
    )
    if bias is not None:
        y = b.add(y, _per_channel(ctx, bias, y.rank))
    return [y]


def _transpose_pads(
    ctx: ImportContext,
    attrs: Attributes,
    x: Value,
    kernel: list[int],
    strides: list[int],
    dilations: list[int],
    output_padding: list[int],
) -> list[tuple[int, int]]:
    spatial = x.rank - 2
    auto_pad = attrs.string("auto_pad", "NOTSET")
    output_shape = attrs.ints("output_shape") if attrs.has("output_shape") else None
    pads = attrs.ints("pads", [0] * (2 * spatial))
    if output_shape is None and auto_pad in ("NOTSET", "VALID"):
        if auto_pad == "VALID":
            pads = [0] * (2 * spatial)
        return [(pads[i], pads[i + spatial]) for i in range(spatial)]
    result = []
    for i in range(spatial):
        size = x.shape[2 + i]
        if not isinstance(size, int):
            raise ctx.fail_symbolic(
                "ConvTranspose output_shape/auto_pad on symbolic sizes is unsupported"
            )
        target = output_shape[-spatial + i] if output_shape else size * strides[i]
        total = strides[i] * (size - 1) + output_padding[i] + (kernel[i] - 1) * dilations[i] + 1
        total -= target
        if auto_pad == "SAME_UPPER":
            result.append((total // 2, total - total // 2))
        else:
            result.append((total - total // 2, total // 2))
    return result


def _dilate(ctx: ImportContext, x: Value, strides: list[int]) -> Value:
    """Insert `stride - 1` zeros between neighbouring elements of each spatial axis."""
    b = ctx.builder
    spatial = x.rank - 2
    if all(s == 1 for s in strides):
        return x
    ctx.require_rank(x, 3, "the input of a transposed convolution")
    n, c = x.shape[:2]
    sizes = x.shape[2:]
    grid = b.view(x, (n, c, *(d for size in sizes for d in (size, 1))))
    widths = ((0, 0), (0, 0), *(p for s in strides for p in ((0, 0), (0, s - 1))))
    grid = b.pad(grid, pads=widths, mode=PadMode.CONSTANT, value=0.0)
    flat = b.view(grid, (n, c, *(size * s for size, s in zip(sizes, strides, strict=True))))
    for i in range(spatial):
        size = sizes[i]
        flat = b.slice(flat, axis=2 + i, start=0, stop=(size - 1) * strides[i] + 1)
    return flat


def _pool(ctx: ImportContext, node: onnx.NodeProto, kind: PoolKind) -> list[Value]:
    """The pooled value, and for a MaxPool whose Indices output is used, the indices too."""
    (x,) = ctx.inputs(node, count=1)
    attrs = ctx.attributes(node)
    kernel = attrs.ints("kernel_shape")
    dilations_ok = (kind is PoolKind.MAX and ctx.opset >= 10) or ctx.opset >= 19
    strides, pads, dilations = window_attributes(ctx, attrs, x, kernel, dilations_ok)
    ceil_mode = bool(attrs.int("ceil_mode", 0)) if ctx.opset >= 10 else False
    count_include_pad = bool(attrs.int("count_include_pad", 0)) if kind is PoolKind.AVG else False
    column_major = kind is PoolKind.MAX and bool(attrs.int("storage_order", 0))
    y = ctx.builder.pool(
        kind,
        x,
        kernel=kernel,
        strides=strides,
        pads=tuple(pads),
        dilations=dilations,
        ceil_mode=ceil_mode,
        count_include_pad=count_include_pad,
    )
    if kind is PoolKind.AVG or len(node.output) < 2 or not node.output[1]:
        return [y]
    window = PoolWindow(tuple(kernel), tuple(strides), tuple(pads), tuple(dilations))
    return [y, max_pool_indices(ctx, x, window, y.shape[2:], column_major)]


@importer("MaxPool")
def _max_pool(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    return list(_pool(ctx, node, PoolKind.MAX))


@importer("AveragePool")
def _average_pool(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    return list(_pool(ctx, node, PoolKind.AVG))


@importer("GlobalAveragePool")
def _global_average_pool(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    ctx.attributes(node)
    axes = list(range(2, x.rank))
    return [mean(ctx, x, axes)]


def mean(ctx: ImportContext, x: Value, axes: list[int]) -> Value:
    """Mean over `axes` (kept as size 1): a sum divided by the count."""
    b = ctx.builder
    total = b.reduce(Reduction.SUM, x, axes=axes)
    count = numel([x.shape[a] for a in axes])
    if not isinstance(count, int):
        raise ctx.fail_symbolic("a mean over symbolic sizes is not supported")
    return b.div(total, scalar_like(ctx, x, count)) if axes else x


@importer("GlobalMaxPool")
def _global_max_pool(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    ctx.attributes(node)
    return [ctx.builder.reduce(Reduction.MAX, x, axes=list(range(2, x.rank)))]


@importer("LpPool")
def _lp_pool(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    attrs = ctx.attributes(node)
    p = attrs.int("p", 2)
    kernel = attrs.ints("kernel_shape")
    strides, pads, dilations = window_attributes(ctx, attrs, x, kernel, ctx.opset >= 18)
    ceil_mode = bool(attrs.int("ceil_mode", 0))
    b = ctx.builder
    powered = b.binary(Binary.POW, b.unary(Unary.ABS, x), scalar_like(ctx, x, p))
    avg = b.pool(
        PoolKind.AVG,
        powered,
        kernel=kernel,
        strides=strides,
        pads=tuple(pads),
        dilations=dilations,
        ceil_mode=ceil_mode,
        count_include_pad=True,
    )
    total = b.mul(avg, scalar_like(ctx, x, int(np.prod(kernel))))
    return [b.binary(Binary.POW, total, scalar_like(ctx, x, 1.0 / p))]


@importer("GlobalLpPool")
def _global_lp_pool(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    p = ctx.attributes(node).int("p", 2)
    b = ctx.builder
    powered = b.binary(Binary.POW, b.unary(Unary.ABS, x), scalar_like(ctx, x, p))
    total = b.reduce(Reduction.SUM, powered, axes=list(range(2, x.rank)))
    return [b.binary(Binary.POW, total, scalar_like(ctx, x, 1.0 / p))]


@importer("BatchNormalization")
def _batch_norm(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x, scale, bias, running_mean, running_var = ctx.inputs(node, count=5)
    attrs = ctx.attributes(node)
    eps = attrs.float("epsilon", 1e-5)
    if ctx.opset >= 14 and attrs.int("training_mode", 0):
        return _batch_norm_training(
            ctx, (x, scale, bias, running_mean, running_var), eps, attrs.float("momentum", 0.9)
        )
    attrs.skip("momentum")
    if attrs.int("is_test", 1) == 0:
        raise ctx.fail("training-mode BatchNormalization before opset 14 is not supported")
    if attrs.int("spatial", 1) != 1:
        raise ctx.fail("BatchNormalization spatial=0 is not supported")
    if len([o for o in node.output if o]) > 1:
        raise ctx.fail("BatchNormalization's training outputs need training_mode=1")
    b = ctx.builder
    rank = x.rank
    denominator = b.unary(Unary.SQRT, b.add(running_var, scalar_like(ctx, running_var, eps)))
    y = b.div(b.sub(x, _per_channel(ctx, running_mean, rank)), _per_channel(ctx, denominator, rank))
    return [b.add(b.mul(y, _per_channel(ctx, scale, rank)), _per_channel(ctx, bias, rank))]


def _batch_norm_training(
    ctx: ImportContext, args: tuple[Value, Value, Value, Value, Value], eps: float, momentum: float
) -> list[OnnxValue]:
    """Training-mode BatchNormalization: batch statistics, and the updated running ones."""
    x, scale, bias, running_mean, running_var = args
    b = ctx.builder
    axes = [a for a in range(x.rank) if a != 1]
    batch_mean = mean(ctx, x, axes)
    centered = b.sub(x, batch_mean)
    batch_var = mean(ctx, b.mul(centered, centered), axes)
    rank = x.rank
    y = b.div(centered, b.unary(Unary.SQRT, b.add(batch_var, scalar_like(ctx, x, eps))))
    y = b.add(b.mul(y, _per_channel(ctx, scale, rank)), _per_channel(ctx, bias, rank))
    channels = (x.shape[1],)

    def blend(running: Value, batch: Value) -> Value:
        kept = b.mul(running, scalar_like(ctx, running, momentum))
        return b.add(kept, b.mul(b.view(batch, channels), scalar_like(ctx, running, 1 - momentum)))

    return [y, blend(running_mean, batch_mean), blend(running_var, batch_var)]


@importer("InstanceNormalization")
def _instance_norm(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x, scale, bias = ctx.inputs(node, count=3)
    eps = ctx.attributes(node).float("epsilon", 1e-5)
    b = ctx.builder
    ctx.require_rank(x, 3, "InstanceNormalization's input")
    n, c = x.shape[:2]
    flat = b.view(x, (n, c, numel(x.shape[2:])))
    normed = b.view(b.layer_norm(flat, axis=2, eps=eps), x.shape)
    rank = x.rank
    return [b.add(b.mul(normed, _per_channel(ctx, scale, rank)), _per_channel(ctx, bias, rank))]


@importer("LayerNormalization", since=17)
def _layer_norm(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue | None]:
    x, scale, bias = ctx.inputs(node, count=(2, 3))
    attrs = ctx.attributes(node)
    axis = axis_of(ctx, attrs.int("axis", -1), x.rank)
    eps = attrs.float("epsilon", 1e-5)
    attrs.skip("stash_type")  # knopt computes statistics in at least f32 anyway
    float_dtype(ctx, x, "LayerNormalization")
    b = ctx.builder
    y = b.mul(b.layer_norm(x, axis=axis, eps=eps), scale)
    if bias is not None:
        y = b.add(y, bias)
    outputs: list[OnnxValue | None] = [y]
    if len(node.output) > 1:
        outputs.extend(_norm_statistics(ctx, x, axis, eps))
    return outputs


def _norm_statistics(ctx: ImportContext, x: Value, axis: int, eps: float) -> list[Value]:
    """LayerNormalization's optional Mean and InvStdDev outputs."""
    b = ctx.builder
    axes = list(range(axis, x.rank))
    mu = mean(ctx, x, axes)
    centered = b.sub(x, mu)
    var = mean(ctx, b.mul(centered, centered), axes)
    inv_std = b.unary(Unary.RSQRT, b.add(var, scalar_like(ctx, x, eps)))
    return [mu, inv_std]


@importer("GroupNormalization", since=18)
def _group_norm(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x, scale, bias = ctx.inputs(node, count=3)
    attrs = ctx.attributes(node)
    groups = attrs.int("num_groups")
    eps = attrs.float("epsilon", 1e-5)
    attrs.skip("stash_type")
    b = ctx.builder
    ctx.require_rank(x, 2, "GroupNormalization's input")
    n, c = x.shape[:2]
    flat = b.view(x, (n, groups, numel(x.shape[1:]) // groups))
    normed = b.view(b.layer_norm(flat, axis=2, eps=eps), x.shape)
    if scale.shape[0] != c:  # opset 18: one scale and bias per group
        per = c // groups
        scale = b.view(b.broadcast(b.view(scale, (groups, 1)), (groups, per)), (c,))
        bias = b.view(b.broadcast(b.view(bias, (groups, 1)), (groups, per)), (c,))
    rank = x.rank
    return [b.add(b.mul(normed, _per_channel(ctx, scale, rank)), _per_channel(ctx, bias, rank))]


@importer("RMSNormalization", since=23)
def _rms_norm(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x, scale = ctx.inputs(node, count=2)
    attrs = ctx.attributes(node)
    axis = axis_of(ctx, attrs.int("axis", -1), x.rank)
    eps = attrs.float("epsilon", 1e-5)
    attrs.skip("stash_type")
    b = ctx.builder
    return [b.mul(b.rms_norm(x, axis=axis, eps=eps), scale)]


@importer("MeanVarianceNormalization")
def _mean_variance_norm(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    axes = ctx.attributes(node).ints("axes", [0, 2, 3])
    axes = sorted(axis_of(ctx, a, x.rank) for a in axes)
    b = ctx.builder
    mu = mean(ctx, x, axes)
    centered = b.sub(x, mu)
    var = mean(ctx, b.mul(centered, centered), axes)
    return [b.div(centered, b.unary(Unary.SQRT, b.add(var, scalar_like(ctx, x, 1e-9))))]


@importer("LRN")
def _lrn(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    attrs = ctx.attributes(node)
    size = attrs.int("size")
    alpha, beta, bias = (
        attrs.float("alpha", 1e-4),
        attrs.float("beta", 0.75),
        attrs.float("bias", 1.0),
    )
    b = ctx.builder
    squared = b.mul(x, x)
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    widths = tuple((before, after) if i == 1 else (0, 0) for i in range(x.rank))
    padded = b.pad(squared, pads=widths)
    channels = x.shape[1]
    total = None
    for offset in range(size):
        part = b.slice(padded, axis=1, start=offset, stop=offset + channels)
        total = part if total is None else b.add(total, part)
    assert total is not None
    scaled = b.add(b.mul(total, scalar_like(ctx, x, alpha / size)), scalar_like(ctx, x, bias))
    return [b.div(x, b.binary(Binary.POW, scaled, scalar_like(ctx, x, beta)))]


@importer("Gemm")
def _gemm(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    a, w, c = ctx.inputs(node, count=(2, 3))
    attrs = ctx.attributes(node)
    alpha, beta = attrs.float("alpha", 1.0), attrs.float("beta", 1.0)
    if attrs.int("broadcast", 1) != 1 and ctx.opset < 7:
        raise ctx.fail("Gemm broadcast=0 is not supported")
    b = ctx.builder
    if attrs.int("transA", 0):
        a = b.permute(a, (1, 0))
    if attrs.int("transB", 0):
        w = b.permute(w, (1, 0))
    y = b.matmul(a, w)
    if alpha != 1.0:
        y = b.mul(y, scalar_like(ctx, y, alpha))
    if c is not None:
        if beta != 1.0:
            c = b.mul(c, scalar_like(ctx, c, beta))
        y = b.add(y, c)
    return [y]


@importer("MatMul")
def _matmul(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    a, w = ctx.inputs(node, count=2)
    ctx.attributes(node)
    return [matmul(ctx, a, w)]


def _softmax_axis(
    ctx: ImportContext, node: onnx.NodeProto, x: Value
) -> tuple[Value, int, tuple[Dim, ...]]:
    """The input prepared for a single-axis softmax-like op, its axis and the final shape.

    Before opset 13 these ops flatten the input to 2-D at `axis` (default 1).
    """
    attrs = ctx.attributes(node)
    if ctx.opset >= 13:
        return x, axis_of(ctx, attrs.int("axis", -1), x.rank), x.shape
    axis = attrs.int("axis", 1)
    axis = axis + x.rank if axis < 0 else axis
    flat = ctx.builder.view(x, (numel(x.shape[:axis]), numel(x.shape[axis:])))
    return flat, 1, x.shape


@importer("Softmax")
def _softmax(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    prepared, axis, shape = _softmax_axis(ctx, node, x)
    return [ctx.builder.view(ctx.builder.softmax(prepared, axis=axis), shape)]


@importer("LogSoftmax")
def _log_softmax(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    prepared, axis, shape = _softmax_axis(ctx, node, x)
    b = ctx.builder
    shifted = b.sub(prepared, b.reduce(Reduction.MAX, prepared, axes=[axis]))
    total = b.reduce(Reduction.SUM, b.unary(Unary.EXP, shifted), axes=[axis])
    return [b.view(b.sub(shifted, b.unary(Unary.LOG, total)), shape)]


@importer("Hardmax")
def _hardmax(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    prepared, axis, shape = _softmax_axis(ctx, node, x)
    if prepared.shape[axis] == 0:  # an empty result, and no largest element to find
        return [x]
    b = ctx.builder
    best = b.arg_reduce(prepared, axis=axis)
    positions = b.iota(prepared.shape[axis], DType.I64)
    positions = b.view(
        positions, tuple(d if i == axis else 1 for i, d in enumerate(prepared.shape))
    )
    hot = b.binary(Binary.EQUAL, best, positions)
    return [b.view(b.cast(hot, x.dtype), shape)]


@importer("LpNormalization")
def _lp_normalization(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    attrs = ctx.attributes(node)
    axis = axis_of(ctx, attrs.int("axis", -1), x.rank)
    p = attrs.int("p", 2)
    if p not in (1, 2):
        raise ctx.fail(f"LpNormalization p={p} is not 1 or 2")
    b = ctx.builder
    if p == 1:
        norm = b.reduce(Reduction.SUM, b.unary(Unary.ABS, x), axes=[axis])
    else:
        norm = b.unary(Unary.SQRT, b.reduce(Reduction.SUM, b.mul(x, x), axes=[axis]))
    zero = scalar_like(ctx, x, 0)
    # A zero norm gives zero, not NaN, as the reference does.
    return [b.where(b.binary(Binary.EQUAL, norm, zero), zero, b.div(x, norm))]
