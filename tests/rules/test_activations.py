"""rules/activations.egg: GELU, SiLU, Sigmoid, HardSigmoid, HardSwish, softmax and SwiGLU."""

from __future__ import annotations

import math

import numpy as np
import pytest

from knopt.ir import Binary, GraphBuilder, Reduction, Unary, Value
from tests.rules.helpers import F32, Rewrite, check_rewrite, const, optimize_and_compare

SHAPE = (3, 8)
_RNG = np.random.default_rng(11)


def _x(g: GraphBuilder) -> Value:
    return g.input("x", SHAPE, F32)


def _erf_core(g: GraphBuilder, x: Value, divisor: float = math.sqrt(2.0)) -> Value:
    """1 + erf(x / sqrt 2), as torch exports it."""
    return g.add(g.unary(Unary.ERF, g.div(x, const(g, divisor))), const(g, 1.0))


def _gelu_erf(g: GraphBuilder, divisor: float = math.sqrt(2.0)) -> Value:
    x = _x(g)
    return g.mul(g.mul(x, _erf_core(g, x, divisor)), const(g, 0.5))


def _gelu_half_first(g: GraphBuilder) -> Value:
    x = _x(g)
    return g.mul(g.mul(x, const(g, 0.5)), _erf_core(g, x))


def _gelu_half_last(g: GraphBuilder) -> Value:
    x = _x(g)
    return g.mul(x, g.mul(_erf_core(g, x), const(g, 0.5)))


def _gelu_tanh(g: GraphBuilder, *, cube_as_pow: bool = True, k: float = 0.044715) -> Value:
    """GPT-2's 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + k * x ** 3)))."""
    x = _x(g)
    cube = g.binary(Binary.POW, x, const(g, 3.0)) if cube_as_pow else g.mul(g.mul(x, x), x)
    inner = g.add(x, g.mul(const(g, k), cube))
    t = g.unary(Unary.TANH, g.mul(const(g, math.sqrt(2.0 / math.pi)), inner))
    return g.mul(g.mul(const(g, 0.5), x), g.add(const(g, 1.0), t))


def _gelu_tanh_factored(g: GraphBuilder, k: float = 0.044715) -> Value:
    """BLOOM's x * 0.5 * (1 + tanh(0.79788456 * x * (1 + k * x * x))), as torch exports it."""
    x = _x(g)
    poly = g.add(g.mul(g.mul(x, const(g, k)), x), const(g, 1.0))
    t = g.unary(Unary.TANH, g.mul(g.mul(x, const(g, 0.79788456)), poly))
    return g.mul(g.mul(x, const(g, 0.5)), g.add(t, const(g, 1.0)))


def _gelu_tanh_cube_right(g: GraphBuilder) -> Value:
    """F.gelu(approximate="tanh") from the TorchScript exporter: the cube is x * (x * x)."""
    x = _x(g)
    inner = g.add(x, g.mul(const(g, 0.044715), g.mul(x, g.mul(x, x))))
    t = g.unary(Unary.TANH, g.mul(const(g, math.sqrt(2.0 / math.pi)), inner))
    return g.mul(const(g, 0.5), g.mul(x, g.add(const(g, 1.0), t)))


def _swish(g: GraphBuilder, beta: float, *, left: bool = False) -> Value:
    """x * sigmoid(beta * x) (QuickGELU for beta = 1.702)."""
    x = _x(g)
    gate = g.unary(Unary.SIGMOID, g.mul(const(g, beta), x))
    return g.mul(gate, x) if left else g.mul(x, gate)


def _times(g: GraphBuilder, kind: Unary, *, left: bool = False) -> Value:
    """x * f(x), or f(x) * x."""
    x = _x(g)
    fx = g.unary(kind, x)
    return g.mul(fx, x) if left else g.mul(x, fx)


def _sigmoid_written_out(g: GraphBuilder) -> Value:
    x = _x(g)
    return g.div(const(g, 1.0), g.add(g.unary(Unary.EXP, g.unary(Unary.NEG, x)), const(g, 1.0)))


def _hard_sigmoid(g: GraphBuilder, divisor: float = 6.0) -> Value:
    return g.clamp(g.add(g.div(_x(g), const(g, divisor)), const(g, 0.5)), lo=0.0, hi=1.0)


