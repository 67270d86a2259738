"""rules/attention.egg: softmax(q @ k^T * scale [+ mask]) @ v becomes one Attention op."""

from __future__ import annotations

import math

import numpy as np
import pytest

import knopt
from knopt.cpu import run_graph
from knopt.ir import DType, GraphBuilder, Unary, Value
from knopt.ir import op as ops
from tests.oracle import assert_same
from tests.rules.helpers import (
    F32,
    Rewrite,
    check_rewrite,
    const,
    graph_of,
    optimize_and_compare,
    random_feeds,
)

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


# ---- exporters' spellings ----------------------------------------------------------------------


def _sdpa_scores(g: GraphBuilder) -> Value:
    """torch's SDPA export: (q * sqrt(scale)) @ (k^T * sqrt(scale))."""
    q = g.input("q", (HEADS, QUERIES, DEPTH), F32)
    k = g.input("k", (HEADS, KEYS, DEPTH), F32)
    root = const(g, DEPTH**-0.25)
    return g.matmul(g.mul(q, root), g.mul(g.permute(k, (0, 2, 1)), root))


def _keep_mask(g: GraphBuilder) -> Value:
    """where(keep, 0, -inf) of a bool input, as the TorchScript export turns a bool mask."""
    keep = g.input("keep", (1, QUERIES, KEYS), DType.BOOL)
    return g.where(keep, const(g, 0.0), const(g, -np.inf))


def _safe_attend(g: GraphBuilder, scores: Value, bias: Value | None = None) -> Value:
    """softmax, then where(isnan(p), 0, p) @ v: the SDPA export's safe softmax."""
    if bias is not None:
        scores = g.add(scores, bias)
    p = g.softmax(scores, axis=2)
    p = g.where(g.unary(Unary.IS_NAN, p), const(g, 0.0), p)
    return g.matmul(p, g.input("v", (HEADS, KEYS, 5), F32))


def _masked_fill(g: GraphBuilder, scores: Value, value: float) -> Value:
    """masked_fill(scores, ~keep, value): where(keep, scores, value)."""
    keep = g.input("keep", (1, QUERIES, KEYS), DType.BOOL)
    return g.where(keep, scores, const(g, value))


def _batch_split_attention(g: GraphBuilder) -> Value:
    """DeBERTa: scores on [b * h, s, t], viewed as [b, h, s, t] for the mask and back for v."""
    batch, heads = 1, HEADS
    q = g.input("q", (batch * heads, QUERIES, DEPTH), F32)
    k = g.input("k", (batch * heads, KEYS, DEPTH), F32)
    kt = g.div(g.permute(k, (0, 2, 1)), const(g, math.sqrt(DEPTH)))
    scores = g.view(g.matmul(q, kt), (batch, heads, QUERIES, KEYS))
    drop = g.input("drop", (batch, 1, QUERIES, KEYS), DType.BOOL)
    masked = g.where(drop, const(g, float(np.finfo(np.float32).min)), scores)
    p = g.view(g.softmax(masked, axis=3), (batch * heads, QUERIES, KEYS))
    return g.matmul(p, g.input("v", (batch * heads, KEYS, 5), F32))


def _alibi_attention(g: GraphBuilder) -> Value:
    """BLOOM: scores * c + alibi on [b * h, s, t], viewed as [b, h, s, t] for the mask."""
    batch, heads = 1, HEADS
    q = g.input("q", (batch * heads, QUERIES, DEPTH), F32)
    kt = g.permute(g.input("k", (batch * heads, KEYS, DEPTH), F32), (0, 2, 1))
    alibi = g.input("alibi", (batch * heads, 1, KEYS), F32)
    scores = g.add(g.mul(g.matmul(q, kt), const(g, DEPTH**-0.5)), g.mul(alibi, const(g, 1.0)))
    scores = g.view(scores, (batch, heads, QUERIES, KEYS))
    bias = g.input("mask", (batch, 1, QUERIES, KEYS), F32)
    p = g.view(g.softmax(g.add(scores, bias), axis=3), (batch * heads, QUERIES, KEYS))
    return g.matmul(p, g.input("v", (batch * heads, KEYS, 5), F32))


