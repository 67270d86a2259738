"""Importers of ONNX ops of transformer and state-space blocks.

The ops are LinearAttention, CausalConvWithState, RotaryEmbedding, SwiGLU and TensorScatter.

LinearAttention is a recurrence over time; it is unrolled over the static sequence length,
step by step as the ONNX reference computes it (in float32), so results agree to rounding.
"""

from __future__ import annotations

import numpy as np
import onnx

from knopt.ir.dtype import DType
from knopt.ir.graph import Value
from knopt.ir.op import Binary, Unary
from knopt.ir.shape import exact_div
from knopt.onnx.context import ImportContext, OnnxValue, importer
from knopt.onnx.ops.attention import repeat_heads, split_heads
from knopt.onnx.ops.common import axis_of, scalar_like, static_dim

_UPDATE_RULES = ("linear", "gated", "delta", "gated_delta")


def _step(ctx: ImportContext, x: Value, t: int) -> Value:
    """Time step `t` of a `[B, H, T, D]` value, kept as `[B, H, 1, D]`."""
    return ctx.builder.slice(x, axis=2, start=t, stop=t + 1)


@importer("LinearAttention", since=27)
def _linear_attention(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    query, key, value, past_state, decay, beta = ctx.inputs(node, count=(3, 6))
    attrs = ctx.attributes(node)
    attrs.skip("chunk_size")  # a tuning hint: it does not change the result
    rule = attrs.string("update_rule", "gated_delta")
    q_heads, kv_heads = attrs.int("q_num_heads", 0), attrs.int("kv_num_heads", 0)
    scale = attrs.float("scale", 0.0)
    if rule not in _UPDATE_RULES:
        raise ctx.fail(f"update_rule '{rule}' is not one of {', '.join(_UPDATE_RULES)}")
    if q_heads <= 0 or kv_heads <= 0 or q_heads % kv_heads:
        raise ctx.fail(f"q_num_heads {q_heads} must be a positive multiple of kv_num_heads")
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if gated != (decay is not None) or delta != (beta is not None):
        raise ctx.fail(f"update_rule '{rule}' needs decay exactly when gated, beta when delta")
    b = ctx.builder
    q = b.cast(split_heads(ctx, query, q_heads), DType.F32)
    k = b.cast(split_heads(ctx, key, kv_heads), DType.F32)
    v = b.cast(split_heads(ctx, value, kv_heads), DType.F32)
    batch, _, steps, d_k = k.shape
    d_v = v.shape[3]
    if decay is not None:  # per head [B, T, H] or per key channel [B, T, H * d_k]
        width = 1 if decay.shape[2] == kv_heads else d_k
        decay = b.cast(
            b.permute(b.view(decay, (batch, steps, kv_heads, width)), (0, 2, 1, 3)), DType.F32
        )
    if beta is not None:
        heads = beta.shape[2]
        beta = b.cast(b.permute(b.view(beta, (batch, steps, heads, 1)), (0, 2, 1, 3)), DType.F32)
    if past_state is None:
        state = b.scalar(0.0, DType.F32, (batch, kv_heads, d_k, d_v))
        state_dtype = query.dtype
    else:
        state, state_dtype = b.cast(past_state, DType.F32), past_state.dtype
    factor = scalar_like(ctx, q, scale if scale else 1 / np.sqrt(static_dim(ctx, d_k, "d_k")))
    outputs = []
    for t in range(static_dim(ctx, steps, "the sequence length")):
        k_t, v_t = _step(ctx, k, t), _step(ctx, v, t)
        if decay is not None:  # state *= exp(decay), broadcast over d_v
            state = b.mul(state, b.permute(b.unary(Unary.EXP, _step(ctx, decay, t)), (0, 1, 3, 2)))
        if beta is not None:
            retrieved = b.matmul(k_t, state)
            v_t = b.mul(_step(ctx, beta, t), b.sub(v_t, retrieved))
        state = b.add(state, b.mul(b.permute(k_t, (0, 1, 3, 2)), v_t))
        read = repeat_heads(ctx, state, q_heads)
        outputs.append(b.mul(factor, b.matmul(_step(ctx, q, t), read)))
    y = b.permute(b.concat(outputs, axis=2), (0, 2, 1, 3))
    y = b.view(y, (batch, steps, q_heads * d_v))
    return [b.cast(y, query.dtype), b.cast(state, state_dtype)]


@importer("CausalConvWithState", since=27)
def _causal_conv_with_state(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x, w, bias, past = ctx.inputs(node, count=(2, 4))
    activation = ctx.attributes(node).string("activation", "none")
    if activation not in ("none", "silu", "swish"):
        raise ctx.fail(f"activation '{activation}' is not none, silu or swish")
    b = ctx.builder
    batch, channels, _ = ctx.shape_of(x, 3, "the input")
    k = static_dim(ctx, w.shape[2], "the kernel size")
    if past is None:
        past = b.scalar(0.0, x.dtype, (batch, channels, k - 1))
    padded = b.concat([past, x], axis=2) if k > 1 else x
    y = b.conv(
        padded,
        w,
        strides=[1],
        pads=((0, 0),),
        dilations=[1],
        groups=static_dim(ctx, channels, "channels"),
    )
    if bias is not None:
        y = b.add(y, b.view(bias, (channels, 1)))
    if activation != "none":
        y = b.cast(b.unary(Unary.SILU, b.cast(y, DType.F32)), x.dtype)
    length = padded.shape[2]
    present = b.slice(padded, axis=2, start=length - (k - 1), stop=length)
    return [y, present]


def _halves(ctx: ImportContext, x: Value, interleaved: bool) -> tuple[Value, Value]:
    b = ctx.builder
    last = x.rank - 1
    size = x.shape[last]
    if interleaved:
        return (
            b.slice(x, axis=last, start=0, stop=size, step=2),
            b.slice(x, axis=last, start=1, stop=size, step=2),
        )
    half = exact_div(size, 2)
    return b.slice(x, axis=last, start=0, stop=half), b.slice(x, axis=last, start=half, stop=size)


@importer("RotaryEmbedding", since=23)
def _rotary_embedding(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x, cos, sin, position_ids = ctx.inputs(node, count=(3, 4))
    attrs = ctx.attributes(node)
    interleaved = bool(attrs.int("interleaved", 0))
    heads = attrs.int("num_heads", 0)
    rotary = attrs.int("rotary_embedding_dim", 0)
    b = ctx.builder
    if x.rank == 4:  # [B, H, S, D] -> [B, S, H, D]
        work = b.permute(x, (0, 2, 1, 3))
    else:
        if not heads:
            raise ctx.fail("RotaryEmbedding of a 3-D input needs num_heads")
        batch, seq, hidden = ctx.shape_of(x, 3, "RotaryEmbedding's input")
        work = b.view(x, (batch, seq, heads, exact_div(hidden, heads)))
    size = static_dim(ctx, work.shape[3], "the head size")
    rotary = rotary or size
    if position_ids is not None:
        cos, sin = b.gather(cos, position_ids, axis=0), b.gather(sin, position_ids, axis=0)
    cos = b.view(cos, (*cos.shape[:2], 1, cos.shape[2]))
    sin = b.view(sin, (*sin.shape[:2], 1, sin.shape[2]))
    turned = b.slice(work, axis=3, start=0, stop=rotary)
    x1, x2 = _halves(ctx, turned, interleaved)
    real = b.sub(b.mul(cos, x1), b.mul(sin, x2))
    imag = b.add(b.mul(sin, x1), b.mul(cos, x2))
    if interleaved:
        pairs = [b.view(p, (*p.shape, 1)) for p in (real, imag)]
        turned = b.view(b.concat(pairs, axis=4), turned.shape)
    else:
        turned = b.concat([real, imag], axis=3)
    if rotary != size:
        turned = b.concat([turned, b.slice(work, axis=3, start=rotary, stop=size)], axis=3)
    if x.rank == 4:
        return [b.permute(turned, (0, 2, 1, 3))]
    return [b.view(turned, x.shape)]


@importer("SwiGLU", since=28)
def _swiglu(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    a, gate = ctx.inputs(node, count=2)
    alpha = ctx.attributes(node).float("alpha", 1.0)
    if a.type != gate.type:
        raise ctx.fail(f"SwiGLU needs inputs of one type, got {a.type} and {gate.type}")
    b = ctx.builder
    scaled = a if alpha == 1.0 else b.mul(a, scalar_like(ctx, a, alpha))
    return [b.mul(b.mul(a, b.unary(Unary.SIGMOID, scaled)), gate)]


@importer("TensorScatter", since=24)
def _tensor_scatter(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    cache, update, write_indices = ctx.inputs(node, count=(2, 3))
    attrs = ctx.attributes(node)
    mode = attrs.string("mode", "linear")
    axis = axis_of(ctx, attrs.int("axis", -2), cache.rank)
    if mode not in ("linear", "circular"):
        raise ctx.fail(f"TensorScatter mode '{mode}' is not linear or circular")
    b = ctx.builder
    batch, length = cache.shape[0], update.shape[axis]
    rank = cache.rank
    starts = (
        b.scalar(0, DType.I64, (batch,))
        if write_indices is None
        else b.cast(write_indices, DType.I64)
    )
    starts = b.view(starts, (batch, *(1,) * (rank - 1)))
    offsets = b.view(b.iota(length), tuple(length if i == axis else 1 for i in range(rank)))
    positions = b.add(starts, offsets)
    if mode == "circular":
        size = b.constant(
            np.array(static_dim(ctx, cache.shape[axis], "the cache length"), np.int64)
        )
        positions = b.binary(Binary.MOD, positions, size)
    indices = b.broadcast(positions, update.shape)
    return [b.scatter(cache, indices, update, axis=axis)]
