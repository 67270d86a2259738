"""rules/layernorm.egg: the written-out LayerNorm and RMSNorm templates become one op."""

from __future__ import annotations

import numpy as np
import pytest

from knopt.ir import Binary, GraphBuilder, Reduction, Unary, Value
from knopt.ir import op as ops
from tests.rules.helpers import F32, Rewrite, check_rewrite, const, optimize_and_compare

SHAPE = (2, 3, 8)
EPS = 1e-5


def _x(g: GraphBuilder) -> Value:
    return g.input("x", SHAPE, F32)


def _mean(g: GraphBuilder, x: Value, axis: int, count: float | None) -> Value:
    """ReduceMean as the importer writes it: a sum divided by the element count."""
    total = g.reduce(Reduction.SUM, x, axes=[axis])
    return g.div(total, const(g, float(SHAPE[axis]) if count is None else count))


def _spread(g: GraphBuilder, d: Value, axis: int, count: float | None) -> Value:
    """sqrt(mean(d ** 2) + eps), as torch's ts14 exporter writes it."""
    variance = _mean(g, g.binary(Binary.POW, d, const(g, 2.0)), axis, count)
    return g.unary(Unary.SQRT, g.add(variance, const(g, EPS)))


def _layer_norm(g: GraphBuilder, *, axis: int = 2, count: float | None = None) -> Value:
    x = _x(g)
    d = g.sub(x, _mean(g, x, axis, count))
    return g.div(d, _spread(g, d, axis, count))


def _layer_norm_affine(g: GraphBuilder) -> Value:
    gamma = g.constant(np.linspace(0.5, 1.5, SHAPE[-1], dtype=np.float32))
    beta = g.constant(np.linspace(-1.0, 1.0, SHAPE[-1], dtype=np.float32) + 0.05)
    return g.add(g.mul(_layer_norm(g), gamma), beta)


def _layer_norm_rsqrt(g: GraphBuilder) -> Value:
    x = _x(g)
    d = g.sub(x, _mean(g, x, 2, None))
    variance = _mean(g, g.mul(d, d), 2, None)
    return g.mul(d, g.unary(Unary.RSQRT, g.add(variance, const(g, EPS))))


def _mean_square_plus_eps(g: GraphBuilder, x: Value) -> Value:
    return g.add(_mean(g, g.binary(Binary.POW, x, const(g, 2.0)), 2, None), const(g, EPS))


def _rms_norm_llama(g: GraphBuilder) -> Value:
    """LLaMA's x * (1 / sqrt(mean(x ** 2) + eps)), then its weight."""
    x = _x(g)
    inverse = g.div(const(g, 1.0), g.unary(Unary.SQRT, _mean_square_plus_eps(g, x)))
    weight = g.constant(np.linspace(0.5, 1.5, SHAPE[-1], dtype=np.float32))
    return g.mul(g.mul(x, inverse), weight)


def _rms_norm_div(g: GraphBuilder) -> Value:
    x = _x(g)
    return g.div(x, g.unary(Unary.SQRT, _mean_square_plus_eps(g, x)))


_STATISTICS = ("REDUCE_SUM", "SQRT", "RSQRT", "POW", "DIV", "SUB")

REWRITES = [
    Rewrite(
        ("layer-norm", "mean-over-last-axis", "pow-2-is-square", "div-by-constant"),
        _layer_norm,
        (*_STATISTICS, "MUL", "ADD"),
        {"LayerNorm": 1},
    ),
    Rewrite(("layer-norm",), _layer_norm_affine, _STATISTICS, {"LayerNorm": 1, "ADD": 1, "MUL": 1}),
    Rewrite(("layer-norm-rsqrt",), _layer_norm_rsqrt, _STATISTICS, {"LayerNorm": 1}),
    Rewrite(
        ("rms-norm", "one-over-is-reciprocal", "reciprocal-sqrt-is-rsqrt"),
        _rms_norm_llama,
        _STATISTICS,
        {"RmsNorm": 1, "MUL": 1},
    ),
    Rewrite(("rms-norm-div",), _rms_norm_div, _STATISTICS, {"RmsNorm": 1}),
]


@pytest.mark.parametrize("case", REWRITES, ids=[f"{c.id}-{i}" for i, c in enumerate(REWRITES)])
def test_normalization_template_becomes_one_op_and_agrees(
    case: Rewrite, rng: np.random.Generator
) -> None:
    check_rewrite(case, rng)


