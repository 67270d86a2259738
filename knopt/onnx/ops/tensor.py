"""Importers of ONNX ops that create, reshape, reorder, slice, join and index tensors."""

from __future__ import annotations

import math

import numpy as np
import onnx

from knopt.ir.dtype import DType
from knopt.ir.graph import Value
from knopt.ir.memory import check_rank, check_shape
from knopt.ir.op import Binary, PadMode
from knopt.ir.shape import Dim, Sym, broadcast_shapes, exact_div, numel
from knopt.onnx.context import ImportContext, Known, OnnxValue, importer
from knopt.onnx.data import tensor_array
from knopt.onnx.ops.common import axes_of, axis_of

INT64_MAX = 2**63 - 1
# Larger steps and cuts of a symbolic axis would overflow the optimizer's 64-bit size arithmetic.
MAX_SYMBOLIC_STEP = 2**32


@importer("Constant")
def _constant(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    ctx.inputs(node, count=0)
    attrs = ctx.attributes(node)
    proto = attrs.tensor_proto("value")
    if proto is not None:
        dtype = DType.from_onnx(proto.data_type, ctx.where)
        return [Known(tensor_array(proto, f"{ctx.where}: attribute 'value'"), dtype)]
    for name, dtype, kind in (
        ("value_float", DType.F32, "float"),
        ("value_floats", DType.F32, "floats"),
        ("value_int", DType.I64, "int"),
        ("value_ints", DType.I64, "ints"),
    ):
        if attrs.has(name):
            raw = getattr(attrs, kind)(name)
            return [Known(np.array(raw, dtype.numpy), dtype)]
    raise ctx.fail(
        "Constant needs a tensor, float(s) or int(s) value (sparse and string values "
        "are not supported)"
    )


@importer("ConstantOfShape")
def _constant_of_shape(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    shape = _shape_input(ctx, node, 0, "shape")
    value = ctx.attributes(node).tensor("value")
    if value is not None and value.size != 1:
        raise ctx.fail(f"value must hold one element, not {value.size}")
    fill = np.zeros((), np.float32) if value is None else value.reshape(())
    dtype = DType.from_numpy(fill.dtype)
    # One element broadcast, not a full array: models create large splat weights this way.
    one = ctx.builder.constant(np.full((1,) * len(shape), fill.item(), dtype.numpy))
    return [ctx.builder.broadcast(one, shape)]


def _shape_input(
    ctx: ImportContext, node: onnx.NodeProto, index: int, what: str
) -> tuple[Dim, ...]:
    known = ctx.symbolic_ints(node, index, what)
    if known is None:
        raise ctx.fail(f"input {index} ({what}) is required")
    dims = tuple(known)
    check_rank(len(dims), f"{ctx.where}: input {index} ({what})")
    if any(isinstance(d, int) and d < 0 for d in dims):
        raise ctx.fail(f"{what} {list(dims)} has a negative size")
    return dims


@importer("Shape")
def _shape(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    attrs = ctx.attributes(node)
    rank = x.rank
    start = attrs.int("start", 0)
    end = attrs.int("end", rank)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    dims = np.empty(max(end - start, 0), dtype=object)
    dims[:] = list(x.shape[start:end])
    return [_known_ints(dims)]


def _known_ints(array: np.ndarray) -> Known:
    """An int64 known value; plain int64 unless it holds symbolic sizes."""
    if any(isinstance(v, Sym) for v in array.flat):
        return Known(array.astype(object), DType.I64)
    return Known(np.asarray(array.astype(np.int64)), DType.I64)


@importer("Size")
def _size(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    ctx.attributes(node)
    count = numel(x.shape)
    array = np.empty((), dtype=object)
    array[()] = count
    return [_known_ints(array)]


@importer("Reshape")
def _reshape(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    attrs = ctx.attributes(node)
    if ctx.opset < 5:
        raise ctx.fail("Reshape with a shape attribute (opset < 5) is not supported")
    x = ctx.value(node.input[0])
    requested = list(_signed_shape_input(ctx, node, 1, "shape"))
    allow_zero = attrs.int("allowzero", 0)
    return [ctx.builder.view(x, reshape_target(ctx, x.shape, requested, bool(allow_zero)))]


def _signed_shape_input(
    ctx: ImportContext, node: onnx.NodeProto, index: int, what: str
) -> list[Dim]:
    known = ctx.symbolic_ints(node, index, what)
    if known is None:
        raise ctx.fail(f"input {index} ({what}) is required")
    return known


def reshape_target(
    ctx: ImportContext, shape: tuple[Dim, ...], requested: list[Dim], allow_zero: bool
) -> tuple[Dim, ...]:
    """The shape ONNX Reshape means: 0 copies a dimension, -1 takes what is left."""
    out: list[Dim] = []
    infer_at = None
    for i, d in enumerate(requested):
        if isinstance(d, int) and d == 0 and not allow_zero:
            if i >= len(shape):
                raise ctx.fail(
                    f"shape {requested} copies dimension {i} of a rank {len(shape)} input"
                )
            out.append(shape[i])
        elif isinstance(d, int) and d == -1:
            if infer_at is not None:
                raise ctx.fail(f"shape {requested} has more than one -1")
            infer_at = i
            out.append(1)
        elif isinstance(d, int) and d < -1:
            raise ctx.fail(f"shape {requested} has a negative size")
        else:
            out.append(d)
    if infer_at is not None:
        rest = numel(out)
        if rest == 0:
            raise ctx.fail(f"cannot infer -1 in {requested}: the other sizes multiply to 0")
        out[infer_at] = exact_div(numel(shape), rest)
    return tuple(out)


@importer("Flatten")
def _flatten(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    axis = ctx.attributes(node).int("axis", 1)
    axis = axis + x.rank if axis < 0 else axis
    if not 0 <= axis <= x.rank:
        raise ctx.fail(f"Flatten axis {axis} is out of range for rank {x.rank}")
    return [ctx.builder.view(x, (numel(x.shape[:axis]), numel(x.shape[axis:])))]


def _axes_input_or_attribute(
    ctx: ImportContext, node: onnx.NodeProto, since: int, index: int = 1
) -> list[int] | None:
    """Axes from the attribute (before opset `since`) or from input `index` (from it on)."""
    attrs = ctx.attributes(node)
    if ctx.opset < since:
        return attrs.ints("axes") if attrs.has("axes") else None
    return ctx.known_ints(node, index, "axes")


@importer("Squeeze")
def _squeeze(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x = ctx.value(node.input[0])
    axes = _axes_input_or_attribute(ctx, node, since=13)
    if axes is None:
        if any(not isinstance(d, int) for d in x.shape):
            raise ctx.fail_symbolic(
                "Squeeze without axes on a tensor with symbolic sizes is ambiguous"
            )
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    axes = axes_of(ctx, axes, x.rank)
    for a in axes:
        if x.shape[a] != 1:
            raise ctx.fail(f"cannot squeeze axis {a} of size {x.shape[a]}")
    return [ctx.builder.view(x, tuple(d for i, d in enumerate(x.shape) if i not in axes))]


@importer("Unsqueeze")
def _unsqueeze(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x = ctx.value(node.input[0])
    axes = _axes_input_or_attribute(ctx, node, since=13)
    if axes is None:
        raise ctx.fail("Unsqueeze needs axes")
    return [ctx.builder.view(x, unsqueezed_shape(ctx, x.shape, axes))]


def unsqueezed_shape(
    ctx: ImportContext, shape: tuple[Dim, ...], axes: list[int]
) -> tuple[Dim, ...]:
    """`shape` with size-1 axes inserted at `axes` (positions in the result)."""
    rank = len(shape) + len(axes)
    positions = axes_of(ctx, axes, rank)
    dims = iter(shape)
    return tuple(1 if i in positions else next(dims) for i in range(rank))


@importer("Transpose")
def _transpose(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    perm = ctx.attributes(node).ints("perm", list(range(x.rank))[::-1])
    if sorted(perm) != list(range(x.rank)):
        raise ctx.fail(f"perm {perm} is not a permutation of rank {x.rank}")
    return [ctx.builder.permute(x, perm)]


@importer("Concat")
def _concat(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    values = [v for v in ctx.inputs(node, count=(1, None)) if v is not None]
    axis = ctx.attributes(node).int("axis")
    if any(v.rank == 0 for v in values):
        raise ctx.fail("Concat joins tensors of rank 1 or more, not scalars")
    values = [v for v in values if v.shape[axis_of(ctx, axis, v.rank)] != 0] or values[:1]
    return [ctx.builder.concat(values, axis=axis_of(ctx, axis, values[0].rank))]


@importer("Split")
def _split(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x = ctx.value(node.input[0])
    attrs = ctx.attributes(node)
    axis = axis_of(ctx, attrs.int("axis", 0), x.rank)
    count = len(node.output)
    if ctx.opset < 13:
        sizes = attrs.ints("split") if attrs.has("split") else None
    else:
        sizes = ctx.known_ints(node, 1, "split")
    if ctx.opset >= 18 and attrs.has("num_outputs") and attrs.int("num_outputs") != count:
        raise ctx.fail(
            f"num_outputs is {attrs.int('num_outputs')} but the node has {count} outputs"
        )
    if sizes is not None and len(sizes) != count:
        raise ctx.fail(f"split has {len(sizes)} sizes but the node has {count} outputs")
    dim = x.shape[axis]
    if sizes is None:
        if not isinstance(dim, int):
            sizes = [exact_div(dim, count)] * count  # type: ignore[list-item]
        else:
            chunk = -(-dim // count)
            sizes = [min(chunk, dim - i * chunk) for i in range(count)]
    out: list[OnnxValue] = []
    start: Dim = 0
    for size in sizes:
        out.append(ctx.builder.slice(x, axis=axis, start=start, stop=start + size))
        start = start + size
    return out


@importer("Slice")
def _slice(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    attrs = ctx.attributes(node)
    x = ctx.value(node.input[0])
    if ctx.opset < 10:
        starts: list[Dim] = list(attrs.ints("starts"))
        ends: list[Dim] = list(attrs.ints("ends"))
        axes = attrs.ints("axes", list(range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts = _signed_shape_input(ctx, node, 1, "starts")
        ends = _signed_shape_input(ctx, node, 2, "ends")
        known_axes = ctx.known_ints(node, 3, "axes")
        axes = list(range(len(starts))) if known_axes is None else known_axes
        known_steps = ctx.known_ints(node, 4, "steps")
        steps = [1] * len(starts) if known_steps is None else known_steps
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ctx.fail(
            f"starts {starts}, ends {ends}, axes {axes} and steps {steps} differ in length"
        )
    result = x
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        result = slice_axis(ctx, result, axis_of(ctx, axis, x.rank), start, end, step)
    return [result]


def _clamp_index(index: Dim, dim: Dim, low: int, high_offset: int) -> Dim:
    """ONNX Slice index normalization: negatives count from the end, then clamp."""
    if isinstance(index, int):
        if index < 0:
            if not isinstance(dim, int) and index <= -(INT64_MAX // 2):
                return low  # beyond any size a symbolic one can take (sizes fit in memory)
            index = index + dim
            if isinstance(index, int):
                return max(index, low)
            return index
        if isinstance(dim, int):
            return min(index, dim + high_offset)
        return dim + high_offset if index >= INT64_MAX // 2 else index
    return index


def slice_axis(ctx: ImportContext, x: Value, axis: int, start: Dim, end: Dim, step: int) -> Value:
    """ONNX slicing of one axis, negative steps included."""
    if step == 0:
        raise ctx.fail("Slice step 0 is invalid")
    dim = x.shape[axis]
    if isinstance(dim, int):
        # A step of at least the dimension takes one element at most, whatever its size: a
        # step of -2^63 would not fit in 64 bits once negated.
        step = max(min(step, max(dim, 1)), -max(dim, 1))
    elif abs(step) > MAX_SYMBOLIC_STEP:
        raise ctx.fail(f"Slice step {step} on a symbolic dimension is too large")
    builder = ctx.builder
    if step > 0:
        lo = _clamp_index(start, dim, 0, 0)
        hi = _clamp_index(end, dim, 0, 0)
        if isinstance(lo, int) and isinstance(hi, int) and hi < lo:
            hi = lo
        return builder.slice(x, axis=axis, start=lo, stop=hi, step=step)
    if not isinstance(dim, int):
        raise ctx.fail_symbolic(
            "Slice with a negative step on a symbolic dimension is not supported"
        )
    lo = _clamp_index(start, dim, 0, -1)
    hi = _clamp_index(end, dim, -1, -1)
    if not isinstance(lo, int) or not isinstance(hi, int):
        raise ctx.fail_symbolic("Slice with a negative step needs static starts and ends")
    # Reverse the axis: index i becomes dim - 1 - i and the step becomes positive.
    first, stop = dim - 1 - lo, dim - 1 - hi
    if stop < first:
        stop = first
    flipped = builder.flip(x, axis=axis)
    return builder.slice(flipped, axis=axis, start=first, stop=stop, step=-step)


@importer("Gather")
def _gather(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x, indices = ctx.inputs(node, count=2)
    axis = axis_of(ctx, ctx.attributes(node).int("axis", 0), x.rank)
    return [ctx.builder.gather(x, indices, axis=axis)]


@importer("Expand")
def _expand(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x = ctx.value(node.input[0])
    ctx.attributes(node)
    shape = _shape_input(ctx, node, 1, "shape")
    target = broadcast_shapes(x.shape, shape, ctx.where)
    return [ctx.builder.broadcast(x, target)]


@importer("Tile")
def _tile(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x = ctx.value(node.input[0])
    ctx.attributes(node)
    # Repeats may be symbolic sizes: DETR tiles its learned queries by the dynamic batch.
    repeats = _shape_input(ctx, node, 1, "repeats")
    if len(repeats) != x.rank:
        raise ctx.fail("Tile needs one repeat count per axis")
    builder = ctx.builder
    # Tile = view with a new size-1 axis before each axis, broadcast it, merge the pairs.
    expanded = builder.view(x, tuple(d for dim in x.shape for d in (1, dim)))
    target = tuple(d for r, dim in zip(repeats, x.shape, strict=True) for d in (r, dim))
    tiled = builder.broadcast(expanded, target)
    return [builder.view(tiled, tuple(r * d for r, d in zip(repeats, x.shape, strict=True)))]


_PAD_MODES = {
    "constant": PadMode.CONSTANT,
    "reflect": PadMode.REFLECT,
    "edge": PadMode.EDGE,
    "wrap": PadMode.WRAP,
}


@importer("Pad")
def _pad(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    attrs = ctx.attributes(node)
    x = ctx.value(node.input[0])
    mode_name = attrs.string("mode", "constant")
    if mode_name not in _PAD_MODES:
        raise ctx.fail(f"Pad mode '{mode_name}' is not supported (constant, reflect, edge, wrap)")
    if ctx.opset < 11:
        pads = attrs.ints("pads")
        value = attrs.float("value", 0.0)
        axes = list(range(x.rank))
    else:
        known = ctx.known_ints(node, 1, "pads")
        if known is None:
            raise ctx.fail("Pad needs pads")
        pads = known
        constant = ctx.known_input(node, 2, "constant_value")
        value = 0.0 if constant is None or constant.size == 0 else float(constant.reshape(-1)[0])
        known_axes = ctx.known_ints(node, 3, "axes")
        axes = list(range(x.rank)) if known_axes is None else axes_of(ctx, known_axes, x.rank)
    if len(pads) != 2 * len(axes):
        raise ctx.fail(f"pads {pads} need two entries per padded axis")
    widths = [(0, 0)] * x.rank
    for i, axis in enumerate(axes):
        widths[axis] = (pads[i], pads[i + len(axes)])
    return [pad_signed(ctx, x, widths, _PAD_MODES[mode_name], value)]


def pad_signed(
    ctx: ImportContext, x: Value, widths: list[tuple[int, int]], mode: PadMode, value: float
) -> Value:
    """Pad with possibly negative widths: negative ones crop (a slice) before padding."""
    builder = ctx.builder
    for axis, (before, after) in enumerate(widths):
        if before < 0 or after < 0:
            dim = x.shape[axis]
            cut_before, cut_after = max(-before, 0), max(-after, 0)
            if isinstance(dim, int) and cut_before + cut_after > dim:
                raise ctx.fail(f"pads {before}, {after} cut more than axis {axis} has ({dim})")
            if not isinstance(dim, int) and max(cut_before, cut_after) > MAX_SYMBOLIC_STEP:
                raise ctx.fail(f"pads {before}, {after} cut too much of a symbolic axis {axis}")
            x = builder.slice(x, axis=axis, start=cut_before, stop=dim - cut_after)
    positive = tuple((max(b, 0), max(a, 0)) for b, a in widths)
    return builder.pad(x, pads=positive, mode=mode, value=value)


@importer("Range")
def _range(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    ctx.attributes(node)
    start = ctx.symbolic_input(node, 0, "start")
    limit = ctx.symbolic_input(node, 1, "limit")
    delta = ctx.symbolic_input(node, 2, "delta")
    assert start is not None and limit is not None and delta is not None
    if any(k.array.size != 1 for k in (start, limit, delta)):
        raise ctx.fail("Range takes one value each for start, limit and delta")
    s, lim, d = (k.array.reshape(()).item() for k in (start, limit, delta))
    dtype = start.dtype
    if not any(isinstance(v, Sym) for v in (s, lim, d)):
        if d == 0:
            raise ctx.fail("Range with delta 0 never reaches its limit")
        if not all(np.isfinite(v) for v in (s, lim, d)):
            raise ctx.fail(f"Range from {s} to {lim} by {d} is not finite")
        steps = (lim - s) / d  # finite bounds can still overflow: 1e308 - -1e308 is inf
        if not math.isfinite(steps):
            raise ctx.fail(f"Range from {s} to {lim} by {d} has {steps} elements")
        count = max(math.ceil(steps), 0)
        check_shape([count], dtype.numpy.itemsize, ctx.where)
        values = (s + np.arange(count) * d).astype(dtype.numpy)
        return [Known(values, dtype)]
    if d != 1 or isinstance(s, Sym):
        raise ctx.fail_symbolic("Range over symbolic sizes needs a constant start and delta 1")
    builder = ctx.builder
    iota = builder.iota(lim - s, dtype)
    return [builder.add(iota, builder.constant(np.array(s, dtype.numpy))) if s else iota]


@importer("Trilu")
def _trilu(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x = ctx.value(node.input[0])
    upper = ctx.attributes(node).int("upper", 1)
    known_k = ctx.optional_int(node, 1, "k")
    k = 0 if known_k is None else known_k
    ctx.require_rank(x, 2, "Trilu's input")
    rows, cols = x.shape[-2:]
    builder = ctx.builder
    zero = builder.constant(np.zeros((), x.dtype.numpy))
    if isinstance(rows, int) and isinstance(cols, int):
        i, j = np.indices((rows, cols))
        keep = builder.constant((j - i >= k) if upper else (j - i <= k))
        return [builder.where(keep, x, zero)]
    # Symbolic sizes (a causal mask over the sequence): compare column - row with k at run time.
    row = builder.view(builder.iota(rows), (rows, 1))
    column = builder.view(builder.iota(cols), (1, cols))
    offset = builder.sub(column, row)
    bound = builder.constant(np.array(k, np.int64))
    keep = builder.binary(Binary.GREATER_EQUAL if upper else Binary.LESS_EQUAL, offset, bound)
    return [builder.where(keep, x, zero)]


@importer("OneHot")
def _one_hot(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    indices, _, values = ctx.inputs(node, count=3)
    axis = ctx.attributes(node).int("axis", -1)
    depth = ctx.known_int(node, 1, "depth")
    builder = ctx.builder
    rank = indices.rank + 1
    axis = axis_of(ctx, axis, rank)
    idx = builder.cast(indices, DType.I64)
    # Negative indices count from the end of the depth.
    negative = builder.binary(Binary.LESS, idx, builder.constant(np.array(0, np.int64)))
    idx = builder.where(
        negative, builder.add(idx, builder.constant(np.array(depth, np.int64))), idx
    )
    expanded = builder.view(idx, unsqueezed_shape(ctx, idx.shape, [axis]))
    positions = np.arange(depth, dtype=np.int64).reshape(
        [depth if i == axis else 1 for i in range(rank)]
    )
    hot = builder.binary(Binary.EQUAL, expanded, builder.constant(positions))
    off = builder.slice(values, axis=0, start=0, stop=1)
    on = builder.slice(values, axis=0, start=1, stop=2)
    return [builder.where(hot, builder.view(on, ()), builder.view(off, ()))]


@importer("DepthToSpace")
def _depth_to_space(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    attrs = ctx.attributes(node)
    block = attrs.int("blocksize")
    mode = attrs.string("mode", "DCR")
    n, c, h, w = ctx.shape_of(x, 4, "DepthToSpace's input")
    depth = exact_div(c, block * block)
    builder = ctx.builder
    if mode == "DCR":
        t = builder.view(x, (n, block, block, depth, h, w))
        t = builder.permute(t, (0, 3, 4, 1, 5, 2))
    elif mode == "CRD":
        t = builder.view(x, (n, depth, block, block, h, w))
        t = builder.permute(t, (0, 1, 4, 2, 5, 3))
    else:
        raise ctx.fail(f"DepthToSpace mode '{mode}' is not DCR or CRD")
    return [builder.view(t, (n, depth, h * block, w * block))]


@importer("SpaceToDepth")
def _space_to_depth(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    attrs = ctx.attributes(node)
    block = attrs.int("blocksize")
    mode = attrs.string("mode", "DCR") if ctx.opset >= 28 else "DCR"
    if mode not in ("DCR", "CRD"):
        raise ctx.fail(f"SpaceToDepth mode '{mode}' is not DCR or CRD")
    n, c, h, w = ctx.shape_of(x, 4, "SpaceToDepth's input")
    builder = ctx.builder
    t = builder.view(x, (n, c, exact_div(h, block), block, exact_div(w, block), block))
    # DCR puts the block offsets before the channels, CRD after them.
    t = builder.permute(t, (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4))
    return [builder.view(t, (n, c * block * block, exact_div(h, block), exact_div(w, block)))]


@importer("EyeLike")
def _eye_like(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    (x,) = ctx.inputs(node, count=1)
    attrs = ctx.attributes(node)
    k = attrs.int("k", 0)
    dtype = DType.from_onnx(attrs.int("dtype"), ctx.where) if attrs.has("dtype") else x.dtype
    rows, cols = ctx.shape_of(x, 2, "EyeLike's input")
    if not isinstance(rows, int) or not isinstance(cols, int):
        raise ctx.fail_symbolic("EyeLike on symbolic sizes is not supported")
    return [ctx.builder.constant(np.eye(rows, cols, k, dtype=dtype.numpy))]
