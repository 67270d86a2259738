"""Recognised patterns written as onnxruntime's com.microsoft fused ops (`--target onnxruntime`).

Only ops that onnxruntime documents (docs/ContribOperators.md) and runs on its CPU provider;
each is checked against onnxruntime's own kernel in tests/onnx/test_export_ort.py. Where a
pattern does not fit an op's constraints it returns None and the standard spelling is written.

- LayerNorm of a sum (times a scale, plus a bias): SkipLayerNormalization, which also returns
  the sum for the residual path and absorbs a bias added to one operand; RmsNorm of a sum
  times a scale: SkipSimplifiedLayerNormalization.
- Conv (plus a channel bias) then Relu, Clip, Sigmoid or Tanh: FusedConv.
- GELU (plus a bias before it): Gelu, BiasGelu; the tanh GELU: FastGelu (with its bias);
  SiLU: QuickGelu with alpha 1.
- Attention over heads split from `[batch, sequence, hidden]` values and merged back after:
  Attention when q, k and v are projections of one input by constant weights (one GEMM for
  all three, sliced from one product or from three), else MultiHeadAttention.
"""

from __future__ import annotations

import numpy as np

from knopt.ir import op as ops
from knopt.ir.graph import Node, Value
from knopt.ir.op import Binary, Unary
from knopt.onnx.export_attention import attention_mask, merged_heads
from knopt.onnx.export_fused import (
    Patterns,
    absorbed,
    channel_vector,
    is_binary,
    norm_affine,
    operand_pairs,
    trailing,
)
from knopt.onnx.export_layout import reshape
from knopt.onnx.export_ops import conv_attributes, ones
from knopt.onnx.writer import Rep, Writer

MS_DOMAIN = "com.microsoft"
_GELU_OPSET = 20  # from here the standard Gelu is one node as well


# ---- normalizations of a residual sum ----------------------------------------------------


def _skip_operands(w: Writer, total: Value) -> tuple[str, str, str] | None:
    """(input, skip, bias) when `total` is the sum of two tensors of its shape.

    A bias vector added to the first is absorbed (bias '' when there is none).
    """
    if not is_binary(total.producer, Binary.ADD):
        return None
    add = total.producer
    for a, b in operand_pairs(add):
        inner = absorbed(w, a, add, ops.BinaryOp)
        if inner is not None and is_binary(inner, Binary.ADD):
            for x, vector in operand_pairs(inner):
                bias = trailing(w, vector, total.shape[-1:])
                if bias is not None and w.rep(x).shape == total.shape:
                    return w.exact(x), w.exact(b), bias
    a, b = add.inputs
    return w.exact(a), w.exact(b), ""


def _skip_norm(w: Writer, node: Node, norm_class: type[ops.Op], op_type: str) -> Rep | None:
    """`norm(a + b) [* scale] [+ shift]` as onnxruntime's Skip*Normalization op."""
    try:
        norm, scale, shift = norm_affine(w, node, norm_class)
    except LookupError:
        return None
    op = norm.op
    assert isinstance(op, ops.LayerNorm | ops.RmsNorm)
    (total,) = norm.inputs
    if op.axis != total.rank - 1 or total.rank not in (2, 3):
        return None
    simplified = norm_class is ops.RmsNorm
    if simplified and (scale is None or shift is not None):
        return None
    if (operands := _skip_operands(w, total)) is None:
        return None
    hidden = total.shape[-1:]
    gamma = ones(w.em, norm, op.axis) if scale is None else trailing(w, scale, hidden)
    beta = "" if shift is None else trailing(w, shift, hidden)
    if gamma is None or beta is None:
        return None
    x, skip, bias = operands
    args = [x, skip, gamma, bias] if simplified else [x, skip, gamma, beta, bias]
    shared = not w.only_read_by(total, norm)  # the residual path reads the sum as well
    names = w.em.op_outputs(
        op_type,
        args,
        outputs=[True, False, False, shared],
        domain=MS_DOMAIN,
        epsilon=op.eps,
    )
    if shared:
        w.set(total, Rep(total.shape, names[3]))
    return w.output(node, names[0])


def _skip_layer_norm(w: Writer, node: Node) -> Rep | None:
    return _skip_norm(w, node, ops.LayerNorm, "SkipLayerNormalization")


def _skip_rms_norm(w: Writer, node: Node) -> Rep | None:
    if not is_binary(node, Binary.MUL):
        return None
    return _skip_norm(w, node, ops.RmsNorm, "SkipSimplifiedLayerNormalization")


# ---- activations -------------------------------------------------------------------------


