"""rules/typing.egg: every tensor e-class gets the shape and dtype the IR's `Op.infer` gives."""

from __future__ import annotations

import numpy as np
import pytest

from knopt.ir import (
    Binary,
    DType,
    Graph,
    GraphBuilder,
    PoolKind,
    Reduction,
    Shape,
    Sym,
    Unary,
    Value,
    sym,
)
from knopt.ir import op as ops
from knopt.opt.egraph import Saturation, saturate
from tests.rules.helpers import F32, Build, graph_of, optimize_and_compare

_RNG = np.random.default_rng(3)


def _weights(*shape: int) -> np.ndarray:
    return _RNG.standard_normal(shape).astype(np.float32)


def _every_op(g: GraphBuilder) -> list[Value]:
    """One node of (nearly) every IR op, with results of several dtypes."""
    x = g.input("x", (2, 3, 6, 6), F32)
    m = g.input("m", (4, 6), F32)
    conv = g.conv(
        x, g.constant(_weights(5, 3, 3, 3)), strides=(2, 2), pads=((1, 1), (0, 1)), dilations=(1, 1)
    )
    pool = g.pool(
        PoolKind.MAX, x, kernel=(2, 2), strides=(2, 2), pads=((0, 0), (0, 0)), dilations=(1, 1)
    )
    rows = g.permute(g.view(g.slice(x, axis=2, start=0, stop=4), (2, 3, 24)), (0, 2, 1))
    padded = g.pad(g.flip(m, axis=1), pads=((1, 0), (0, 2)))
    joined = g.concat([m, g.cast(g.cast(m, DType.F16), F32)], axis=0)
    picked = g.gather(m, g.constant(np.array([3, 1], np.int64)), axis=0)
    indices = g.constant(np.array([[0] * 6, [2] * 6], np.int64))
    scattered = g.scatter(m, indices, g.unary(Unary.TANH, picked), axis=0)
    less = g.binary(Binary.LESS, m, g.clamp(m, lo=-0.5, hi=0.5))
    chosen = g.where(less, g.unary(Unary.EXP, m), g.cast(g.iota(6), F32))
    q = g.view(m, (1, 4, 6))
    attention = g.apply(ops.Attention(0.25), [q, q, q, g.scalar(0.5, F32, (1, 4, 4))])
    return [
        conv,
        pool,
        g.matmul(rows, g.constant(_weights(2, 3, 4))),
        padded,
        joined,
        scattered,
        g.mul(chosen, m),
        g.unary(Unary.IS_NAN, m),
        g.arg_reduce(m, axis=1),
        g.arg_sort(m, axis=0, descending=True),
        g.cumsum(m, axis=1, reverse=True),
        g.reduce(Reduction.MAX, m, axes=[0]),
        g.softmax(m, axis=1),
        g.layer_norm(m, axis=1, eps=1e-5),
        g.rms_norm(m, axis=1, eps=1e-6),
        attention,
    ]


def _symbolic(g: GraphBuilder) -> list[Value]:
    batch = sym("batch")
    x = g.input("x", (batch, 4), F32)
    total = g.reduce(Reduction.SUM, g.unary(Unary.EXP, x), axes=[1])
    scaled = g.div(x, total)
    return [g.matmul(scaled, g.constant(_weights(4, 3))), g.binary(Binary.GREATER, x, scaled)]


def _typed(graph: Graph) -> tuple[Saturation, list[tuple[Value, Shape | None, str | None]]]:
    """Each IR value with the shape (as sizes) and dtype name its e-class was given."""
    saturation = saturate(graph)
    found = []
    for node, (cls, _) in zip(graph.nodes, saturation.ir_nodes, strict=True):
        codes = saturation.data.shapes.get(cls)
        shape = None if codes is None else tuple(saturation.tables.size(c) for c in codes)
        found.append((node.output, shape, saturation.data.dtypes.get(cls)))
    return saturation, found


@pytest.mark.parametrize("build", [_every_op, _symbolic], ids=["every-op", "symbolic"])
def test_every_class_has_the_type_of_its_ir_value(build: Build) -> None:
    _, found = _typed(graph_of(build))
    for value, shape, dtype in found:
        assert (shape, dtype) == (value.shape, value.dtype.name), value.producer.describe()


def test_typing_rules_fire_for_every_op_of_the_graph() -> None:
    saturation, _ = _typed(graph_of(_every_op))
    expected = [
        "type-input",
        "type-constant",
        "type-splat",
        "type-iota",
        "type-view",
        "type-broadcast",
        "type-permute",
        "type-slice",
        "type-pad",
        "type-concat",
        "type-gather",
        "type-reduce",
        "type-arg-reduce",
        "type-conv",
        "type-pool",
        "type-flip",
        "type-scatter",
        "type-cast",
        "type-unary",
        "type-unary-test",
        "type-comparison",
        "type-binary",
        "type-clamp",
        "type-where",
        "type-arg-sort",
        "type-cumsum",
        "type-softmax",
        "type-layer-norm",
        "type-rms-norm",
        "type-matmul",
        "type-attention",
        "numel-start",
        "numel-step",
        "numel-done",
    ]
    for rule in expected:
        assert saturation.rules_fired[rule] > 0, rule


def test_tests_and_comparisons_are_boolean_not_their_input_type() -> None:
    _, found = _typed(graph_of(_every_op))
    kinds = {value.producer.op.name: dtype for value, _, dtype in found}
    assert kinds["IS_NAN"] == kinds["LESS"] == "BOOL"
    assert kinds["ArgReduce"] == kinds["ArgSort"] == "I64"


def test_symbolic_sizes_count_as_unknown_elements() -> None:
    _, found = _typed(graph_of(_symbolic))
    assert any(isinstance(shape[0], Sym) for _, shape, _ in found if shape)
    saturation = saturate(graph_of(_symbolic))
    assert saturation.rules_fired["numel-symbolic"] > 0
    statics = saturation.data.relations.get("static", set())
    inputs = [cls for cls, node in saturation.ir_nodes if node.op == "Input"]
    assert inputs and not set(inputs) & statics


@pytest.mark.parametrize("build", [_every_op, _symbolic], ids=["every-op", "symbolic"])
def test_optimized_graph_keeps_the_types_and_agrees(build: Build, rng: np.random.Generator) -> None:
    result = optimize_and_compare(build, rng, sizes={"batch": 3})
    for before, after in zip(result.before.outputs, result.after.outputs, strict=True):
        assert before.type == after.type
