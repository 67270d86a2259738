"""The importer of ONNX Attention (opsets 23 to 25), decomposed into matmuls, masks and softmax.

The decomposition follows the ONNX reference implementation step by step: Q and K are each
scaled by the square root of the scale, the optional softcap bounds the scores, one additive
bias (-inf where a key may not be attended, 0 elsewhere) collects the attention mask, the causal
and sliding-window constraints and the key padding, and rows that can attend no key give zeros
instead of NaN. The rewrite rules recognise the same pattern (rules/attention.egg).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.graph import Value
from knopt.ir.op import Binary, Reduction, Unary
from knopt.ir.shape import Dim, exact_div
from knopt.onnx.context import ImportContext, OnnxValue, importer
from knopt.onnx.ops.common import scalar_like, static_dim
from knopt.onnx.ops.control import import_subgraph

_QK_MODES = (0, 1, 2, 3)  # raw (softcapped) scores, the same, scores + bias, probabilities


@dataclass(frozen=True)
class AttentionSpec:
    """The attributes of one Attention node."""

    is_causal: bool
    scale: float | None
    softcap: float
    qk_mode: int
    softmax_dtype: DType | None
    left_window: int
    right_window: int
    q_heads: int | None
    kv_heads: int | None


def _spec(ctx: ImportContext, node: onnx.NodeProto) -> AttentionSpec:
    attrs = ctx.attributes(node)
    mode = attrs.int("qk_matmul_output_mode", 0)
    if mode not in _QK_MODES:
        raise ctx.fail(f"qk_matmul_output_mode {mode} is not one of {_QK_MODES}")
    precision = attrs.int("softmax_precision", 0)
    windows = (attrs.int("left_window_size", -1), attrs.int("right_window_size", -1))
    if ctx.opset < 25:
        windows = (-1, -1)
    if min(windows) < -1:
        raise ctx.fail(f"window sizes {list(windows)} must be -1 or non-negative")
    return AttentionSpec(
        is_causal=bool(attrs.int("is_causal", 0)),
        scale=attrs.float("scale") if attrs.has("scale") else None,
        softcap=attrs.float("softcap", 0.0),
        qk_mode=mode,
        softmax_dtype=DType.from_onnx(precision, ctx.where) if precision else None,
        left_window=windows[0],
        right_window=windows[1],
        q_heads=attrs.int("q_num_heads") if attrs.has("q_num_heads") else None,
        kv_heads=attrs.int("kv_num_heads") if attrs.has("kv_num_heads") else None,
    )


def split_heads(ctx: ImportContext, x: Value, heads: int | None) -> Value:
    """A 3-D `[batch, seq, heads * size]` input as `[batch, heads, seq, size]`."""
    if x.rank == 4:
        return x
    if heads is None:
        raise ctx.fail("3-D Attention inputs need q_num_heads and kv_num_heads")
    b = ctx.builder
    batch, seq, hidden = ctx.shape_of(x, 3, "a 3-D Attention input")
    split = b.view(x, (batch, seq, heads, exact_div(hidden, heads)))
    return b.permute(split, (0, 2, 1, 3))


def _neg_inf_where_not(ctx: ImportContext, allowed: Value, dtype: DType) -> Value:
    b = ctx.builder
    return b.where(allowed, b.scalar(0.0, dtype), b.scalar(-np.inf, dtype))


def _int_scalar(ctx: ImportContext, dim: Dim) -> Value:
    """A 0-d int64 value holding `dim`, which may be symbolic."""
    b = ctx.builder
    if isinstance(dim, int):
        return b.constant(np.array(dim, np.int64))
    return b.view(b.apply(ops.Sizes((dim,))), ())


def _frontier(ctx: ImportContext, q_len: Dim, past_len: Dim, nonpad: Value | None) -> Value:
    """`i + offset` for each query `i`: the last key it may attend when causal.

    The offset is the number of valid keys before the query block: the cache length, or per
    batch `nonpad_kv_seqlen - q_len` (then the result is `[B, 1, q, 1]`, else `[q, 1]`).
    """
    b = ctx.builder
    rows = b.view(b.iota(q_len), (q_len, 1))
    if nonpad is None:
        return b.add(rows, _int_scalar(ctx, past_len))
    lengths = b.cast(nonpad, DType.I64)
    offset = b.sub(lengths, _int_scalar(ctx, q_len))
    return b.add(rows, b.view(offset, (lengths.shape[0], 1, 1, 1)))


def _window(ctx: ImportContext, spec: AttentionSpec, frontier: Value, cols: Value) -> Value:
    """Whether each key lies inside the sliding window around its query."""
    b = ctx.builder
    diff = b.sub(frontier, cols)  # query position minus key position
    allowed = None
    if spec.left_window >= 0:
        left = b.constant(np.array(spec.left_window, np.int64))
        allowed = b.binary(Binary.LESS_EQUAL, diff, left)
    if spec.right_window >= 0:
        right = b.constant(np.array(-spec.right_window, np.int64))
        inside = b.binary(Binary.GREATER_EQUAL, diff, right)
        allowed = inside if allowed is None else b.binary(Binary.AND, allowed, inside)
    assert allowed is not None
    return allowed


def _padded_mask(ctx: ImportContext, mask: Value, kv_len: Dim, dtype: DType) -> Value:
    """The attention mask widened to `kv_len` keys and made additive (0 or -inf)."""
    b = ctx.builder
    if mask.shape[-1] != kv_len:
        width = kv_len - mask.shape[-1]
        if not isinstance(width, int) or width < 0:
            raise ctx.fail(f"attn_mask has {mask.shape[-1]} keys, more than the {kv_len} keys")
        fill = 0.0 if mask.dtype is DType.BOOL else -np.inf
        pads = (*((0, 0) for _ in mask.shape[:-1]), (0, width))
        mask = b.pad(mask, pads=pads, value=fill)
    return _neg_inf_where_not(ctx, mask, dtype) if mask.dtype is DType.BOOL else mask


def _bias(
    ctx: ImportContext,
    spec: AttentionSpec,
    mask: Value | None,
    dtype: DType,
    lengths: tuple[Dim, Dim, Dim],
    nonpad: Value | None,
) -> Value | None:
    """The additive bias of the scores: the mask, causal and window limits, key padding."""
    b = ctx.builder
    q_len, kv_len, past_len = lengths
    zeros = b.scalar(0.0, dtype, (q_len, kv_len))
    bias = None if mask is None else _padded_mask(ctx, mask, kv_len, dtype)
    if bias is not None and not spec.is_causal:
        bias = b.add(zeros, bias)
    windowed = spec.left_window >= 0 or spec.right_window >= 0
    if spec.is_causal or windowed:
        cols = b.view(b.iota(kv_len), (1, kv_len))
        frontier = _frontier(ctx, q_len, past_len, nonpad)
        if spec.is_causal:
            base = zeros if bias is None else bias
            if windowed:
                base = b.add(zeros, base)
            allowed = b.binary(Binary.LESS_EQUAL, cols, frontier)
            bias = b.add(base, _neg_inf_where_not(ctx, allowed, dtype))
        if windowed:
            bias = zeros if bias is None else b.add(zeros, bias)
            inside = _window(ctx, spec, frontier, cols)
            bias = b.add(bias, _neg_inf_where_not(ctx, inside, dtype))
    if nonpad is not None:
        batch = nonpad.shape[0]
        keys = b.view(b.iota(kv_len), (1, kv_len))
        valid = b.binary(Binary.LESS, keys, b.view(b.cast(nonpad, DType.I64), (batch, 1)))
        padding = b.view(_neg_inf_where_not(ctx, valid, dtype), (batch, 1, 1, kv_len))
        bias = padding if bias is None else b.add(bias, padding)
    return bias


def repeat_heads(ctx: ImportContext, x: Value, heads: int) -> Value:
    """Grouped-query attention: each KV head repeated for its group, `[h0, h0, h1, h1, ...]`."""
    have = x.shape[1]
    if have == heads or not isinstance(have, int) or heads % have:
        return x
    b = ctx.builder
    batch, _, seq, size = ctx.shape_of(x, 4, "a key or value input")
    grouped = b.view(x, (batch, have, 1, seq, size))
    spread = b.broadcast(grouped, (batch, have, heads // have, seq, size))
    return b.view(spread, (batch, heads, seq, size))


def _safe_softmax(ctx: ImportContext, scores: Value, bias: Value | None) -> Value:
    """Softmax over keys; rows with no attendable key (all -inf) give zeros, not NaN."""
    b = ctx.builder
    probabilities = b.softmax(scores, axis=scores.rank - 1)
    if bias is None:
        return probabilities
    zero = b.scalar(0.0, probabilities.dtype)
    neg_inf = b.scalar(-np.inf, scores.dtype)
    peak = b.reduce(Reduction.MAX, scores, axes=[scores.rank - 1])
    probabilities = b.where(b.binary(Binary.EQUAL, peak, neg_inf), zero, probabilities)
    limit = b.reduce(Reduction.MAX, bias, axes=[bias.rank - 1])
    masked = b.binary(Binary.EQUAL, limit, b.scalar(-np.inf, bias.dtype))
    return b.where(masked, zero, probabilities)


@importer("Attention", since=23)
def _attention(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue | None]:
    q, k, v, mask, past_key, past_value, nonpad = ctx.inputs(node, count=(3, 7))
    spec = _spec(ctx, node)
    if nonpad is not None and ctx.opset < 24:
        raise ctx.fail("nonpad_kv_seqlen needs opset 24")
    if (past_key is None) != (past_value is None):
        raise ctx.fail("past_key and past_value must be given together")
    b = ctx.builder
    dtype = q.dtype
    rank = q.rank
    q = split_heads(ctx, q, spec.q_heads)
    k = split_heads(ctx, k, spec.kv_heads)
    v = split_heads(ctx, v, spec.kv_heads)
    past_len: Dim = 0
    if past_key is not None and past_value is not None:
        past_len = past_key.shape[2]
        k = b.concat([past_key, k], axis=2)
        v = b.concat([past_value, v], axis=2)
    present_key, present_value = k, v
    q_len, kv_len = q.shape[2], k.shape[2]
    bias = _bias(ctx, spec, mask, dtype, (q_len, kv_len, past_len), nonpad)
    k = repeat_heads(ctx, k, q.shape[1])  # type: ignore[arg-type]
    v = repeat_heads(ctx, v, q.shape[1])  # type: ignore[arg-type]
    scale = (
        spec.scale
        if spec.scale is not None
        else 1 / np.sqrt(static_dim(ctx, q.shape[3], "the default scale"))
    )
    root = scalar_like(ctx, q, float(np.sqrt(scale)))
    scores = b.matmul(b.mul(q, root), b.permute(b.mul(k, root), (0, 1, 3, 2)))
    if spec.softcap > 0:
        cap = scalar_like(ctx, scores, spec.softcap)
        scores = b.mul(b.unary(Unary.TANH, b.div(scores, cap)), cap)
    exposed = scores
    if bias is not None:
        scores = b.add(scores, bias)
    if spec.qk_mode == 2:
        exposed = scores
    if spec.softmax_dtype is not None:
        scores = b.cast(scores, spec.softmax_dtype)
    probabilities = _safe_softmax(ctx, scores, bias)
    if spec.qk_mode == 3:
        exposed = probabilities
    y = b.matmul(b.cast(probabilities, dtype), v)
    if rank == 3:
        batch, heads, seq, size = y.shape
        y = b.view(b.permute(y, (0, 2, 1, 3)), (batch, seq, heads * size))
    return [y, present_key, present_value, b.cast(exposed, dtype)]


@importer("FlexAttention", since=1, domain="ai.onnx.preview")
def _flex_attention(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    q, k, v = ctx.inputs(node, count=3)
    attrs = ctx.attributes(node)
    score_mod, prob_mod = attrs.graph("score_mod"), attrs.graph("prob_mod")
    precision = attrs.int("softmax_precision", 0)
    if q.rank != 4 or k.rank != 4 or v.rank != 4:
        raise ctx.fail("FlexAttention needs rank-4 Q, K and V")
    scale = (
        attrs.float("scale")
        if attrs.has("scale")
        else 1 / np.sqrt(static_dim(ctx, q.shape[3], "the default scale"))
    )
    softmax_dtype = (
        DType.from_onnx(precision, ctx.where)
        if precision
        else DType.F64
        if q.dtype is DType.F64
        else DType.F32
    )
    b = ctx.builder
    k = repeat_heads(ctx, k, q.shape[1])  # type: ignore[arg-type]
    v = repeat_heads(ctx, v, q.shape[1])  # type: ignore[arg-type]
    root = scalar_like(ctx, q, float(np.sqrt(np.float32(scale))))
    scores = b.matmul(b.mul(q, root), b.permute(b.mul(k, root), (0, 1, 3, 2)))
    scores = b.cast(scores, softmax_dtype)
    if score_mod is not None:
        scores = _modified(ctx, score_mod, scores)
    probabilities = b.softmax(scores, axis=3)
    if prob_mod is not None:
        probabilities = _modified(ctx, prob_mod, probabilities)
    return [b.matmul(b.cast(probabilities, q.dtype), v)]


def _modified(ctx: ImportContext, graph: onnx.GraphProto, x: Value) -> Value:
    """`x` passed through a one-input, one-output modifier subgraph."""
    outputs = import_subgraph(ctx, graph, [x])
    if len(outputs) != 1:
        raise ctx.fail(f"modifier subgraph '{graph.name}' must have exactly one output")
    (result,) = outputs
    return result if isinstance(result, Value) else ctx.materialize(result)
