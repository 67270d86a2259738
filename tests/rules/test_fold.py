"""rules/fold.egg: what folds to a constant while compiling, and arithmetic on splats."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from knopt.ir import DType, GraphBuilder, PoolKind, Reduction, Unary, Value, sym
from knopt.ir import op as ops
from tests.rules.helpers import F32, Rewrite, check_rewrite, const, optimize_and_compare

I64 = DType.I64
SHAPE = (4, 6)
_RNG = np.random.default_rng(5)


def _constant(g: GraphBuilder, shape: tuple[int, ...] = SHAPE, dtype: DType = F32) -> Value:
    """A constant whose elements differ (so it is no splat)."""
    return g.constant(_RNG.uniform(0.5, 2.0, shape).astype(dtype.numpy))


def _plus_x(g: GraphBuilder, folded: Value) -> Value:
    """x + folded: only the addition is left to compute once `folded` folds."""
    return g.add(g.input("x", folded.shape, folded.dtype), folded)


def _pad(g: GraphBuilder) -> Value:
    return g.apply(ops.Pad(((0, 0), (1, 1))), [_constant(g, (4, 4))])


def _gather(g: GraphBuilder) -> Value:
    indices = g.constant(np.array([3, 0, 7, 3], np.int64))
    return g.gather(_constant(g, (9, 6)), indices, axis=0)


def _where(g: GraphBuilder) -> Value:
    condition = g.constant(_RNG.random(SHAPE) < 0.5)
    return g.where(condition, _constant(g), _constant(g))


REWRITES = [
    Rewrite(
        ("fold-unary", "fold-binary", "fold-constant"),
        lambda g: _plus_x(g, g.mul(g.unary(Unary.EXP, _constant(g)), _constant(g))),
        ("EXP", "MUL"),
        {"ADD": 1},
    ),
    Rewrite(
        ("fold-matmul",),
        lambda g: _plus_x(g, g.matmul(_constant(g, (4, 3)), _constant(g, (3, 6)))),
        ("MatMul",),
    ),
    Rewrite(
        ("fold-reduce",),
        lambda g: _plus_x(g, g.reduce(Reduction.SUM, _constant(g, (4, 6, 2)), axes=[2])),
        ("REDUCE_SUM",),
    ),
    Rewrite(
        ("fold-permute", "fold-unary"),
        lambda g: _plus_x(g, g.unary(Unary.EXP, g.permute(_constant(g, (6, 4)), (1, 0)))),
        ("EXP",),
    ),
    Rewrite(
        ("fold-view", "fold-slice", "fold-flip"),
        lambda g: _plus_x(
            g,
            g.unary(
                Unary.EXP,
                g.flip(
                    g.view(g.slice(_constant(g, (4, 8)), axis=1, start=1, stop=7), (6, 4)), axis=0
                ),
            ),
        ),
        ("EXP",),
    ),
    Rewrite(("fold-pad",), lambda g: _plus_x(g, g.unary(Unary.LOG, _pad(g))), ("Pad", "LOG")),
    Rewrite(
        ("fold-concat",),
        lambda g: _plus_x(g, g.concat([_constant(g, (1, 6)), _constant(g, (3, 6))], axis=0)),
        ("Concat",),
    ),
    Rewrite(("fold-gather",), lambda g: _plus_x(g, _gather(g)), ("Gather",)),
    Rewrite(
        ("fold-cast",),
        lambda g: _plus_x(g, g.cast(_constant(g, dtype=DType.F64), F32)),
        ("Cast",),
    ),
    Rewrite(("fold-where",), lambda g: _plus_x(g, _where(g)), ("Where",)),
    Rewrite(
        ("fold-clamp",), lambda g: _plus_x(g, g.clamp(_constant(g), lo=0.8, hi=1.5)), ("Clamp",)
    ),
    Rewrite(
        ("fold-broadcast", "fold-unary"),
        lambda g: _plus_x(g, g.unary(Unary.SIN, g.broadcast(_constant(g, (1, 6)), SHAPE))),
        ("SIN",),
    ),
    Rewrite(
        ("fold-iota",),
        lambda g: _plus_x(g, g.cast(g.iota(6), F32)),
        ("Iota", "Cast"),
    ),
    Rewrite(
        ("splat-neg", "splat-abs", "splat-sqrt", "splat-reciprocal"),
        lambda g: g.mul(
            g.input("x", SHAPE, F32),
            g.unary(
                Unary.RECIPROCAL,
                g.unary(Unary.SQRT, g.unary(Unary.ABS, g.unary(Unary.NEG, const(g, 4.0)))),
            ),
        ),
        ("NEG", "ABS", "SQRT", "RECIPROCAL"),
        {"MUL": 1},
    ),
    Rewrite(
        ("splat-add", "splat-sub", "splat-mul", "splat-div"),
        lambda g: g.mul(
            g.input("x", SHAPE, F32),
            g.div(
                g.mul(g.sub(g.add(const(g, 1.5), const(g, 2.0)), const(g, 0.5)), const(g, 3.0)),
                const(g, 4.0),
            ),
        ),
        ("ADD", "SUB", "DIV"),
        {"MUL": 1},
    ),
    Rewrite(
        ("splat-view", "splat-broadcast"),
        lambda g: g.mul(g.input("x", SHAPE, F32), const(g, 3.0)),
        left={"MUL": 1},
    ),
    Rewrite(
        ("splat-permute", "splat-slice"),
        lambda g: g.add(
            g.input("x", (2, 3), F32),
            g.slice(g.permute(g.scalar(2.0, F32, (3, 4)), (1, 0)), axis=0, start=1, stop=3),
        ),
        ("Permute", "Slice"),
    ),
]


@pytest.mark.parametrize("case", REWRITES, ids=[f"{c.id}-{i}" for i, c in enumerate(REWRITES)])
def test_constant_computation_folds_and_agrees(case: Rewrite, rng: np.random.Generator) -> None:
    check_rewrite(case, rng)


def test_folded_value_is_one_constant_of_the_result(rng: np.random.Generator) -> None:
    result = check_rewrite(REWRITES[0], rng)
    (add,) = [n for n in result.after.nodes if n.op.name == "ADD"]
    folded = [v for v in add.inputs if v.producer.op.name != "Input"]
    assert [v.producer.op.name for v in folded] == ["Constant"]


def test_sizes_that_are_all_known_fold(rng: np.random.Generator) -> None:
    def build(g: GraphBuilder) -> Value:
        return _plus_x(g, g.mul(g.apply(ops.Sizes((4, 6, 5))), const(g, 2, I64)))

    result = optimize_and_compare(build, rng)
    assert result.fired("fold-sizes") > 0
    assert result.count("Sizes") == result.count("MUL") == 0


@pytest.mark.parametrize(
    "build",
    [
        lambda g: g.concat(
            [_constant(g, (1, 6)), _constant(g, (1, 6)), _constant(g, (2, 6))], axis=0
        ),
        lambda g: g.cumsum(_constant(g), axis=1),
        lambda g: g.softmax(_constant(g), axis=1),
    ],
    ids=["concat-of-three", "cumsum", "softmax"],
)
def test_op_of_constants_folds(
    build: Callable[[GraphBuilder], Value], rng: np.random.Generator
) -> None:
    result = optimize_and_compare(lambda g: _plus_x(g, build(g)), rng)
    assert set(result.after.op_histogram()) == {"Input", "Constant", "ADD"}


def test_constant_product_larger_than_its_factors_is_not_folded(rng: np.random.Generator) -> None:
    def build(g: GraphBuilder) -> Value:
        column, row = _constant(g, (1024, 1)), _constant(g, (1, 1025))
        return _plus_x(g, g.matmul(column, row))  # 2^20 + 1024 elements from 2049

    result = optimize_and_compare(build, rng)
    assert result.count("MatMul") == 1
    sizes = [n.op.data.array.size for n in result.after.nodes if isinstance(n.op, ops.Constant)]
    assert max(sizes) == 1025


@pytest.mark.parametrize(
    "build",
    [
        lambda g: g.mul(
            g.broadcast(_constant(g, (1, 1, 6)), (4, 5, 6)),
            g.broadcast(_constant(g, (1, 5, 1)), (4, 5, 6)),
        ),
        lambda g: g.add(
            g.broadcast(_constant(g, (1, 5, 6)), (4, 5, 6)),
            g.broadcast(g.unary(Unary.EXP, _constant(g, (1, 1, 1))), (4, 5, 6)),
        ),
        lambda g: g.gather(
            _constant(g, (9, 6)),
            g.broadcast(g.constant(np.array([[3, 0, 7, 3, 8]], np.int64)), (4, 5)),
            axis=0,
        ),
    ],
    ids=["row-times-column", "plus-a-scalar", "gather-of-broadcast-indices"],
)
def test_arithmetic_on_broadcast_constants_folds_at_their_size(
    build: Callable[[GraphBuilder], Value], rng: np.random.Generator
) -> None:
    # What the broadcasts repeat folds (5 x 6 values), and the sum reads it broadcast over the
    # batch: nothing of the batch's size is kept.
    result = optimize_and_compare(lambda g: _plus_x(g, build(g)), rng)
    sizes = [n.op.data.array.size for n in result.after.nodes if isinstance(n.op, ops.Constant)]
    assert max(sizes) == 30
    assert result.count("Broadcast") >= 1 and result.count("ADD") == 1


def test_iota_of_a_symbolic_length_is_not_folded(rng: np.random.Generator) -> None:
    def build(g: GraphBuilder) -> Value:
        n = sym("n")
        return g.add(g.input("x", (n,), F32), g.cast(g.iota(n), F32))

    result = optimize_and_compare(build, rng, sizes={"n": 5})
    assert result.fired("fold-iota") == 0
    assert result.count("Iota") == 1


def test_division_of_splats_by_zero_is_left_to_the_executor(rng: np.random.Generator) -> None:
    result = optimize_and_compare(
        lambda g: g.add(g.input("x", SHAPE, F32), g.div(const(g, 1.0), const(g, 0.0))), rng
    )
    assert result.fired("splat-div") == 0
    assert result.fired("splat-reciprocal") == 0


def test_integer_splats_are_not_divided_in_floating_point(rng: np.random.Generator) -> None:
    def build(g: GraphBuilder) -> Value:
        return g.add(g.input("x", SHAPE, I64), g.div(const(g, 7, I64), const(g, 2, I64)))

    result = optimize_and_compare(build, rng)
    assert result.fired("splat-div") == 0
    assert result.count("DIV") == 0  # folded by the executor, which truncates


def test_square_root_of_a_negative_splat_is_not_taken(rng: np.random.Generator) -> None:
    def build(g: GraphBuilder) -> Value:
        return g.add(g.input("x", SHAPE, F32), g.unary(Unary.SQRT, const(g, -4.0)))

    with np.errstate(invalid="ignore"):
        result = optimize_and_compare(build, rng)
    assert result.fired("splat-sqrt") == 0


_N = sym("n")


@pytest.mark.parametrize(
    "build",
    [
        lambda g, c: g.softmax(c, axis=1),
        lambda g, c: g.layer_norm(c, axis=1, eps=1e-5),
        lambda g, c: g.rms_norm(c, axis=1, eps=1e-5),
        lambda g, c: g.cumsum(c, axis=0),
        lambda g, c: g.cast(g.arg_reduce(c, axis=1, largest=True), F32),
        lambda g, c: g.cast(g.arg_sort(c, axis=1), F32),
        lambda g, c: g.view(
            g.pool(
                PoolKind.MAX,
                g.view(c, (_N, 1, 4)),
                kernel=(1,),
                strides=(1,),
                pads=((0, 0),),
                dilations=(1,),
            ),
            (_N, 4),
        ),
    ],
    ids=["softmax", "layer-norm", "rms-norm", "cumsum", "arg-reduce", "arg-sort", "pool"],
)
def test_op_of_a_symbolic_size_splat_is_not_folded(
    build: Callable[[GraphBuilder, Value], Value], rng: np.random.Generator
) -> None:
    # These fold rules once lacked the (static e) guard: folding a splat of shape [n, 4] sent a
    # symbolic shape to numpy, and optimize() raised a TypeError.
    def graph(g: GraphBuilder) -> Value:
        splat = g.scalar(2.0, F32, (_N, 4))
        return g.add(g.input("x", (_N, 4), F32), build(g, splat))

    result = optimize_and_compare(graph, rng, sizes={"n": 3})
    assert result.count("Input") == 1
