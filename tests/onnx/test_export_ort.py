"""`--target onnxruntime`: each com.microsoft fused op against onnxruntime's own kernel.

Every case exports a small IR graph for onnxruntime, checks that the fused op is in the file,
and runs it (as written, and fully optimized) with the results of knopt's CPU executor.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest

from knopt.ir import GraphBuilder
from knopt.ir.dtype import DType
from knopt.ir.graph import Graph, Value
from knopt.ir.op import Attention, Binary, Unary
from tests.onnx.test_export_fused import BATCH, SEQ, check, constant, feeds_for, graph_of, ops_of

F32 = DType.F32
MS = "com.microsoft"


def ms_ops(model: onnx.ModelProto) -> Counter[str]:
    """How many nodes of each com.microsoft op the model has."""
    return Counter(node.op_type for node in model.graph.node if node.domain == MS)


def _check(graph: Graph, rng: np.random.Generator, **sizes: int) -> onnx.ModelProto:
    return check(graph, feeds_for(graph, rng, sizes), target="onnxruntime")


# ---- normalizations of a residual sum ------------------------------------------------------


@pytest.mark.parametrize("rank", [2, 3])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("projection_bias", [False, True])
@pytest.mark.parametrize("eps", [1e-5, 1e-12])
def test_layer_norm_of_a_sum_is_skip_layer_normalization(
    rng: np.random.Generator, rank: int, residual: bool, projection_bias: bool, eps: float
) -> None:
    def build(b: GraphBuilder) -> None:
        shape = (BATCH, SEQ, 16)[3 - rank :]
        x, skip = b.input("x", shape, F32), b.input("skip", shape, F32)
        if projection_bias:
            x = b.add(x, constant(b, rng, (16,)))
        total = b.add(x, skip)
        y = b.layer_norm(total, axis=rank - 1, eps=eps)
        b.output(b.add(b.mul(y, constant(b, rng, (16,))), constant(b, rng, (16,))), "y")
        if residual:  # the next block reads the sum too
            b.output(b.unary(Unary.TANH, total), "residual")

    graph = graph_of(build)
    model = _check(graph, rng, batch=2, seq=3)
    assert ms_ops(model) == Counter({"SkipLayerNormalization": 1})
    assert ops_of(model)["Add"] == 0
    (skip_norm,) = [n for n in model.graph.node if n.op_type == "SkipLayerNormalization"]
    assert (len(skip_norm.output) == 4) == residual


def test_rms_norm_of_a_sum_is_skip_simplified_layer_normalization(
    rng: np.random.Generator,
) -> None:
    def build(b: GraphBuilder) -> None:
        x, skip = (b.input(name, (BATCH, SEQ, 16), F32) for name in ("x", "skip"))
        total = b.add(x, skip)
        b.output(b.mul(b.rms_norm(total, axis=2, eps=1e-6), constant(b, rng, (16,))), "y")
        b.output(b.add(total, x), "residual")

    graph = graph_of(build)
    model = _check(graph, rng, batch=2, seq=3)
    assert ms_ops(model) == Counter({"SkipSimplifiedLayerNormalization": 1})


def test_norm_over_more_than_the_last_axis_stays_standard(rng: np.random.Generator) -> None:
    def build(b: GraphBuilder) -> None:
        x, skip = (b.input(name, (2, 4, 6), F32) for name in ("x", "skip"))
        b.output(b.layer_norm(b.add(x, skip), axis=1, eps=1e-5), "y")

    graph = graph_of(build)
    model = _check(graph, rng)
    assert not ms_ops(model)
    assert ops_of(model) == Counter({"Add": 1, "LayerNormalization": 1})


# ---- activations ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "with_bias", "op_type"),
    [
        (Unary.GELU, True, "BiasGelu"),
        (Unary.GELU, False, "Gelu"),
        (Unary.GELU_TANH, True, "FastGelu"),
        (Unary.GELU_TANH, False, "FastGelu"),
    ],
)
def test_gelus_are_onnxruntime_gelus(
    rng: np.random.Generator, kind: Unary, with_bias: bool, op_type: str
) -> None:
    def build(b: GraphBuilder) -> None:
        x = b.input("x", (BATCH, SEQ, 16), F32)
        if with_bias:
            x = b.add(constant(b, rng, (16,)), x)
        b.output(b.unary(kind, x), "y")

    graph = graph_of(build)
    model = _check(graph, rng, batch=2, seq=3)
    assert ms_ops(model) == Counter({op_type: 1})
    assert len(model.graph.node) == 1


def test_gelu_at_opset_20_is_the_standard_gelu(rng: np.random.Generator) -> None:
    def build(b: GraphBuilder) -> None:
        b.output(b.unary(Unary.GELU, b.input("x", (BATCH, 16), F32)), "y")

    graph = graph_of(build)
    model = check(graph, feeds_for(graph, rng, {"batch": 2}), opset=20, target="onnxruntime")
    assert ops_of(model) == Counter({"Gelu": 1})
    assert not ms_ops(model)


def test_silu_is_quick_gelu_with_alpha_one(rng: np.random.Generator) -> None:
    def build(b: GraphBuilder) -> None:
        b.output(b.unary(Unary.SILU, b.input("x", (BATCH, 8, 5, 5), F32)), "y")

    graph = graph_of(build)
    model = _check(graph, rng, batch=2)
    assert ms_ops(model) == Counter({"QuickGelu": 1})
    (alpha,) = model.graph.node[0].attribute
    assert alpha.f == 1.0


# ---- attention -----------------------------------------------------------------------------


def _heads(b: GraphBuilder, x: Value, heads: int) -> Value:
    batch, seq, hidden = x.shape
    return b.permute(b.view(x, (batch, seq, heads, hidden // heads)), (0, 2, 1, 3))


def _projection(
    b: GraphBuilder, rng: np.random.Generator, x: Value, width: int, bias: bool
) -> Value:
    weights = b.broadcast(constant(b, rng, (x.shape[-1], width)), (BATCH, x.shape[-1], width))
    y = b.matmul(x, weights)
    return b.add(y, constant(b, rng, (width,))) if bias else y


def _mask(b: GraphBuilder, kind: str, heads: int) -> Value:
    shape = (BATCH, heads, SEQ, SEQ)
    if kind == "none":
        return b.scalar(0.0, F32, shape)
    if kind == "padding":
        return b.broadcast(b.input("mask", (BATCH, 1, 1, SEQ), F32), shape)
    positions = b.iota(SEQ)
    later = b.binary(Binary.GREATER, b.view(positions, (1, SEQ)), b.view(positions, (SEQ, 1)))
    causal = b.where(later, b.constant(np.float32(-1e9)), b.constant(np.float32(0)))
    return b.broadcast(causal, shape)


def _merge(b: GraphBuilder, out: Value) -> Value:
    batch, heads, seq, size = out.shape
    return b.view(b.permute(out, (0, 2, 1, 3)), (batch, seq, heads * size))


def _feeds(graph: Graph, rng: np.random.Generator) -> dict[str, np.ndarray]:
    feeds = feeds_for(graph, rng, {"batch": 2, "seq": 5})
    if "mask" in feeds:
        feeds["mask"] = np.where(rng.random(feeds["mask"].shape) < 0.3, -1e4, 0).astype(np.float32)
    return feeds


@pytest.mark.parametrize("mask", ["none", "padding", "causal"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("sliced", [False, True])
def test_self_attention_of_projections_is_attention(
    rng: np.random.Generator, mask: str, bias: bool, sliced: bool
) -> None:
    heads = 4

    def build(b: GraphBuilder) -> None:
        x = b.input("x", (BATCH, SEQ, 32), F32)
        if sliced:  # one projection to q, k and v at once, sliced (GPT-2's c_attn)
            qkv = _projection(b, rng, x, 96, bias)
            q, k, v = (b.slice(qkv, axis=2, start=i * 32, stop=i * 32 + 32) for i in range(3))
        else:
            q, k, v = (_projection(b, rng, x, 32, bias) for _ in range(3))
        split = [_heads(b, t, heads) for t in (q, k, v)]
        out = b.apply(Attention(0.3), [*split, _mask(b, mask, heads)])
        b.output(_merge(b, out), "y")

    graph = graph_of(build)
    model = check(graph, _feeds(graph, rng), target="onnxruntime")
    assert ms_ops(model) == Counter({"Attention": 1})
    assert not {"MatMul", "Transpose", "Softmax"} & set(ops_of(model))


@pytest.mark.parametrize("mask", ["none", "padding"])
def test_cross_attention_is_multi_head_attention(rng: np.random.Generator, mask: str) -> None:
    def build(b: GraphBuilder) -> None:
        q, k, v = (b.input(name, (BATCH, SEQ, 16), F32) for name in "qkv")
        split = [_heads(b, t, 2) for t in (q, k, v)]
        out = b.apply(Attention(0.25), [*split, _mask(b, mask, 2)])
        b.output(_merge(b, out), "y")

    graph = graph_of(build)
    model = check(graph, _feeds(graph, rng), target="onnxruntime")
    assert ms_ops(model) == Counter({"MultiHeadAttention": 1})
    assert "Transpose" not in ops_of(model)


def test_single_head_attention_is_multi_head_attention_of_one_head(
    rng: np.random.Generator,
) -> None:
    def build(b: GraphBuilder) -> None:
        q, k, v = (b.input(name, (BATCH, SEQ, 8), F32) for name in "qkv")
        bias = b.broadcast(b.input("mask", (BATCH, 1, SEQ), F32), (BATCH, SEQ, SEQ))
        b.output(b.apply(Attention(0.3), [q, k, v, bias]), "y")

    graph = graph_of(build)
    model = check(graph, _feeds(graph, rng), target="onnxruntime")
    assert ms_ops(model) == Counter({"MultiHeadAttention": 1})


# ---- convolutions --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("activation", "kind"),
    [("relu", "Relu"), ("clip", "Clip"), ("sigmoid", "Sigmoid"), ("tanh", "Tanh")],
)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("residual", [False, True])
def test_conv_then_activation_is_fused_conv(
    rng: np.random.Generator, activation: str, kind: str, bias: bool, residual: bool
) -> None:
    def build(b: GraphBuilder) -> None:
        x = b.input("x", (BATCH, 4, 7, 7), F32)
        weights = constant(b, rng, (6, 2, 3, 3))
        y = b.conv(x, weights, strides=(1, 1), pads=((1, 1), (1, 1)), dilations=(1, 1), groups=2)
        if bias:
            y = b.add(y, constant(b, rng, (6, 1, 1)))
        if residual:
            y = b.add(y, b.input("skip", (BATCH, 6, 7, 7), F32))
        if activation == "relu":
            y = b.unary(Unary.RELU, y)
        elif activation == "clip":
            y = b.clamp(y, lo=0.0, hi=6.0)
        else:
            y = b.unary(Unary.SIGMOID if activation == "sigmoid" else Unary.TANH, y)
        b.output(y, "y")

    graph = graph_of(build)
    model = _check(graph, rng, batch=2)
    if residual:  # a residual keeps the Conv standard: onnxruntime's NCHWc kernels fuse it
        assert not ms_ops(model)
        return
    assert ms_ops(model) == Counter({"FusedConv": 1})
    assert len(model.graph.node) == 1
    (conv,) = model.graph.node
    assert [a.s.decode() for a in conv.attribute if a.name == "activation"] == [kind]
