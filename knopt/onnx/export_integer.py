"""Dynamically quantized products written as DynamicQuantizeLinear and MatMulInteger.

The integer products of rules/quantize.egg (IntMatMul, IntConv) with per-tensor zero points
(constant or computed) are MatMulInteger and ConvInteger; with others, knopt/onnx/export_ops.py
writes their centered int32 product.

The importer writes DynamicQuantizeLinear out as the ONNX formula (reductions, a scale, a
zero point, rounding) and MatMulInteger as an int32 product of operands less their zero
points; a model quantized with onnxruntime's `quantize_dynamic` has one of each per linear
layer, which would be a dozen nodes where the model had two.

The optimizer turns the division of the range by 255 into a product by 1/255: the op divides,
as the model did before optimization, so the scale can differ from the optimized graph's by one
unit in the last place.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.graph import Node, Value
from knopt.ir.op import Binary, Reduction, Unary
from knopt.onnx.export_fused import Patterns, is_binary
from knopt.onnx.export_ops import conv_attributes
from knopt.onnx.writer import Rep, Writer

_LEVELS = 255.0  # DynamicQuantizeLinear quantizes to uint8


def _source(value: Value) -> Value:
    """`value` before the views and broadcasts that only reshape or repeat it."""
    while isinstance(value.producer.op, ops.View | ops.Broadcast):
        value = value.producer.inputs[0]
    return value


def _splat(value: Value) -> float | None:
    """The one value a constant holds everywhere, read from the graph.

    Not from the reps: the nodes after the one being written have none yet.
    """
    op = _source(value).producer.op
    if not isinstance(op, ops.Constant):
        return None
    found = op.data.splat_value()
    return None if found is None else float(found)


def _users(value: Value, accept: Callable[[Node], bool]) -> list[Node]:
    """The readers of `value`, through views and broadcasts, that `accept` takes."""
    found: list[Node] = []
    for user in dict.fromkeys(value.users()):
        if isinstance(user.op, ops.View | ops.Broadcast):
            found += _users(user.output, accept)
        elif accept(user):
            found.append(user)
    return found


def _is_unary(node: Node, kind: Unary) -> bool:
    return isinstance(node.op, ops.UnaryOp) and node.op.kind is kind


def _is_clamp_255(node: Node) -> bool:
    return isinstance(node.op, ops.Clamp) and (node.op.lo, node.op.hi) == (0.0, _LEVELS)


def _bound(value: Value, kind: Reduction, combine: Binary) -> Value | None:
    """The x of `value = max(reduce_max(x), 0)` (or the min) over every axis of x, or None."""
    node = _source(value).producer
    if not is_binary(node, combine):
        return None
    reduced, zero = node.inputs
    if _splat(zero) != 0:
        return None
    reduced = _source(reduced)  # the whole reduction, perhaps viewed as a scalar
    op = reduced.producer.op
    if not isinstance(op, ops.Reduce) or op.kind is not kind:
        return None
    (x,) = reduced.producer.inputs
    return x if op.axes == tuple(range(x.rank)) else None


def _quantized_range(node: Node) -> tuple[Value, Value] | None:
    """The x of `node = (high - low) / 255` of x, and its (non-positive) low end."""
    divides = is_binary(node, Binary.DIV) and _splat(node.inputs[1]) == _LEVELS
    multiplies = is_binary(node, Binary.MUL) and _splat(node.inputs[1]) == np.float32(1 / _LEVELS)
    if not divides and not multiplies:
        return None
    span = node.inputs[0]
    select = span.producer
    if not isinstance(select.op, ops.Where) or _splat(select.inputs[1]) != 1:
        return None
    equal, difference = select.inputs[0].producer, select.inputs[2].producer
    if not is_binary(equal, Binary.EQUAL) or not is_binary(difference, Binary.SUB):
        return None
    high, low = difference.inputs
    if equal.inputs[0] is not high or equal.inputs[1] is not low:
        return None
    x = _bound(high, Reduction.MAX, Binary.MAX)
    if x is None or x is not _bound(low, Reduction.MIN, Binary.MIN):
        return None
    return x, low


def _zero_point(scale: Value, low: Value) -> Node | None:
    """The node rounding `clamp(0 - low / scale, 0, 255)`: the zero point."""
    for ratio in _users(scale, lambda n: is_binary(n, Binary.DIV) and n.inputs[0] is low):
        for shift in _users(ratio.output, lambda n: is_binary(n, Binary.SUB)):
            if _splat(shift.inputs[0]) != 0:
                continue
            for clamp in _users(shift.output, _is_clamp_255):
                rounds = _users(clamp.output, lambda n: _is_unary(n, Unary.ROUND))
                if rounds:
                    return rounds[0]
    return None


def _same(a: Value, b: Value, depth: int = 16) -> bool:
    """True if `a` and `b` are computed alike from the same values.

    The optimizer may leave such twins: a value it reads the range of, and a copy it divides
    by the scale (resnet_dynamic: the Relu after each ConvInteger).
    """
    if a is b:
        return True
    x, y = a.producer, b.producer
    if depth == 0 or x.op != y.op or isinstance(x.op, ops.Input) or a.type != b.type:
        return False
    if len(x.inputs) != len(y.inputs):
        return False
    return all(_same(p, q, depth - 1) for p, q in zip(x.inputs, y.inputs, strict=True))


def _quantized(x: Value, scale: Value, zero: Value) -> Node | None:
    """The node casting `clamp(round(x / scale) + zero, 0, 255)` to uint8."""

    def divides(node: Node) -> bool:
        return is_binary(node, Binary.DIV) and _same(node.inputs[0], x)

    for ratio in _users(scale, divides):
        for rounding in _users(ratio.output, lambda n: _is_unary(n, Unary.ROUND)):
            for add in _users(rounding.output, lambda n: is_binary(n, Binary.ADD)):
                if _source(add.inputs[1]) is not zero:
                    continue
                for clamp in _users(add.output, _is_clamp_255):
                    casts = _users(
                        clamp.output,
                        lambda n: isinstance(n.op, ops.Cast) and n.op.dtype is DType.U8,
                    )
                    if casts:
                        return casts[0]
    return None


def _dynamic_quantize(w: Writer, node: Node) -> Rep | None:
    """The scale of DynamicQuantizeLinear's formula: the whole op, all three outputs."""
    if node.output.shape != () or (found := _quantized_range(node)) is None:
        return None
    x, low = found
    zero = _zero_point(node.output, low)
    if zero is None or x.dtype is not DType.F32:
        return None
    quantized = _quantized(x, node.output, zero.output)
    if quantized is None:
        return None
    y, scale, zero_point = w.em.op_outputs("DynamicQuantizeLinear", [w.exact(x)], outputs=3)
    w.set(quantized.output, Rep(quantized.output.shape, y))
    for cast in _users(zero.output, lambda n: isinstance(n.op, ops.Cast)):
        if cast.output.dtype is DType.U8 and not w.has(cast.output):
            w.set(cast.output, Rep((), zero_point))
    return Rep((), scale)