def _gelu(w: Writer, node: Node) -> Rep | None:
    """GELU and the tanh GELU, with a bias added before them when there is one."""
    op = node.op
    assert isinstance(op, ops.UnaryOp)
    if op.kind not in (Unary.GELU, Unary.GELU_TANH) or node.output.dtype.is_int:
        return None
    (x,) = node.inputs
    exact = op.kind is Unary.GELU
    add = absorbed(w, x, node, ops.BinaryOp)
    if add is not None and is_binary(add, Binary.ADD):
        for value, vector in operand_pairs(add):
            bias = trailing(w, vector, x.shape[-1:])
            if bias is not None and w.rep(value).shape == x.shape:
                op_type = "BiasGelu" if exact else "FastGelu"
                return w.output(node, w.em.op(op_type, [w.exact(value), bias], domain=MS_DOMAIN))
    if exact and w.opset >= _GELU_OPSET:
        return None  # the standard Gelu is one node too
    rep = w.rep(x)
    name = w.em.op("Gelu" if exact else "FastGelu", [w.rep_name(rep)], domain=MS_DOMAIN)
    return Rep(rep.shape, name)


def _quick_gelu(w: Writer, node: Node) -> Rep | None:
    """SiLU, `x * sigmoid(x)`: QuickGelu with alpha 1."""
    op = node.op
    assert isinstance(op, ops.UnaryOp)
    if op.kind is not Unary.SILU or node.output.dtype.is_int:
        return None
    rep = w.rep(node.inputs[0])
    return Rep(rep.shape, w.em.op("QuickGelu", [w.rep_name(rep)], domain=MS_DOMAIN, alpha=1.0))


# ---- convolutions ------------------------------------------------------------------------


def _activation(node: Node) -> tuple[str, list[float]] | None:
    """FusedConv's name and parameters for the activation `node` computes."""
    op = node.op
    if isinstance(op, ops.UnaryOp) and op.kind in _CONV_ACTIVATIONS:
        return _CONV_ACTIVATIONS[op.kind], []
    if isinstance(op, ops.Clamp) and np.isfinite(op.lo) and np.isfinite(op.hi):
        return "Clip", [op.lo, op.hi]
    if isinstance(op, ops.Clamp) and op.lo == 0 and op.hi == np.inf:
        return "Relu", []
    return None


_CONV_ACTIVATIONS = {Unary.RELU: "Relu", Unary.SIGMOID: "Sigmoid", Unary.TANH: "Tanh"}


def _fused_conv(w: Writer, node: Node) -> Rep | None:
    """Conv, plus a channel bias, then an activation: FusedConv.

    A residual added before the activation stays an Add: as FusedConv's input Z it kept
    onnxruntime from its NCHWc convolutions, and ResNet ran 6-8% slower
    (benchmarks/onnx_output.py, one and two threads).
    """
    if (activation := _activation(node)) is None or not node.output.dtype.is_float:
        return None
    (y,) = node.inputs
    conv = _conv_with_bias(w, y, node)
    if conv is None:
        return None
    conv_node, bias = conv
    assert isinstance(conv_node.op, ops.Conv)
    kind, params = activation
    args = [*(w.exact(v) for v in conv_node.inputs), *([bias] if bias else [])]
    name = w.em.op(
        "FusedConv",
        args,
        domain=MS_DOMAIN,
        activation=kind,
        activation_params=params or None,
        **conv_attributes(conv_node.op),
    )
    return w.output(node, name)


def _conv_with_bias(w: Writer, value: Value, reader: Node) -> tuple[Node, str] | None:
    """The Conv node computing `value`, and its bias vector ('' for none)."""
    if (conv := absorbed(w, value, reader, ops.Conv)) is not None:
        return conv, ""
    add = absorbed(w, value, reader, ops.BinaryOp)
    if add is None or not is_binary(add, Binary.ADD):
        return None
    for inner, bias in operand_pairs(add):
        conv = absorbed(w, inner, add, ops.Conv)
        if conv is not None and (vector := channel_vector(w, bias, value.shape)) is not None:
            return conv, vector
    return None


# ---- attention ---------------------------------------------------------------------------


def _product_of(value: Value) -> tuple[Value, Value, Value | None] | None:
    """(x, weights, bias) when `value` is `x @ weights + bias` (the bias may be absent).

    The product may be taken on x with its leading axes flattened and viewed back after;
    x and `value` have the same leading axes.
    """
    v = value
    if isinstance(v.producer.op, ops.View):
        v = v.producer.inputs[0]
    bias = None
    if is_binary(v.producer, Binary.ADD):
        pairs = operand_pairs(v.producer)
        found = [(a, b) for a, b in pairs if isinstance(a.producer.op, ops.MatMul)]
        if not found:
            return None
        v, bias = found[0]
    if not isinstance(v.producer.op, ops.MatMul):
        return None
    x, weights = v.producer.inputs
    if isinstance(x.producer.op, ops.View):
        x = x.producer.inputs[0]
    if x.shape[:-1] != value.shape[:-1] or (bias is not None and bias.rank > 1 + value.rank):
        return None
    return x, weights, bias