def test_recognised_layer_norm_keeps_axis_and_eps(rng: np.random.Generator) -> None:
    result = check_rewrite(REWRITES[0], rng)
    (norm,) = [n.op for n in result.after.nodes if isinstance(n.op, ops.LayerNorm)]
    assert norm.axis == 2
    assert norm.eps == pytest.approx(EPS, rel=1e-6)


def test_mean_not_divided_by_the_axis_size_is_no_layer_norm(rng: np.random.Generator) -> None:
    result = optimize_and_compare(lambda g: _layer_norm(g, count=SHAPE[-1] + 1.0), rng)
    assert result.fired("mean-over-last-axis") == 0
    assert result.fired("layer-norm") == 0
    assert result.count("LayerNorm") == 0


def test_normalizing_over_another_axis_is_no_layer_norm(rng: np.random.Generator) -> None:
    result = optimize_and_compare(lambda g: _layer_norm(g, axis=0), rng)
    assert result.fired("layer-norm") == result.fired("layer-norm-over-channels") == 0
    assert result.count("LayerNorm") == 0


def _channels_first_layer_norm(g: GraphBuilder) -> Value:
    """ConvNeXt's LayerNorm2d on NCHW: mean and variance over axis 1, then its affine tail."""
    x = g.input("x", (2, 4, 3, 5), F32)
    total = g.reduce(Reduction.SUM, x, axes=[1])
    d = g.sub(x, g.div(total, const(g, 4.0)))
    variance = g.div(
        g.reduce(Reduction.SUM, g.binary(Binary.POW, d, const(g, 2.0)), axes=[1]), const(g, 4.0)
    )
    y = g.div(d, g.unary(Unary.SQRT, g.add(variance, const(g, EPS))))
    gamma = g.constant(np.linspace(0.5, 1.5, 4, dtype=np.float32).reshape(4, 1, 1))
    return g.add(g.mul(gamma, y), g.constant(np.full((4, 1, 1), 0.1, np.float32)))


def test_layer_norm_over_channels_is_a_permuted_layer_norm(rng: np.random.Generator) -> None:
    result = optimize_and_compare(_channels_first_layer_norm, rng)
    assert result.fired("layer-norm-over-channels") > 0
    assert result.fired("mean-over-channels") > 0
    (norm,) = [n for n in result.after.nodes if isinstance(n.op, ops.LayerNorm)]
    assert isinstance(norm.op, ops.LayerNorm) and norm.op.axis == 3
    assert norm.inputs[0].shape == (2, 3, 5, 4)
    assert result.count("SQRT") == 0


def test_mean_over_channels_of_a_matrix_is_the_last_axis_case(rng: np.random.Generator) -> None:
    # Rank 2: axis 1 is the last axis, which `layer-norm` handles without permutes.
    def build(g: GraphBuilder) -> Value:
        x = g.input("x", (3, 8), F32)
        d = g.sub(x, g.div(g.reduce(Reduction.SUM, x, axes=[1]), const(g, 8.0)))
        variance = g.div(g.reduce(Reduction.SUM, g.mul(d, d), axes=[1]), const(g, 8.0))
        return g.div(d, g.unary(Unary.SQRT, g.add(variance, const(g, EPS))))

    result = optimize_and_compare(build, rng)
    assert result.fired("mean-over-channels") == 0
    assert result.count("LayerNorm") == 1
    assert result.count("Permute") == 0


def test_variance_of_the_input_instead_of_the_deviation_is_no_layer_norm(
    rng: np.random.Generator,
) -> None:
    def build(g: GraphBuilder) -> Value:
        x = _x(g)
        return g.div(g.sub(x, _mean(g, x, 2, None)), _spread(g, x, 2, None))

    result = optimize_and_compare(build, rng)
    assert result.fired("layer-norm") == 0
    assert result.count("LayerNorm") == 0


def test_rms_norm_of_another_tensor_is_no_rms_norm(rng: np.random.Generator) -> None:
    def build(g: GraphBuilder) -> Value:
        y = g.input("y", SHAPE, F32)
        return g.div(y, g.unary(Unary.SQRT, _mean_square_plus_eps(g, _x(g))))

    result = optimize_and_compare(build, rng)
    assert result.fired("rms-norm-div") == 0
    assert result.count("RmsNorm") == 0
