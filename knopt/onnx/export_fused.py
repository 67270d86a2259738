"""Recognised patterns written as the fused standard op of the target opset.

Each pattern is a function `(writer, node) -> Rep | None`, listed under the op class of the
node where its pattern ends, and returns None when the node is not such an end. A pattern
absorbs the nodes before its end only when their results have no other reader, so nothing is
computed twice; the nodes it absorbs were written already and are dropped as unread.

- `LayerNorm` times a scale plus a bias: LayerNormalization with both.
- `RmsNorm` times a scale: RMSNormalization (opset 23), before it the spelling onnxruntime
  fuses (`export_ops.rms_norm`).
- `Conv` plus a per-channel bias: Conv with its bias input.
- a 2-D `MatMul` plus a bias: Gemm (a transposed operand as transA/transB); a MatMul between
  a flattening View and the View that restores the leading axes: MatMul on the unflattened
  input, which ONNX broadcasts.
- a sum times 1/N (or over N): ReduceMean, or GlobalAveragePool over every spatial axis;
  `x - max - log(sum(exp(x - max)))`: LogSoftmax.
- Slices that tile an axis: one Split; Gathers that repeat elements along two or more spatial
  axes (nearest upsampling): one Resize.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from knopt.ir import op as ops
from knopt.ir.graph import Node, Value
from knopt.ir.op import Binary, Reduction, Unary
from knopt.ir.shape import Shape
from knopt.onnx.export_ops import conv_attributes, ones, rms_norm
from knopt.onnx.writer import Rep, Writer

Pattern = Callable[[Writer, Node], "Rep | None"]
Patterns = dict[type[ops.Op], list[Pattern]]


# ---- matching helpers ------------------------------------------------------------------------


def is_binary(node: Node, *kinds: Binary) -> bool:
    """True if `node` is an elementwise binary op of one of `kinds`."""
    return isinstance(node.op, ops.BinaryOp) and node.op.kind in kinds


def operand_pairs(node: Node) -> list[tuple[Value, Value]]:
    """Both orders of a commutative binary node's operands."""
    a, b = node.inputs
    return [(a, b), (b, a)]


def absorbed(w: Writer, value: Value, reader: Node, op_class: type[ops.Op]) -> Node | None:
    """The producer of `value` if it is an `op_class` node that only `reader` reads."""
    producer = value.producer
    if isinstance(producer.op, op_class) and w.only_read_by(value, reader):
        return producer
    return None


def splat(w: Writer, value: Value) -> float | None:
    """The one value a constant holds everywhere, or None."""
    rep = w.rep(value)
    if rep.array is None or rep.array.shape != ():
        return None
    return float(rep.array)


def trailing(w: Writer, value: Value, shape: Shape) -> str | None:
    """`value` as a tensor of exactly `shape`, its own trailing axes, if it only varies there."""
    rep = w.rep(value)
    extra = len(rep.shape) - len(shape)
    if extra > 0:
        if rep.array is None or any(d != 1 for d in rep.shape[:extra]):
            return None
        rep = Rep(rep.shape[extra:], array=rep.array.reshape(rep.array.shape[extra:]))
    return w.expanded(rep, shape)


def channel_vector(w: Writer, value: Value, shape: Shape) -> str | None:
    """A constant `value` that varies only along axis 1 of `shape`, as a vector of that axis."""
    rep = w.rep(value)
    padded = (1,) * (len(shape) - len(rep.shape)) + tuple(rep.shape)
    channels = shape[1]
    if rep.array is None or not isinstance(channels, int):
        return None
    if any(d != 1 for axis, d in enumerate(padded) if axis != 1):
        return None
    vector = np.broadcast_to(rep.array.reshape(-1), (channels,))
    return w.em.constant(np.array(vector))


# ---- normalizations ----------------------------------------------------------------------


