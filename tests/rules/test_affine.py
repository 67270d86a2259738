"""rules/affine.egg: per-channel scale and bias chains, and scales folded into Conv and MatMul."""

from __future__ import annotations

import numpy as np
import pytest

from knopt.ir import DType, GraphBuilder, Node, Shape, Unary, Value
from knopt.opt.egraph import Limits
from tests.rules.helpers import F32, Rewrite, check_rewrite, const, optimize_and_compare

CHANNELS = 4
_RNG = np.random.default_rng(7)


def _per_channel(low: float = 0.5, high: float = 2.0) -> np.ndarray:
    """Non-zero per-channel values, shaped to broadcast over NCHW."""
    return _RNG.uniform(low, high, (1, CHANNELS, 1, 1)).astype(np.float32)


def _conv(g: GraphBuilder) -> Value:
    x = g.input("x", (2, 3, 6, 6), F32)
    w = g.constant(_RNG.standard_normal((CHANNELS, 3, 3, 3)).astype(np.float32))
    return g.conv(x, w, strides=(1, 1), pads=((1, 1), (1, 1)), dilations=(1, 1))


def _batch_norm(g: GraphBuilder, y: Value) -> Value:
    """BatchNormalization as exporters write it without folding: (y - m) / sqrt(v + eps) * s + b."""
    mean, var = g.constant(_per_channel(-1.0, 1.0)), g.constant(_per_channel())
    scale, bias = g.constant(_per_channel()), g.constant(_per_channel(-1.0, 1.0))
    std = g.unary(Unary.SQRT, g.add(var, const(g, 1e-5)))
    return g.add(g.mul(g.div(g.sub(y, mean), std), scale), bias)


def _conv_bias_batch_norm(g: GraphBuilder) -> Value:
    return _batch_norm(g, g.add(_conv(g), g.constant(_per_channel(-1.0, 1.0))))


def _matmul(g: GraphBuilder) -> Value:
    x = g.input("x", (5, 6), F32)
    return g.matmul(x, g.constant(_RNG.standard_normal((6, 3)).astype(np.float32)))


def _small(g: GraphBuilder) -> Value:
    return g.input("x", (1, 6), F32)


def _wide(g: GraphBuilder) -> Value:
    return g.input("y", (4, 6), F32)


def _broadcast_constant(g: GraphBuilder) -> Value:
    return g.broadcast(g.constant(_RNG.uniform(0.5, 2.0, (1, 6)).astype(np.float32)), (4, 6))


def _shapes_of(nodes: list[Node], op: str) -> list[Shape]:
    return [n.output.shape for n in nodes if n.op.name == op]


REWRITES = [
    Rewrite(
        ("scale-into-conv", "scale-through-bias", "bias-of-bias", "sub-constant-is-add"),
        _conv_bias_batch_norm,
        ("MUL", "SUB", "DIV", "SQRT"),
        {"Conv": 1, "ADD": 1},
    ),
    Rewrite(
        ("scale-into-conv",),
        lambda g: g.mul(_conv(g), g.constant(_per_channel())),
        ("MUL",),
        {"Conv": 1},
    ),
    Rewrite(
        ("splat-scale-into-conv",), lambda g: g.mul(_conv(g), const(g, 0.5)), ("MUL",), {"Conv": 1}
    ),
    Rewrite(
        ("scale-into-matmul",),
        lambda g: g.mul(_matmul(g), g.constant(_RNG.uniform(0.5, 2.0, (1, 3)).astype(np.float32))),
        ("MUL",),
        {"MatMul": 1},
    ),
    Rewrite(
        ("splat-scale-into-matmul",),
        lambda g: g.mul(_matmul(g), const(g, 3.0)),
        ("MUL",),
        {"MatMul": 1},
    ),
    Rewrite(
        ("scale-of-scale",),
        lambda g: g.mul(g.mul(_wide(g), const(g, 3.0)), const(g, 0.5)),
        left={"MUL": 1},
    ),
    Rewrite(
        ("bias-of-bias",),
        lambda g: g.add(g.add(_wide(g), const(g, 3.0)), const(g, 0.5)),
        left={"ADD": 1},
    ),
    Rewrite(
        ("scale-through-bias",),
        lambda g: g.mul(g.add(_wide(g), const(g, 3.0)), const(g, 0.5)),
        left={"ADD": 1, "MUL": 1},
    ),
    Rewrite(("sub-constant-is-add",), lambda g: g.sub(_wide(g), const(g, 3.0))),
    Rewrite(("constant-factor-right",), lambda g: g.mul(const(g, 3.0), _wide(g))),
    Rewrite(("constant-term-right",), lambda g: g.add(const(g, 3.0), _wide(g))),
    Rewrite(
        ("broadcast-meets-splat",),
        lambda g: g.add(_wide(g), g.mul(_broadcast_constant(g), const(g, 2.0))),
        ("MUL",),
    ),
    Rewrite(
        ("splat-meets-broadcast",),
        lambda g: g.add(_wide(g), g.mul(const(g, 2.0), _broadcast_constant(g))),
        ("MUL",),
    ),
]