def _pieces(sources: list[Value]) -> tuple[Value, list[int]] | None:
    """The value that `sources` are consecutive slices of, and their widths.

    Slices along the last axis, in order, that together cover it.
    """
    cuts = [s.producer.op for s in sources]
    if not all(isinstance(c, ops.Slice) for c in cuts):
        return None
    whole = sources[0].producer.inputs[0]
    widths: list[int] = []
    for source, cut in zip(sources, cuts, strict=True):
        assert isinstance(cut, ops.Slice)
        if source.producer.inputs[0] is not whole or cut.axis != whole.rank - 1:
            return None
        if cut.start != sum(widths) or cut.step != 1 or not isinstance(cut.stop, int):
            return None
        widths.append(cut.stop - sum(widths))
    return (whole, widths) if sum(widths) == whole.shape[-1] else None


def _constant_matrix(w: Writer, value: Value) -> np.ndarray | None:
    array = w.rep(value).array
    return array if array is not None and array.ndim == 2 else None


def _packed(w: Writer, sources: list[Value]) -> tuple[Value, str, str, list[int]] | None:
    """The input, `[k, 3n]` weights, `[3n]` bias and widths of q, k and v.

    When all three are projections of one input by constant weights: sliced from one product,
    or three products.
    """
    if (pieces := _pieces(sources)) is not None:
        found = _product_of(pieces[0])
        if found is None or (matrix := _constant_matrix(w, found[1])) is None:
            return None
        x, _, bias = found
        widths = pieces[1]
        products: list[tuple[np.ndarray, Value | None]] = [(matrix, bias)]
    else:
        found_all = [_product_of(s) for s in sources]
        if any(f is None for f in found_all):
            return None
        triples = [f for f in found_all if f is not None]
        if len({f[0] for f in triples}) != 1:
            return None
        x = triples[0][0]
        matrices = [_constant_matrix(w, f[1]) for f in triples]
        if any(m is None for m in matrices):
            return None
        products = [(m, f[2]) for m, f in zip(matrices, triples, strict=True)]  # type: ignore[misc]
        widths = [m.shape[1] for m, _ in products]
    vectors = []
    for matrix, bias in products:
        vector = np.zeros(matrix.shape[1], matrix.dtype) if bias is None else w.rep(bias).array
        if vector is None or vector.ndim > 1:
            return None
        vectors.append(np.broadcast_to(vector, (matrix.shape[1],)))
    if x.rank != 3:
        return None
    weights = np.concatenate([m for m, _ in products], axis=1)
    return x, w.em.constant(weights), w.em.constant(np.concatenate(vectors)), widths


def _attention_op(w: Writer, att: Node, sources: list[Value], heads: int) -> str | None:
    """Attention or MultiHeadAttention of `att` from its `[b, s, hidden]` sources."""
    op = att.op
    assert isinstance(op, ops.Attention)
    mask = attention_mask(w, att.inputs[3])
    if mask is None:
        return None
    if (packed := _packed(w, sources)) is not None:
        x, weights, bias, widths = packed
        return w.em.op(
            "Attention",
            [w.exact(x), weights, bias, "", "", mask],
            domain=MS_DOMAIN,
            num_heads=heads,
            scale=op.scale,
            qkv_hidden_sizes=widths,
        )
    return w.em.op(
        "MultiHeadAttention",
        [*(w.exact(s) for s in sources), "", "", mask],
        domain=MS_DOMAIN,
        num_heads=heads,
        scale=op.scale,
    )


def _merged_heads(w: Writer, node: Node) -> Rep | None:
    """Attention over split heads whose result `node` merges back to `[b, s, h*d]`."""
    if (found := merged_heads(w, node)) is None:
        return None
    att, sources, heads, merged = found
    name = _attention_op(w, att, sources, heads)
    if name is None:
        return None
    return w.output(node, reshape(w, name, merged, node.output.shape))


def _single_head(w: Writer, node: Node) -> Rep | None:
    """Attention of `[b, s, d]` operands: one head."""
    q, k, v, _ = node.inputs
    if q.rank != 3:
        return None
    name = _attention_op(w, node, [q, k, v], 1)
    return None if name is None else w.output(node, name)


ORT_PATTERNS: Patterns = {
    ops.BinaryOp: [_skip_layer_norm, _skip_rms_norm],
    ops.UnaryOp: [_fused_conv, _gelu, _quick_gelu],
    ops.Clamp: [_fused_conv],
    ops.View: [_merged_heads],
    ops.Attention: [_single_head],
}