def norm_affine(
    w: Writer, node: Node, norm: type[ops.Op]
) -> tuple[Node, Value | None, Value | None]:
    """The norm node, scale and bias when `node` ends `norm(x) [* scale] [+ bias]`.

    Raises:
        LookupError: If it does not.
    """
    if is_binary(node, Binary.ADD):
        for inner, bias in operand_pairs(node):
            if (found := absorbed(w, inner, node, norm)) is not None:
                return found, None, bias
            mul = absorbed(w, inner, node, ops.BinaryOp)
            if mul is not None and is_binary(mul, Binary.MUL):
                for normed, scale in operand_pairs(mul):
                    if (found := absorbed(w, normed, mul, norm)) is not None:
                        return found, scale, bias
    if is_binary(node, Binary.MUL):
        for normed, scale in operand_pairs(node):
            if (found := absorbed(w, normed, node, norm)) is not None:
                return found, scale, None
    raise LookupError


def _layer_norm(w: Writer, node: Node) -> Rep | None:
    """LayerNorm times a scale plus a bias, each varying along the normalized axes only."""
    try:
        norm, scale, bias = norm_affine(w, node, ops.LayerNorm)
    except LookupError:
        return None
    op = norm.op
    assert isinstance(op, ops.LayerNorm)
    shape = node.output.shape[op.axis :]
    scale_name = ones(w.em, norm, op.axis) if scale is None else trailing(w, scale, shape)
    bias_name = "" if bias is None else trailing(w, bias, shape)
    if scale_name is None or bias_name is None:
        return None
    args = [w.exact(norm.inputs[0]), scale_name, *([bias_name] if bias_name else [])]
    return w.output(node, w.em.op("LayerNormalization", args, axis=op.axis, epsilon=op.eps))


def _rms_norm(w: Writer, node: Node) -> Rep | None:
    """RmsNorm times a scale that varies along the normalized axes only."""
    if not is_binary(node, Binary.MUL):
        return None
    for normed, scale in operand_pairs(node):
        norm = absorbed(w, normed, node, ops.RmsNorm)
        if norm is None:
            continue
        op = norm.op
        assert isinstance(op, ops.RmsNorm)
        scale_name = trailing(w, scale, node.output.shape[op.axis :])
        if scale_name is not None:
            return w.output(node, rms_norm(w.em, op, norm, w.exact(norm.inputs[0]), scale_name))
    return None


# ---- convolutions and products -----------------------------------------------------------


def _conv_bias(w: Writer, node: Node) -> Rep | None:
    """Conv plus a bias that varies along the output channels only."""
    if not is_binary(node, Binary.ADD) or not node.output.dtype.is_float:
        return None
    for result, bias in operand_pairs(node):
        conv = absorbed(w, result, node, ops.Conv)
        if conv is None:
            continue
        vector = channel_vector(w, bias, node.output.shape)
        if vector is None:
            continue
        assert isinstance(conv.op, ops.Conv)
        args = [w.exact(v) for v in conv.inputs]
        return w.output(node, w.em.op("Conv", [*args, vector], **conv_attributes(conv.op)))
    return None


def _transposed(value: Value) -> tuple[Value, int]:
    """`value` as a Gemm operand: the matrix it transposes and 1, or itself and 0."""
    op = value.producer.op
    if isinstance(op, ops.Permute) and op.perm == (1, 0):
        return value.producer.inputs[0], 1
    return value, 0


def _gemm(w: Writer, node: Node) -> Rep | None:
    """A product of matrices plus a bias (which Gemm broadcasts)."""
    if not is_binary(node, Binary.ADD) or not node.output.dtype.is_float:
        return None
    if node.output.rank != 2:
        return None
    for result, bias in operand_pairs(node):
        product = absorbed(w, result, node, ops.MatMul)
        if product is None:
            continue
        (a, trans_a), (b, trans_b) = (_transposed(v) for v in product.inputs)
        args = [w.exact(a), w.exact(b), w.name(bias)]
        name = w.em.op("Gemm", args, transA=trans_a or None, transB=trans_b or None)
        return w.output(node, name)
    return None