def _relu6_of_x_plus_3(g: GraphBuilder, x: Value) -> Value:
    return g.clamp(g.add(x, const(g, 3.0)), lo=0.0, hi=6.0)


def _hard_swish_relu6(g: GraphBuilder) -> Value:
    x = _x(g)
    return g.div(g.mul(x, _relu6_of_x_plus_3(g, x)), const(g, 6.0))


def _softmax(g: GraphBuilder, *, axis: int = 1, shifted: bool = True) -> Value:
    x = _x(g)
    if shifted:
        x = g.sub(x, g.reduce(Reduction.MAX, x, axes=[axis]))
    e = g.unary(Unary.EXP, x)
    return g.div(e, g.reduce(Reduction.SUM, e, axes=[axis]))


def _weight(columns: int = 5) -> np.ndarray:
    return _RNG.standard_normal((SHAPE[1], columns)).astype(np.float32)


def _swiglu(g: GraphBuilder, gate: np.ndarray, up: np.ndarray | None = None) -> Value:
    x = _x(g)
    gated = g.unary(Unary.SILU, g.matmul(x, g.constant(gate)))
    w_up = g.input("w", (SHAPE[1], gate.shape[1]), F32) if up is None else g.constant(up)
    return g.mul(gated, g.matmul(x, w_up))


_ERF_FORM = ("ERF", "MUL", "ADD", "DIV")

REWRITES = [
    Rewrite(("gelu", "gelu-erf-core"), _gelu_erf, _ERF_FORM, {"GELU": 1}),
    Rewrite(("gelu-half-first",), _gelu_half_first, _ERF_FORM, {"GELU": 1}),
    Rewrite(("gelu-half-last",), _gelu_half_last, _ERF_FORM, {"GELU": 1}),
    Rewrite(
        ("gelu-tanh-core", "cube-as-pow"),
        _gelu_tanh,
        ("TANH", "POW", "MUL", "ADD"),
        {"GELU_TANH": 1},
    ),
    Rewrite(
        ("gelu-tanh-core", "cube-as-product"),
        lambda g: _gelu_tanh(g, cube_as_pow=False),
        ("TANH", "MUL", "ADD"),
        {"GELU_TANH": 1},
    ),
    Rewrite(
        ("gelu-tanh-core", "tanh-gelu-factored", "scalar-factor-out-of-product-left"),
        _gelu_tanh_factored,
        ("TANH", "MUL", "ADD"),
        {"GELU_TANH": 1},
    ),
    Rewrite(
        ("gelu-tanh-core", "cube-as-product-right"),
        _gelu_tanh_cube_right,
        ("TANH", "MUL", "ADD"),
        {"GELU_TANH": 1},
    ),
    Rewrite(("swish-is-scaled-silu",), lambda g: _swish(g, 1.702), ("SIGMOID",), {"SILU": 1}),
    Rewrite(
        ("swish-is-scaled-silu-left",),
        lambda g: _swish(g, -0.5, left=True),
        ("SIGMOID",),
        {"SILU": 1},
    ),
    Rewrite(
        ("silu",),
        lambda g: _times(g, Unary.SIGMOID),
        ("SIGMOID", "MUL"),
        {"SILU": 1},
    ),
    Rewrite(
        ("silu-left",),
        lambda g: _times(g, Unary.SIGMOID, left=True),
        ("SIGMOID", "MUL"),
        {"SILU": 1},
    ),
    Rewrite(
        ("sigmoid", "one-over-is-reciprocal"),
        _sigmoid_written_out,
        ("EXP", "NEG", "ADD", "DIV", "RECIPROCAL"),
        {"SIGMOID": 1},
    ),
    Rewrite(("hard-sigmoid",), _hard_sigmoid, ("Clamp", "ADD", "DIV"), {"HARD_SIGMOID": 1}),
    Rewrite(
        ("hard-sigmoid-relu6",),
        lambda g: g.div(_relu6_of_x_plus_3(g, _x(g)), const(g, 6.0)),
        ("Clamp", "ADD", "DIV"),
        {"HARD_SIGMOID": 1},
    ),
    Rewrite(
        ("hard-swish",),
        lambda g: _times(g, Unary.HARD_SIGMOID),
        ("HARD_SIGMOID", "MUL"),
        {"HARD_SWISH": 1},
    ),
    Rewrite(
        ("hard-swish-relu6",),
        _hard_swish_relu6,
        ("Clamp", "ADD", "MUL", "DIV"),
        {"HARD_SWISH": 1},
    ),
    Rewrite(("softmax",), _softmax, ("EXP", "REDUCE_MAX", "REDUCE_SUM", "DIV"), {"Softmax": 1}),
    Rewrite(
        ("softmax-unshifted",),
        lambda g: _softmax(g, shifted=False),
        ("EXP", "REDUCE_SUM", "DIV"),
        {"Softmax": 1},
    ),
    Rewrite(
        ("swiglu-one-matmul",),
        lambda g: _swiglu(g, _weight(), _weight()),
        left={"MatMul": 1, "SILU": 1, "Slice": 2},
    ),
]


