"""rules/attention.egg: softmax(q @ k^T * scale [+ mask]) @ v becomes one Attention op."""

from __future__ import annotations

import math

import numpy as np
import pytest

from knopt.ir import GraphBuilder, Value
from knopt.ir import op as ops
from tests.rules.helpers import F32, Rewrite, check_rewrite, const, optimize_and_compare

HEADS, QUERIES, KEYS, DEPTH = 2, 4, 6, 8


def _scores(g: GraphBuilder) -> Value:
    """q @ k^T, with k transposed by a permute as exporters write it."""
    q = g.input("q", (HEADS, QUERIES, DEPTH), F32)
    k = g.input("k", (HEADS, KEYS, DEPTH), F32)
    return g.matmul(q, g.permute(k, (0, 2, 1)))


def _attend(g: GraphBuilder, scores: Value, *, masked: bool = False, axis: int = 2) -> Value:
    if masked:
        scores = g.add(scores, g.input("mask", (HEADS, QUERIES, KEYS), F32))
    v = g.input("v", (HEADS, KEYS, 5), F32)
    return g.matmul(g.softmax(scores, axis=axis), v)


def _scaled(g: GraphBuilder) -> Value:
    return g.div(_scores(g), const(g, math.sqrt(DEPTH)))


REWRITES = [
    Rewrite(
        ("attention", "div-by-constant"),
        lambda g: _attend(g, _scaled(g)),
        ("Softmax", "MatMul"),
        {"Attention": 1},
    ),
    Rewrite(
        ("attention-masked",),
        lambda g: _attend(g, _scaled(g), masked=True),
        ("Softmax", "MatMul"),
        {"Attention": 1},
    ),
    Rewrite(
        ("attention-masked", "attention-scores-scale-one"),
        lambda g: _attend(g, _scores(g), masked=True),
        ("Softmax", "MatMul"),
        {"Attention": 1},
    ),
]


@pytest.mark.parametrize("case", REWRITES, ids=[f"{c.id}-{i}" for i, c in enumerate(REWRITES)])
def test_attention_is_recognised_and_agrees(case: Rewrite, rng: np.random.Generator) -> None:
    check_rewrite(case, rng)


def test_recognised_attention_keeps_the_scale(rng: np.random.Generator) -> None:
    result = check_rewrite(REWRITES[0], rng)
    (attention,) = [n.op for n in result.after.nodes if isinstance(n.op, ops.Attention)]
    assert attention.scale == pytest.approx(1 / math.sqrt(DEPTH), rel=1e-6)


def test_unscaled_unmasked_attention_is_recognised(rng: np.random.Generator) -> None:
    result = optimize_and_compare(lambda g: _attend(g, _scores(g)), rng)
    assert result.count("Attention") == 1


def test_softmax_over_the_queries_is_no_attention(rng: np.random.Generator) -> None:
    result = optimize_and_compare(lambda g: _attend(g, _scaled(g), axis=1), rng)
    assert result.fired("attention") == 0
    assert result.count("Attention") == 0
    assert result.count("Softmax") == 1


def test_scores_scaled_per_key_become_attention_over_scaled_keys(
    rng: np.random.Generator,
) -> None:
    # A per-key scale folds into k (scale-into-matmul); what is left is plain attention.
    per_key = rng.uniform(0.5, 2.0, (1, 1, KEYS)).astype(np.float32)
    result = optimize_and_compare(lambda g: _attend(g, g.mul(_scores(g), g.constant(per_key))), rng)
    assert result.fired("scale-into-matmul") > 0
    assert result.count("Attention") == 1