def _unflattened_product(w: Writer, node: Node) -> Rep | None:
    """`x [..., k]` viewed as `[m, k]`, times `[k, n]` (plus a bias), viewed back as `[..., n]`.

    ONNX's MatMul takes `x` as it is and broadcasts the weights, so neither view is needed.
    """
    (flat,) = node.inputs
    result, bias = flat, None
    add = absorbed(w, flat, node, ops.BinaryOp)
    if add is not None and is_binary(add, Binary.ADD):
        for candidate, other in operand_pairs(add):
            if absorbed(w, candidate, add, ops.MatMul) is not None:
                result, bias = candidate, other
    product = absorbed(w, result, add if add is not None and bias is not None else node, ops.MatMul)
    if product is None or flat.rank != 2:
        return None
    a, weights = product.inputs
    if not isinstance(a.producer.op, ops.View):
        return None
    x = a.producer.inputs[0]
    out = node.output.shape
    if x.shape[:-1] != out[:-1] or x.shape[-1] != a.shape[-1]:
        return None
    weights_rep = w.rep(weights)
    if weights_rep.shape != weights.shape:
        return None
    name = w.em.op("MatMul", [w.exact(x), w.rep_name(weights_rep)])
    if bias is None:
        return w.output(node, name)
    bias_rep = w.rep(bias)
    if any(d != 1 for d in bias_rep.shape[:-1]):
        return None
    return w.output(node, w.em.op("Add", [name, w.rep_name(bias_rep)]))


# ---- reductions --------------------------------------------------------------------------


def _mean(w: Writer, node: Node) -> Rep | None:
    """A sum times 1/N or over N, N the number of elements summed."""
    if is_binary(node, Binary.MUL):
        pairs = operand_pairs(node)
    elif is_binary(node, Binary.DIV):
        pairs = [(node.inputs[0], node.inputs[1])]
    else:
        return None
    for total, factor in pairs:
        reduce = absorbed(w, total, node, ops.Reduce)
        value = splat(w, factor)
        if reduce is None or value is None or not node.output.dtype.is_float:
            continue
        op = reduce.op
        assert isinstance(op, ops.Reduce)
        (x,) = reduce.inputs
        count = math.prod(x.shape[a] for a in op.axes)
        if op.kind is not Reduction.SUM or not isinstance(count, int):
            continue
        expected = 1 / count if is_binary(node, Binary.MUL) else count
        if x.dtype.numpy.type(expected) != x.dtype.numpy.type(value):
            continue
        return w.output(node, mean(w, x, op.axes))
    return None


def mean(w: Writer, x: Value, axes: tuple[int, ...]) -> str:
    """The mean of `x` over `axes`, kept: GlobalAveragePool over every spatial axis."""
    if axes == tuple(range(2, x.rank)) and x.rank >= 3:
        return w.em.op("GlobalAveragePool", [w.exact(x)])
    return w.em.op("ReduceMean", [w.exact(x), w.em.ints(list(axes))], keepdims=1)


def _through_broadcast(value: Value) -> Value:
    while isinstance(value.producer.op, ops.Broadcast):
        value = value.producer.inputs[0]
    return value


def _reduced(value: Value, kind: Reduction) -> tuple[Value, int] | None:
    """The input and axis of a single-axis reduction of `kind` that makes `value`."""
    op = value.producer.op
    if isinstance(op, ops.Reduce) and op.kind is kind and len(op.axes) == 1:
        return value.producer.inputs[0], op.axes[0]
    return None


def _log_softmax(w: Writer, node: Node) -> Rep | None:
    """`(x - max) - log(sum(exp(x - max)))` along one axis: LogSoftmax."""
    if not is_binary(node, Binary.SUB):
        return None
    shifted, total = node.inputs
    log = _through_broadcast(total).producer
    if not isinstance(log.op, ops.UnaryOp) or log.op.kind is not Unary.LOG:
        return None
    summed = _reduced(log.inputs[0], Reduction.SUM)
    if summed is None:
        return None
    exp = summed[0].producer
    if not isinstance(exp.op, ops.UnaryOp) or exp.op.kind is not Unary.EXP:
        return None
    if exp.inputs[0] is not shifted or not is_binary(shifted.producer, Binary.SUB):
        return None
    x, peak = shifted.producer.inputs
    found = _reduced(_through_broadcast(peak), Reduction.MAX)
    if found is None or found[0] is not x or found[1] != summed[1]:
        return None
    return w.output(node, w.em.op("LogSoftmax", [w.exact(x)], axis=summed[1]))


