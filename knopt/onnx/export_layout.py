"""How the writer writes each IR op on its own: reps kept small, layouts folded and composed.

One handler per op class in `HANDLERS`, each `(writer, node) -> Rep`:
- broadcasting stays implicit: a `Broadcast` writes nothing, and elementwise ops and MatMul read
  the smaller reps of their operands (ONNX broadcasts them);
- views, permutations and slices of constants fold into the constant; chains of views or of
  permutations become one Reshape or one Transpose; a Reshape spells known and copied sizes as
  numbers and 0, and at most one size as -1, so it needs no Shape arithmetic;
- `Clamp` to `[0, inf)` is Relu;
- every other op is its standard spelling (`knopt.onnx.export_ops`) on exact-shaped inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from knopt.ir import op as ops
from knopt.ir.graph import Node, Value
from knopt.ir.op import Binary
from knopt.ir.shape import Shape, is_static
from knopt.onnx.export_ops import EXPORTERS, INT64_MAX
from knopt.onnx.writer import Rep, Writer, joined_shape

Handler = Callable[[Writer, Node], Rep]


def _input(w: Writer, node: Node) -> Rep:
    op = node.op
    assert isinstance(op, ops.Input)
    return Rep(node.output.shape, op.input_name)


def _constant(w: Writer, node: Node) -> Rep:
    op = node.op
    assert isinstance(op, ops.Constant)
    return w.constant_rep(op.data.array)


def _broadcast(w: Writer, node: Node) -> Rep:
    return w.rep(node.inputs[0])  # the consumers broadcast, or `exact` expands


def _view(w: Writer, node: Node) -> Rep:
    (x,) = node.inputs
    out = node.output.shape
    if (array := w.array(x)) is not None and is_static(out):
        return w.constant_rep(array.reshape(out))  # type: ignore[arg-type]
    rep = w.rep(x)
    # A rep that is constant along the leading axes stays valid when only those are regrouped.
    kept = len(rep.shape)
    if kept <= min(x.rank, len(out)) and x.shape[x.rank - kept :] == out[len(out) - kept :]:
        return rep
    while isinstance(x.producer.op, ops.View):  # a view of a view is one view
        x = x.producer.inputs[0]
    return w.output(node, reshape(w, w.exact(x), x.shape, out))


def reshape(w: Writer, name: str, source: Shape, target: Shape) -> str:
    """`name` (of shape `source`) reshaped to `target`, with sizes as constants if possible.

    A symbolic size equal to the source's at the same axis is written 0 (copy), and one more
    symbolic size -1 (inferred); only a second one needs sizes computed at run time.
    """
    if tuple(source) == tuple(target):
        return name
    if 0 in target:  # a size of zero, not "copy": spell every size out
        return w.em.op("Reshape", [name, w.em.sizes(target)], allowzero=1)
    dims: list[int] = []
    for axis, dim in enumerate(target):
        if isinstance(dim, int):
            dims.append(dim)
        elif axis < len(source) and source[axis] == dim:
            dims.append(0)
        else:
            dims.append(-1)
    if dims.count(-1) > 1:
        return w.em.op("Reshape", [name, w.em.sizes(target)])
    return w.em.op("Reshape", [name, w.em.ints(dims)])


def _permute(w: Writer, node: Node) -> Rep:
    op = node.op
    assert isinstance(op, ops.Permute)
    return permuted(w, node.inputs[0], op.perm)


def permuted(w: Writer, x: Value, perm: Sequence[int]) -> Rep:
    """The rep of `x` with its axes permuted by `perm`: one Transpose, or none.

    Permutations of permutations compose, constants fold, and a rep that lacks leading axes
    is expanded first.
    """
    perm = list(perm)
    while isinstance(x.producer.op, ops.Permute):  # a permutation of a permutation is one
        inner = x.producer.op.perm
        perm = [inner[p] for p in perm]
        x = x.producer.inputs[0]
    if (array := w.array(x)) is not None:
        return w.constant_rep(np.transpose(array, perm))
    if perm == sorted(perm):
        return w.rep(x)
    rep = w.rep(x)
    if len(rep.shape) == x.rank:  # permute the small rep: a stretched axis stays stretched
        shape = tuple(rep.shape[p] for p in perm)
        return Rep(shape, w.em.op("Transpose", [w.rep_name(rep)], perm=perm))
    shape = tuple(x.shape[p] for p in perm)
    return Rep(shape, w.em.op("Transpose", [w.exact(x)], perm=perm))


def _slice(w: Writer, node: Node) -> Rep:
    op = node.op
    assert isinstance(op, ops.Slice)
    (x,) = node.inputs
    out = node.output.shape
    rep = w.rep(x)
    axis = op.axis - x.rank  # from the right, as the rep's axes line up
    if -axis > len(rep.shape) or rep.shape[axis] == 1:
        return rep  # the rep is stretched along the axis: the slice does not change it
    if rep.array is not None and isinstance(op.start, int) and isinstance(op.stop, int):
        index = [slice(None)] * len(rep.shape)
        index[axis] = slice(op.start, op.stop, op.step)
        return w.constant_rep(rep.array[tuple(index)])
    em = w.em
    stop = em.ints([INT64_MAX]) if op.stop == x.shape[op.axis] else em.sizes([op.stop])
    args = [w.rep_name(rep), em.sizes([op.start]), stop, em.ints([axis])]
    if op.step != 1:
        args.append(em.ints([op.step]))
    shape = list(rep.shape)
    shape[axis] = out[op.axis]
    return Rep(tuple(shape), em.op("Slice", args))


def _flip(w: Writer, node: Node) -> Rep:
    op = node.op
    assert isinstance(op, ops.Flip)
    (x,) = node.inputs
    rep = w.rep(x)
    axis = op.axis - x.rank
    if -axis > len(rep.shape) or rep.shape[axis] == 1:
        return rep
    if rep.array is not None:
        return w.constant_rep(np.flip(rep.array, axis))
    em = w.em
    bounds = [em.ints([-1]), em.ints([-INT64_MAX - 1]), em.ints([axis]), em.ints([-1])]
    return Rep(rep.shape, em.op("Slice", [w.rep_name(rep), *bounds]))


# x op e == x for these splat constants e on the right (or either side, for the commutative ones)
_NEUTRAL: dict[Binary, tuple[object, bool]] = {
    Binary.ADD: (0, True),
    Binary.SUB: (0, False),
    Binary.MUL: (1, True),
    Binary.DIV: (1, False),
    Binary.AND: (True, True),
    Binary.OR: (False, True),
}


def _neutral_operand(w: Writer, node: Node) -> Rep | None:
    """The other operand's rep when one operand is the op's neutral element."""
    op = node.op
    if not isinstance(op, ops.BinaryOp) or op.kind not in _NEUTRAL:
        return None
    neutral, commutative = _NEUTRAL[op.kind]
    a, b = (w.rep(v) for v in node.inputs)
    candidates = [(a, b), (b, a)] if commutative else [(a, b)]
    for kept, other in candidates:
        if other.array is not None and other.array.shape == () and bool(other.array == neutral):
            return kept
    return None


def _elementwise(w: Writer, node: Node) -> Rep:
    """Elementwise ops read their operands' reps: ONNX broadcasts them."""
    if (kept := _neutral_operand(w, node)) is not None:
        return kept
    reps = [w.rep(v) for v in node.inputs]
    name = EXPORTERS[type(node.op)](w.em, node.op, node, [w.rep_name(r) for r in reps])
    return Rep(joined_shape([r.shape for r in reps], node.output.shape), name)