@pytest.mark.parametrize("case", REWRITES, ids=[f"{c.id}-{i}" for i, c in enumerate(REWRITES)])
def test_activation_is_recognised_and_agrees(case: Rewrite, rng: np.random.Generator) -> None:
    check_rewrite(case, rng)


def test_erf_of_a_wrongly_scaled_input_is_no_gelu(rng: np.random.Generator) -> None:
    result = optimize_and_compare(lambda g: _gelu_erf(g, divisor=1.5), rng)
    assert result.fired("gelu-erf-core") == 0
    assert result.count("GELU") == 0
    assert result.count("ERF") == 1


def test_tanh_form_with_a_wrong_cubic_coefficient_is_no_gelu(rng: np.random.Generator) -> None:
    result = optimize_and_compare(lambda g: _gelu_tanh(g, k=0.05), rng)
    assert result.fired("gelu-tanh-core") == 0
    assert result.count("GELU_TANH") == 0
    assert result.count("TANH") == 1


def test_factored_tanh_form_with_a_wrong_coefficient_is_no_gelu(
    rng: np.random.Generator,
) -> None:
    result = optimize_and_compare(lambda g: _gelu_tanh_factored(g, k=0.05), rng)
    assert result.fired("tanh-gelu-factored") == 0
    assert result.count("GELU_TANH") == 0


def test_sigmoid_of_zero_times_x_is_no_silu(rng: np.random.Generator) -> None:
    result = optimize_and_compare(lambda g: _swish(g, 0.0), rng)
    assert result.fired("swish-is-scaled-silu") == 0
    assert result.count("SILU") == 0


def test_product_with_the_sigmoid_of_another_tensor_is_no_silu(rng: np.random.Generator) -> None:
    def build(g: GraphBuilder) -> Value:
        return g.mul(_x(g), g.unary(Unary.SIGMOID, g.input("y", SHAPE, F32)))

    result = optimize_and_compare(build, rng)
    assert result.fired("silu") == result.fired("silu-left") == 0
    assert result.count("SILU") == 0


def test_hard_sigmoid_with_a_wrong_slope_is_not_recognised(rng: np.random.Generator) -> None:
    result = optimize_and_compare(lambda g: _hard_sigmoid(g, divisor=5.0), rng)
    assert result.fired("hard-sigmoid") == 0
    assert result.count("HARD_SIGMOID") == 0
    assert result.count("Clamp") == 1


def test_softmax_over_another_axis_than_the_last_is_not_recognised(
    rng: np.random.Generator,
) -> None:
    result = optimize_and_compare(lambda g: _softmax(g, axis=0), rng)
    assert result.fired("softmax") == 0
    assert result.count("Softmax") == 0


def test_swiglu_with_a_varying_weight_keeps_two_matmuls(rng: np.random.Generator) -> None:
    result = optimize_and_compare(lambda g: _swiglu(g, _weight()), rng)
    assert result.fired("swiglu-one-matmul") == 0
    assert result.count("MatMul") == 2


def test_swiglu_with_different_widths_is_left_to_the_merge_rules(rng: np.random.Generator) -> None:
    def build(g: GraphBuilder) -> Value:
        x = _x(g)
        gated = g.unary(Unary.SILU, g.matmul(x, g.constant(_weight(5))))
        up = g.matmul(x, g.constant(_weight(1)))
        return g.mul(gated, up)

    result = optimize_and_compare(build, rng)
    assert result.fired("swiglu-one-matmul") == 0
    # rules/merge.egg merges any two GEMMs of one input, whatever their widths.
    assert result.fired("merge-matmuls") == 1
    assert result.count("MatMul") == 1
