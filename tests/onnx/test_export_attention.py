"""Attention as the Attention op of opset 23, or before it as what onnxruntime fuses.

Each case exports a small IR graph, checks the ONNX ops of the file, and runs it on onnxruntime
(as written and optimized) with the results of knopt's CPU executor.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from knopt.ir import GraphBuilder
from knopt.ir.dtype import DType
from knopt.ir.graph import Graph, Value
from knopt.ir.op import Attention, Binary
from tests.onnx.test_export_fused import (
    BATCH,
    SEQ,
    check,
    constant,
    feeds_for,
    graph_of,
    onnxruntime_ops,
    ops_of,
)

F32 = DType.F32


def _attention_graph(
    rng: np.random.Generator, mask: str, *, merged: bool, kv_heads: int = 4
) -> Graph:
    heads, size = 4, 8
    b = GraphBuilder("attention")
    x = b.input("x", (BATCH, SEQ, heads * size), F32)

    def split(width_heads: int) -> Value:
        projected = b.matmul(
            x,
            b.broadcast(
                constant(b, rng, (32, width_heads * size)), (BATCH, 32, width_heads * size)
            ),
        )
        viewed = b.view(projected, (BATCH, SEQ, width_heads, size))
        return b.permute(viewed, (0, 2, 1, 3))

    q, k, v = split(heads), split(kv_heads), split(kv_heads)
    if kv_heads != heads:  # grouped-query attention repeats the shared heads
        repeats = heads // kv_heads

        def repeat(t: Value) -> Value:
            wide = b.broadcast(
                b.view(t, (BATCH, kv_heads, 1, SEQ, size)), (BATCH, kv_heads, repeats, SEQ, size)
            )
            return b.view(wide, (BATCH, heads, SEQ, size))

        k, v = repeat(k), repeat(v)
    if mask == "none":
        bias = b.scalar(0.0, F32, (BATCH, heads, SEQ, SEQ))
    elif mask == "padding":
        bias = b.broadcast(b.input("mask", (BATCH, 1, 1, SEQ), F32), (BATCH, heads, SEQ, SEQ))
    else:  # causal, from positions
        positions = b.iota(SEQ)
        later = b.binary(Binary.GREATER, b.view(positions, (1, SEQ)), b.view(positions, (SEQ, 1)))
        blocked = b.where(later, b.constant(np.float32(-1e9)), b.constant(np.float32(0)))
        bias = b.broadcast(blocked, (BATCH, heads, SEQ, SEQ))
    out = b.apply(Attention(1 / np.sqrt(size)), [q, k, v, bias])
    if merged:
        out = b.view(b.permute(out, (0, 2, 1, 3)), (BATCH, SEQ, heads * size))
    b.output(out, "y")
    return b.build()


def _attention_feeds(graph: Graph, rng: np.random.Generator) -> dict[str, np.ndarray]:
    feeds = feeds_for(graph, rng, {"batch": 2, "seq": 5})
    if "mask" in feeds:
        feeds["mask"] = np.where(rng.random(feeds["mask"].shape) < 0.3, -1e4, 0).astype(np.float32)
    return feeds


@pytest.mark.parametrize("mask", ["none", "padding", "causal"])
@pytest.mark.parametrize("merged", [False, True])
def test_attention_before_opset_23_is_what_onnxruntime_fuses(
    rng: np.random.Generator, mask: str, merged: bool
) -> None:
    graph = _attention_graph(rng, mask, merged=merged)
    model = check(graph, _attention_feeds(graph, rng))
    found = ops_of(model)
    assert found["Softmax"] == 1
    assert "Expand" not in found  # the mask broadcasts over heads
    assert ("Add" in found) == (mask != "none")
    assert "FusedMatMul" in onnxruntime_ops(model)


@pytest.mark.parametrize("mask", ["none", "padding", "causal"])
@pytest.mark.parametrize("merged", [False, True])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_attention_at_opset_23_is_the_attention_op(
    rng: np.random.Generator, mask: str, merged: bool, kv_heads: int
) -> None:
    graph = _attention_graph(rng, mask, merged=merged, kv_heads=kv_heads)
    model = check(graph, _attention_feeds(graph, rng), opset=23)
    found = ops_of(model)
    assert found["Attention"] == 1
    assert "Softmax" not in found
    # onnxruntime wants the mask's rows: only a padding mask, one row for all, is expanded.
    assert ("Expand" in found) == (mask == "padding")
    if merged and kv_heads == 4:  # the op splits and merges the heads itself
        assert "Transpose" not in found
        assert found["Reshape"] == (1 if mask == "causal" else 0)  # the causal mask's positions


def test_single_head_attention_at_opset_23(rng: np.random.Generator) -> None:
    def build(b: GraphBuilder) -> None:
        q, k, v = (b.input(name, (BATCH, SEQ, 8), F32) for name in "qkv")
        bias = b.scalar(0.0, F32, (BATCH, SEQ, SEQ))
        b.output(b.apply(Attention(0.3), [q, k, v, bias]), "y")

    graph = graph_of(build)
    model = check(graph, feeds_for(graph, rng, {"batch": 2, "seq": 3}), opset=23)
    assert ops_of(model) == Counter({"Attention": 1})