def _clamp(w: Writer, node: Node) -> Rep:
    op = node.op
    assert isinstance(op, ops.Clamp)
    if op.lo == 0 and op.hi == np.inf and node.output.dtype.is_float:
        rep = w.rep(node.inputs[0])
        return Rep(rep.shape, w.em.op("Relu", [w.rep_name(rep)]))
    return _elementwise(w, node)


def _gather(w: Writer, node: Node) -> Rep:
    """Gather from a splat is the splat, whatever the indices."""
    rep = w.rep(node.inputs[0])
    if rep.array is not None and rep.shape == ():
        return rep
    return _exact_inputs(w, node)


def _iota(w: Writer, node: Node) -> Rep:
    op = node.op
    assert isinstance(op, ops.Iota)
    if isinstance(op.length, int):
        return w.constant_rep(np.arange(op.length).astype(op.dtype.numpy))
    return _exact_inputs(w, node)


def _matmul(w: Writer, node: Node) -> Rep:
    """MatMul broadcasts batch axes: operands stretched along them stay small."""
    a, b = node.inputs
    reps = [w.rep(a), w.rep(b)]
    fits = [
        len(r.shape) >= 2 and r.shape[-2:] == v.shape[-2:]
        for r, v in zip(reps, (a, b), strict=True)
    ]
    if all(fits):
        name = w.em.op("MatMul", [w.rep_name(r) for r in reps])
        batch = joined_shape([r.shape[:-2] for r in reps], node.output.shape[:-2])
        return Rep((*batch, *node.output.shape[-2:]), name)
    return _exact_inputs(w, node)


def _rope(w: Writer, node: Node) -> Rep:
    """Rope on x as it is (its last axis rotates) and small cos and sin (the products broadcast)."""
    x, cos, sin = node.inputs
    args = [w.exact(x), w.name(cos), w.name(sin)]
    return w.output(node, EXPORTERS[ops.Rope](w.em, node.op, node, args))


def _exact_inputs(w: Writer, node: Node) -> Rep:
    """The op's standard spelling on inputs of their exact shapes."""
    args = [w.exact(v) for v in node.inputs]
    return w.output(node, EXPORTERS[type(node.op)](w.em, node.op, node, args))


HANDLERS: dict[type[ops.Op], Handler] = {
    ops.Input: _input,
    ops.Constant: _constant,
    ops.Iota: _iota,
    ops.Sizes: _exact_inputs,
    ops.View: _view,
    ops.Broadcast: _broadcast,
    ops.Permute: _permute,
    ops.Slice: _slice,
    ops.Flip: _flip,
    ops.Pad: _exact_inputs,
    ops.Concat: _exact_inputs,
    ops.Gather: _gather,
    ops.Scatter: _exact_inputs,
    ops.Cast: _elementwise,
    ops.UnaryOp: _elementwise,
    ops.BinaryOp: _elementwise,
    ops.Clamp: _clamp,
    ops.Where: _elementwise,
    ops.Reduce: _exact_inputs,
    ops.ArgReduce: _exact_inputs,
    ops.ArgSort: _exact_inputs,
    ops.CumSum: _exact_inputs,
    ops.MatMul: _matmul,
    ops.Conv: _exact_inputs,
    ops.Pool: _exact_inputs,
    ops.Softmax: _exact_inputs,
    ops.LayerNorm: _exact_inputs,
    ops.RmsNorm: _exact_inputs,
    ops.Attention: _exact_inputs,
    ops.Rope: _rope,
    ops.IntMatMul: _exact_inputs,
    ops.IntConv: _exact_inputs,
    ops.Int4MatMul: _exact_inputs,
    ops.Opaque: _exact_inputs,  # what it does with a smaller operand is unknown
}