# ---- layout ------------------------------------------------------------------------------


def _split(w: Writer, node: Node) -> Rep | None:
    """Slices that together tile an axis, all of one value: one Split that writes them all."""
    op = node.op
    assert isinstance(op, ops.Slice)
    (x,) = node.inputs
    pieces: list[tuple[int, int, Node]] = []
    for user in dict.fromkeys(x.users()):
        cut = user.op
        if isinstance(cut, ops.Slice) and cut.axis == op.axis and cut.step == 1:
            if not isinstance(cut.start, int) or not isinstance(cut.stop, int):
                return None
            pieces.append((cut.start, cut.stop, user))
    pieces.sort(key=lambda piece: piece[:2])
    edges = [0, *(stop for _, stop, _ in pieces)]
    if len(pieces) < 2 or edges[-1] != x.shape[op.axis]:
        return None
    if any(start != edge for (start, _, _), edge in zip(pieces, edges, strict=False)):
        return None
    rep = w.rep(x)
    axis = op.axis - x.rank
    if -axis > len(rep.shape) or rep.shape[axis] == 1:
        return None  # stretched along the axis: each slice is the rep itself
    sizes = w.em.ints([stop - start for start, stop, _ in pieces])
    names = w.em.op_outputs("Split", [w.rep_name(rep), sizes], outputs=len(pieces), axis=axis)
    for (_, _, piece), name in zip(pieces, names, strict=True):
        shape = list(rep.shape)
        shape[axis] = piece.output.shape[op.axis]
        w.set(piece.output, Rep(tuple(shape), name))
    return w.rep(node.output)


def _repeat_factor(w: Writer, node: Node) -> int | None:
    """The factor f when `node` gathers `i // f` along a spatial axis (nearest upsampling)."""
    op = node.op
    if not isinstance(op, ops.Gather) or op.axis < 2:
        return None
    x, indices = node.inputs
    rep = w.rep(indices)
    size = x.shape[op.axis]
    if rep.array is None or indices.rank != 1 or not isinstance(size, int) or size == 0:
        return None
    factor, remainder = divmod(indices.shape[0], size)  # type: ignore[operator]
    if remainder or not factor:
        return None
    expected = np.arange(size * factor) // factor
    return factor if np.array_equal(np.broadcast_to(rep.array, expected.shape), expected) else None


def _nearest_upsampling(w: Writer, node: Node) -> Rep | None:
    """Gathers that repeat each element along spatial axes: one nearest-neighbour Resize."""
    scales = [1.0] * node.output.rank
    current = node
    while (factor := _repeat_factor(w, current)) is not None:
        axis = current.op.axis  # type: ignore[attr-defined]
        if scales[axis] != 1.0:
            break
        scales[axis] = float(factor)
        source = current.inputs[0]
        inner = absorbed(w, source, current, ops.Gather)
        if inner is None or _repeat_factor(w, inner) is None:
            break
        current = inner
    if sum(s != 1.0 for s in scales) < 2 or not node.output.dtype.is_float:
        return None  # one Gather is as short as one Resize
    x = current.inputs[0]
    name = w.em.op(
        "Resize",
        [w.exact(x), "", w.em.constant(np.array(scales, np.float32))],
        mode="nearest",
        coordinate_transformation_mode="asymmetric",
        nearest_mode="floor",
    )
    return w.output(node, name)


STANDARD: Patterns = {
    ops.BinaryOp: [
        _layer_norm,
        _rms_norm,
        _conv_bias,
        _gemm,
        _mean,
        _log_softmax,
    ],
    ops.View: [_unflattened_product],
    ops.Slice: [_split],
    ops.Gather: [_nearest_upsampling],
}