@pytest.mark.parametrize("case", REWRITES, ids=[c.id for c in REWRITES])
def test_affine_chain_is_simplified_and_agrees(case: Rewrite, rng: np.random.Generator) -> None:
    check_rewrite(case, rng)


def test_batch_norm_folds_into_the_conv_weights(rng: np.random.Generator) -> None:
    result = check_rewrite(REWRITES[0], rng)
    (conv,) = [n for n in result.after.nodes if n.op.name == "Conv"]
    assert conv.inputs[1].producer.op.name == "Constant"


def _project(g: GraphBuilder, x: Value) -> Value:
    """x @ w: a matmul reads its operands whole, so what makes them is a kernel of its own."""
    w = g.constant(_RNG.standard_normal((6, 3)).astype(x.dtype.numpy))
    return g.matmul(x, w)


def test_unary_runs_before_the_broadcast(rng: np.random.Generator) -> None:
    result = optimize_and_compare(
        lambda g: _project(g, g.unary(Unary.EXP, g.broadcast(_small(g), (4, 6)))), rng
    )
    assert result.fired("unary-of-broadcast") > 0
    assert _shapes_of(result.after.nodes, "EXP") == [(1, 6)]


def test_cast_runs_before_the_broadcast(rng: np.random.Generator) -> None:
    result = optimize_and_compare(
        lambda g: _project(g, g.cast(g.broadcast(_small(g), (4, 6)), DType.F64)), rng
    )
    assert result.fired("cast-of-broadcast") > 0
    assert _shapes_of(result.after.nodes, "Cast") == [(1, 6)]


def test_two_broadcasts_combine_into_one(rng: np.random.Generator) -> None:
    def build(g: GraphBuilder) -> Value:
        wide = g.add(g.broadcast(_small(g), (4, 6)), g.broadcast(g.input("z", (1, 6), F32), (4, 6)))
        return _project(g, wide)

    result = optimize_and_compare(build, rng)
    assert result.fired("broadcasts-combine") > 0
    assert _shapes_of(result.after.nodes, "ADD") == [(1, 6)]


def test_scale_varying_over_spatial_axes_stays_after_the_conv(rng: np.random.Generator) -> None:
    spatial = rng.uniform(0.5, 2.0, (1, 1, 6, 6)).astype(np.float32)
    result = optimize_and_compare(lambda g: g.mul(_conv(g), g.constant(spatial)), rng)
    assert result.fired("scale-into-conv") == 0
    assert result.count("MUL") == 1


def test_scale_varying_over_rows_stays_after_the_matmul(rng: np.random.Generator) -> None:
    rows = rng.uniform(0.5, 2.0, (5, 1)).astype(np.float32)
    result = optimize_and_compare(lambda g: g.mul(_matmul(g), g.constant(rows)), rng)
    assert result.fired("scale-into-matmul") == 0
    assert result.count("MUL") == 1


def test_varying_scale_stays_after_the_conv(rng: np.random.Generator) -> None:
    result = optimize_and_compare(lambda g: g.mul(_conv(g), g.input("s", (2, 4, 6, 6), F32)), rng)
    assert result.fired("scale-into-conv") == 0
    assert result.count("MUL") == 1


def test_products_of_constants_are_not_reassociated(rng: np.random.Generator) -> None:
    def build(g: GraphBuilder) -> Value:
        c = g.constant(rng.uniform(0.5, 2.0, (4, 6)).astype(np.float32))
        return g.add(_wide(g), g.mul(g.mul(c, const(g, 3.0)), const(g, 0.5)))

    result = optimize_and_compare(build, rng)
    assert result.fired("scale-of-scale") == 0
    assert result.count("MUL") == 0  # folded instead


def test_scalar_factors_leave_products_of_varying_tensors(rng: np.random.Generator) -> None:
    def build(g: GraphBuilder) -> Value:
        x, y = _wide(g), g.input("z", (4, 6), F32)
        return g.mul(y, g.mul(g.mul(x, const(g, 3.0)), y))

    result = optimize_and_compare(build, rng)
    assert result.fired("scalar-factor-out-of-product-left") > 0
    assert result.fired("scalar-factor-out-of-product-right") > 0


def test_scalar_factor_stays_in_a_product_with_a_constant(rng: np.random.Generator) -> None:
    def build(g: GraphBuilder) -> Value:
        c = g.constant(rng.uniform(0.5, 2.0, (4, 6)).astype(np.float32))
        return g.mul(g.mul(_wide(g), const(g, 3.0)), c)

    result = optimize_and_compare(build, rng)
    assert result.fired("scalar-factor-out-of-product-left") == 0


def test_integer_product_with_zero_grows_no_powers(rng: np.random.Generator) -> None:
    def build(g: GraphBuilder) -> Value:
        x, y = g.input("x", (4, 6), DType.I64), g.input("y", (4, 6), DType.I64)
        return g.mul(y, g.mul(x, const(g, 0, DType.I64)))

    # x * 0 is 0, so y * (x * 0) once became (y * x) * 0, ((y * x) * x) * 0, ...
    result = optimize_and_compare(build, rng, limits=Limits(nodes=2000))
    assert result.report.stopped_by is None