SPELLINGS = [
    Rewrite(
        (
            "safe-softmax-masked-rows",
            "scalar-factor-out-of-matmul-left",
            "scalar-factor-out-of-matmul-right",
            "attention-masked",
        ),
        lambda g: _safe_attend(g, _sdpa_scores(g), _keep_mask(g)),
        ("Softmax", "IS_NAN"),
        {"Attention": 1},
    ),
    Rewrite(
        ("safe-softmax-unmasked", "attention"),
        lambda g: _safe_attend(g, _sdpa_scores(g)),
        ("Softmax", "IS_NAN", "Where"),
        {"Attention": 1},
    ),
    Rewrite(
        ("masked-fill-is-additive-mask", "attention-masked"),
        lambda g: _attend(g, _masked_fill(g, _scaled(g), -np.inf)),
        ("Softmax",),
        {"Attention": 1},
    ),
    Rewrite(
        ("masked-fill-is-additive-mask", "attention-biases-combine", "raw-scores"),
        lambda g: _attend(g, _masked_fill(g, _scores(g), -3.4e38), masked=True),
        ("Softmax",),
        {"Attention": 1},
    ),
    Rewrite(
        (
            "masked-fill-is-additive-mask-inverted",
            "view-of-batched-matmul",
            "batched-matmul-of-view",
        ),
        _batch_split_attention,
        ("Softmax",),
        {"Attention": 1},
    ),
    Rewrite(
        ("view-of-scores-sum", "view-of-scaled-scores", "attention-biases-combine"),
        _alibi_attention,
        ("Softmax",),
        {"Attention": 1},
    ),
]


@pytest.mark.parametrize("case", SPELLINGS, ids=[f"{c.id}-{i}" for i, c in enumerate(SPELLINGS)])
def test_exported_attention_is_recognised_and_agrees(
    case: Rewrite, rng: np.random.Generator
) -> None:
    check_rewrite(case, rng)


def test_a_query_with_every_key_masked_attends_to_nothing(rng: np.random.Generator) -> None:
    before = graph_of(lambda g: _safe_attend(g, _sdpa_scores(g), _keep_mask(g)))
    after = knopt.optimize(before).graph
    assert after.op_histogram().get("Attention", 0) == 1
    feeds = random_feeds(before, rng)
    feeds["keep"][0, 1, :] = False
    expected = run_graph(before, feeds)
    assert np.all(expected[0][:, 1, :] == 0)
    assert_same(run_graph(after, feeds), expected)


def test_a_scale_of_a_constant_operand_stays_with_it(rng: np.random.Generator) -> None:
    def build(g: GraphBuilder) -> Value:
        x = g.input("x", (3, DEPTH), F32)
        w = g.constant(rng.standard_normal((DEPTH, 5)).astype(np.float32))
        return g.matmul(g.mul(x, const(g, 0.5)), w)

    result = optimize_and_compare(build, rng)
    assert result.fired("scalar-factor-out-of-matmul-left") == 0


def test_nan_zeroing_of_another_softmax_stays(rng: np.random.Generator) -> None:
    def build(g: GraphBuilder) -> Value:
        p = g.softmax(g.input("x", (HEADS, QUERIES, KEYS), F32), axis=2)
        p = g.where(g.unary(Unary.IS_NAN, p), const(g, 0.0), p)
        return g.matmul(p, g.input("v", (HEADS, KEYS, 5), F32))

    result = optimize_and_compare(build, rng)
    assert result.fired("safe-softmax-unmasked") == result.fired("safe-softmax-masked-rows") == 0
    assert result.count("IS_NAN") == 1


def test_a_fill_value_that_is_not_a_mask_stays_a_where(rng: np.random.Generator) -> None:
    result = optimize_and_compare(lambda g: _attend(g, _masked_fill(g, _scaled(g), -5.0)), rng)
    assert result.fired("masked-fill-is-additive-mask") == 0
    assert result.count("Attention") == 0


def test_two_biases_of_another_tensor_than_scores_stay_apart(rng: np.random.Generator) -> None:
    def build(g: GraphBuilder) -> Value:
        x = g.input("x", (HEADS, QUERIES, KEYS), F32)
        b1 = g.input("b1", (HEADS, QUERIES, KEYS), F32)
        return g.softmax(g.add(g.add(x, b1), g.input("b2", (HEADS, QUERIES, KEYS), F32)), axis=2)

    result = optimize_and_compare(build, rng)
    assert result.fired("attention-biases-combine") == 0


def test_a_view_that_changes_the_matrix_axes_stays_after_the_matmul(
    rng: np.random.Generator,
) -> None:
    def build(g: GraphBuilder) -> Value:
        scores = g.matmul(
            g.input("q", (HEADS, QUERIES, DEPTH), F32), g.input("k", (HEADS, DEPTH, KEYS), F32)
        )
        return g.view(scores, (HEADS, QUERIES * KEYS))

    result = optimize_and_compare(build, rng)
    assert result.fired("view-of-batched-matmul") == 0


def test_a_view_of_a_sum_that_no_softmax_reads_stays_whole(rng: np.random.Generator) -> None:
    def build(g: GraphBuilder) -> Value:
        x = g.input("x", (HEADS, QUERIES, KEYS), F32)
        total = g.add(g.mul(x, const(g, 0.5)), g.input("y", (HEADS, QUERIES, KEYS), F32))
        return g.view(total, (1, HEADS, QUERIES, KEYS))

    result = optimize_and_compare(build, rng)
    assert result.fired("view-of-scores-sum") == result.fired("view-of-scaled-scores") == 0
