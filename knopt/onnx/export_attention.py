"""Attention written as the target opset's Attention op, or as what onnxruntime fuses.

From opset 23 the Attention op takes the unsplit `[b, s, h*d]` values when the heads are split
before it and merged after (it splits and merges them itself), and grouped-query heads without
their repetition; before opset 23 attention is MatMul, Softmax and MatMul in the order
onnxruntime fuses (the transposed key and the scale go into its FusedMatMul). The helpers that
find split heads and write the mask serve onnxruntime's own attention ops too
(`knopt.onnx.export_ort`).
"""

from __future__ import annotations

from typing import Any

from knopt.ir import op as ops
from knopt.ir.graph import Node, Value
from knopt.ir.shape import Shape, numel
from knopt.onnx.export_fused import Patterns, absorbed, splat
from knopt.onnx.export_layout import permuted, reshape
from knopt.onnx.writer import Rep, Writer

ATTENTION_OPSET = 23  # the Attention op joined the default domain in opset 23


def split_heads(value: Value) -> tuple[Value, Node, int] | None:
    """`x [b, s, h*d]`, the View that reads it and h, if `value` is x split into heads.

    Split into heads: viewed as `[b, s, h, d]` and permuted to `[b, h, s, d]`.
    """
    permute = value.producer
    if not isinstance(permute.op, ops.Permute) or permute.op.perm != (0, 2, 1, 3):
        return None
    view = permute.inputs[0].producer
    if not isinstance(view.op, ops.View) or view.output.rank != 4:
        return None
    (x,) = view.inputs
    batch, seq, heads, size = view.output.shape
    if not isinstance(heads, int) or x.shape != (batch, seq, heads * size):
        return None
    return x, view, heads


def attention_mask(w: Writer, bias: Value) -> str | None:
    """The additive bias as `[batch or 1, heads or 1, s, t]`, or '' if it is zero.

    The mask form of the Attention ops, standard and onnxruntime's; a single head's `[b, s, t]`
    bias is `[b, 1, s, t]`.
    """
    if splat(w, bias) == 0:
        return ""
    rep = w.rep(bias)
    shape = (1,) * (bias.rank - len(rep.shape)) + tuple(rep.shape)
    if bias.rank == 3:  # one head: [b, s, t] as [b, 1, s, t]
        shape = (shape[0], 1, *shape[1:])
    elif bias.rank != 4:
        return None
    full = (*shape[:2], *bias.shape[-2:])
    name = w.rep_name(rep)
    missing = 4 - len(rep.shape)
    if bias.rank == 3 and len(rep.shape) == 3:
        name = w.em.op("Unsqueeze", [name, w.em.ints([1])])
    elif missing:
        name = w.em.op("Unsqueeze", [name, w.em.ints(list(range(missing)))])
    return w.expanded(Rep(shape, name), full)


def merged_heads(w: Writer, node: Node) -> tuple[Node, list[Value], int, Shape] | None:
    """The attention whose split heads `node` merges, its unsplit q, k and v, h and `[b, s, h*d]`.

    When `node` views `permute(attention(split q, split k, split v))` as `[b, s, h*d]` or a
    reshape of it.
    """
    permute = absorbed(w, node.inputs[0], node, ops.Permute)
    if permute is None or permute.op.perm != (0, 2, 1, 3):  # type: ignore[attr-defined]
        return None
    att = absorbed(w, permute.inputs[0], permute, ops.Attention)
    if att is None:
        return None
    batch, heads, seq, size = att.output.shape
    merged = (batch, seq, heads * size)
    if numel(node.output.shape) != numel(merged) or node.output.shape[-1] != merged[-1]:
        return None
    split = [found for v in att.inputs[:3] if (found := split_heads(v)) is not None]
    if len(split) != 3 or len({found[2] for found in split}) != 1:
        return None
    return att, [x for x, _, _ in split], split[0][2], merged


def _repeated_heads(value: Value) -> Value | None:
    """`k [b, g, t, d]` when `value` is k with each head repeated (grouped-query attention)."""
    outer = value.producer
    if not isinstance(outer.op, ops.View) or value.rank != 4:
        return None
    stretch = outer.inputs[0].producer
    if not isinstance(stretch.op, ops.Broadcast) or stretch.output.rank != 5:
        return None
    inner = stretch.inputs[0].producer
    if not isinstance(inner.op, ops.View):
        return None
    (k,) = inner.inputs
    batch, groups, repeats, seq, size = stretch.output.shape
    if inner.output.shape != (batch, groups, 1, seq, size) or k.shape != (batch, groups, seq, size):
        return None
    return k if value.shape == (batch, groups * repeats, seq, size) else None


def _standard_attention(w: Writer, node: Node) -> Rep | None:
    """Attention of 4-D (or single-head 3-D) operands as the Attention op of opset 23."""
    op = node.op
    assert isinstance(op, ops.Attention)
    q, k, v, bias = node.inputs
    mask = attention_mask(w, bias)
    if w.opset < ATTENTION_OPSET or q.rank not in (3, 4) or mask is None:
        return None
    heads: dict[str, Any] = {"q_num_heads": 1, "kv_num_heads": 1} if q.rank == 3 else {}
    if q.rank == 4:  # grouped-query attention: the op repeats the shared heads itself
        k, v = (_repeated_heads(t) or t for t in (k, v))
    args = [w.exact(q), w.exact(k), w.exact(v), *([mask] if mask else [])]
    return w.output(node, w.em.op("Attention", args, scale=op.scale, **heads))


def _standard_merged_heads(w: Writer, node: Node) -> Rep | None:
    """Attention over split heads merged back by `node`, as Attention of opset 23.

    On the unsplit `[b, s, h*d]` values: the op splits and merges the heads itself.
    """
    if w.opset < ATTENTION_OPSET or (found := merged_heads(w, node)) is None:
        return None
    att, sources, heads, merged = found
    op = att.op
    assert isinstance(op, ops.Attention)
    mask = attention_mask(w, att.inputs[3])
    if mask is None:
        return None
    args = [*(w.exact(x) for x in sources), *([mask] if mask else [])]
    name = w.em.op("Attention", args, scale=op.scale, q_num_heads=heads, kv_num_heads=heads)
    return w.output(node, reshape(w, name, merged, node.output.shape))


def _attention(w: Writer, node: Node) -> Rep:
    """`softmax(q @ k^T * scale + bias) @ v` in standard ops, in the order onnxruntime fuses."""
    op = node.op
    assert isinstance(op, ops.Attention)
    q, k, v, bias = node.inputs
    em = w.em
    rank = q.rank
    swap = [*range(rank - 2), rank - 1, rank - 2]
    keys = permuted(w, k, swap)
    transposed = (*k.shape[:-2], k.shape[-1], k.shape[-2])
    scores = em.op("MatMul", [w.exact(q), w.expanded(keys, transposed)])
    scores = em.op("Mul", [scores, em.scalar(op.scale, node.output.dtype)])
    if splat(w, bias) != 0:
        scores = em.op("Add", [scores, w.name(bias)])
    weights = em.op("Softmax", [scores], axis=-1)
    return w.output(node, em.op("MatMul", [weights, w.exact(v)]))


ATTENTION_PATTERNS: Patterns = {
    ops.View: [_standard_merged_heads],
    ops.Attention: [_standard_attention, _attention],
}
