"""rules/clamp.egg: Relu, Min/Max against a constant and Clip collapse into one Clamp."""

from __future__ import annotations

import numpy as np
import pytest

from knopt.ir import Binary, DType, GraphBuilder, Unary, Value
from knopt.ir import op as ops
from tests.rules.helpers import F32, Build, const, optimize_and_compare


def _x(g: GraphBuilder) -> Value:
    return g.input("x", (4, 5), F32)


def _relu_then_clip(g: GraphBuilder) -> Value:
    return g.clamp(g.unary(Unary.RELU, _x(g)), hi=6.0)


def _max_then_min(g: GraphBuilder) -> Value:
    return g.binary(Binary.MIN, g.binary(Binary.MAX, _x(g), const(g, -0.5)), const(g, 2.0))


def _max_then_min_constants_left(g: GraphBuilder) -> Value:
    return g.binary(Binary.MIN, const(g, 2.0), g.binary(Binary.MAX, const(g, -0.5), _x(g)))


def _clamp_of_clamp(g: GraphBuilder) -> Value:
    return g.clamp(g.clamp(_x(g), lo=-1.0, hi=2.0), lo=0.0, hi=5.0)


@pytest.mark.parametrize(
    ("build", "rules"),
    [
        (_relu_then_clip, ["relu-is-clamp", "clamp-of-clamp"]),
        (_max_then_min, ["max-is-clamp", "min-is-clamp", "clamp-of-clamp"]),
        (_max_then_min_constants_left, ["max-is-clamp-left", "min-is-clamp-left"]),
        (_clamp_of_clamp, ["clamp-of-clamp"]),
    ],
    ids=["relu-clip", "max-min", "max-min-constant-left", "clamp-clamp"],
)
def test_chain_of_clamps_becomes_one_clamp(
    build: Build, rules: list[str], rng: np.random.Generator
) -> None:
    result = optimize_and_compare(build, rng)
    assert result.count("Clamp") == 1
    assert result.count("RELU") == result.count("MIN") == result.count("MAX") == 0
    for rule in rules:
        assert result.fired(rule) > 0, rule


def test_clamp_of_clamp_keeps_the_intersection(rng: np.random.Generator) -> None:
    result = optimize_and_compare(_clamp_of_clamp, rng)
    (clamp,) = [n.op for n in result.after.nodes if isinstance(n.op, ops.Clamp)]
    assert (clamp.lo, clamp.hi) == (0.0, 2.0)


def test_disjoint_clamps_stay_apart(rng: np.random.Generator) -> None:
    result = optimize_and_compare(lambda g: g.clamp(g.clamp(_x(g), lo=-2.0, hi=-1.0), lo=1.0), rng)
    assert result.count("Clamp") == 2
    assert result.fired("clamp-of-clamp") == 0


def test_unbounded_clamp_disappears(rng: np.random.Generator) -> None:
    result = optimize_and_compare(lambda g: g.unary(Unary.EXP, g.clamp(_x(g))), rng)
    assert result.count("Clamp") == 0
    assert result.fired("clamp-nothing") > 0


def test_max_of_two_inputs_is_no_clamp(rng: np.random.Generator) -> None:
    def build(g: GraphBuilder) -> Value:
        return g.binary(Binary.MAX, _x(g), g.input("y", (4, 5), F32))

    result = optimize_and_compare(build, rng)
    assert result.count("MAX") == 1
    assert result.count("Clamp") == 0
    assert result.fired("max-is-clamp") == result.fired("max-is-clamp-left") == 0


def test_min_against_a_varying_constant_is_no_clamp(rng: np.random.Generator) -> None:
    limits = rng.uniform(0.5, 2.0, (4, 5)).astype(np.float32)
    result = optimize_and_compare(lambda g: g.binary(Binary.MIN, _x(g), g.constant(limits)), rng)
    assert result.count("MIN") == 1
    assert result.fired("min-is-clamp") == 0


def test_integer_clamps_merge_when_they_share_an_integer(rng: np.random.Generator) -> None:
    def build(g: GraphBuilder) -> Value:
        return g.clamp(g.clamp(g.input("x", (4, 5), DType.I32), lo=-3.0, hi=2.0), lo=0.0)

    result = optimize_and_compare(build, rng)
    assert result.count("Clamp") == 1
    assert result.fired("clamp-of-clamp-integer") > 0


def test_integer_clamps_sharing_no_integer_stay_apart(rng: np.random.Generator) -> None:
    # [-inf, 0.5] then [0.5, 2] clamps integers to 0 then to 1; merged, [0.5, 0.5] gives 0.
    def build(g: GraphBuilder) -> Value:
        return g.clamp(g.clamp(g.input("x", (4, 5), DType.I32), hi=0.5), lo=0.5, hi=2.0)

    result = optimize_and_compare(build, rng)
    assert result.count("Clamp") == 2
    assert result.fired("clamp-of-clamp") == result.fired("clamp-of-clamp-integer") == 0