def _integer_operand(w: Writer, value: Value) -> tuple[str, str] | None:
    """(8-bit value, its zero point) when `value` is the value widened to int32 less the point."""
    if not is_binary(value.producer, Binary.SUB):
        return None
    widened, zero = value.producer.inputs
    narrow = _narrowed(widened)
    zero_narrow = _narrowed(_source(zero))
    if narrow is None or zero_narrow is None or zero_narrow.dtype is not narrow.dtype:
        return None
    zero_narrow = _source(zero_narrow)  # a scalar, perhaps viewed as [1, 1] before widening
    if zero_narrow.shape != ():
        return None
    return w.exact(narrow), w.name(zero_narrow)


def _narrowed(value: Value) -> Value | None:
    """The 8-bit value that `value` widens to int32."""
    op = value.producer.op
    if not isinstance(op, ops.Cast) or op.dtype is not DType.I32:
        return None
    (narrow,) = value.producer.inputs
    return narrow if narrow.dtype in (DType.U8, DType.I8) else None


def _matmul_integer(w: Writer, node: Node) -> Rep | None:
    """An int32 product of an 8-bit value less its zero point and 8-bit weights."""
    if node.output.dtype is not DType.I32:
        return None
    a, b = node.inputs
    operand = _integer_operand(w, a)
    weights = w.rep(b).array
    if operand is None or weights is None or weights.shape[-2:] != b.shape[-2:]:
        return None
    if weights.size and (weights.min() < -128 or weights.max() > 127):
        return None
    narrow = w.em.constant(weights.astype(np.int8))
    name = w.em.op("MatMulInteger", [operand[0], narrow, operand[1]])
    return w.output(node, name)


def _scalar(w: Writer, value: Value) -> str | None:
    """A 0-d ONNX value of `value` when it holds one number everywhere (a per-tensor zero)."""
    rep = w.rep(value)
    if rep.array is not None:
        flat = rep.array.reshape(-1)
        if flat.size == 0 or not bool(np.all(flat == flat[0])):
            return None
        return w.em.constant(np.asarray(flat[0]))
    if any(d != 1 for d in rep.shape):
        return None
    name = w.rep_name(rep)
    return name if rep.shape == () else w.em.op("Reshape", [name, w.em.ints([])])


def _operand(w: Writer, value: Value) -> str:
    """`value` as a product's operand: its rep where that broadcasts as a product does."""
    rep = w.rep(value)
    if len(rep.shape) >= 2 and rep.shape[-2:] == value.shape[-2:]:
        return w.rep_name(rep)
    return w.exact(value)


def _int_matmul_integer(w: Writer, node: Node) -> Rep | None:
    """IntMatMul with per-tensor zero points: MatMulInteger."""
    a, b, a_zero, b_zero = node.inputs
    zeros = [_scalar(w, z) for z in (a_zero, b_zero)]
    if zeros[0] is None or zeros[1] is None:
        return None
    args = [_operand(w, a), _operand(w, b), zeros[0], zeros[1]]
    return w.output(node, w.em.op("MatMulInteger", args))


def _conv_integer(w: Writer, node: Node) -> Rep | None:
    """IntConv with per-tensor zero points: ConvInteger (onnxruntime takes no other)."""
    op = node.op
    assert isinstance(op, ops.IntConv)
    x, weight, x_zero, w_zero = node.inputs
    zeros = [_scalar(w, z) for z in (x_zero, w_zero)]
    if zeros[0] is None or zeros[1] is None:
        return None
    as_conv = ops.Conv(op.strides, op.pads, op.dilations, op.groups)
    args = [w.exact(x), w.exact(weight), zeros[0], zeros[1]]
    attributes = conv_attributes(as_conv)
    return w.output(node, w.em.op("ConvInteger", args, **attributes))


INTEGER_PATTERNS: Patterns = {
    ops.BinaryOp: [_dynamic_quantize],
    ops.MatMul: [_matmul_integer],
    ops.IntMatMul: [_int_matmul_integer],
    ops.IntConv: [_conv_integer],
}
