"""The executor's shortcuts (skipped broadcasts, leaves computed once) keep results exact."""

from __future__ import annotations

import warnings

import numpy as np

from knopt.cpu.executor import run_graph, run_node
from knopt.ir import Binary, DType, GraphBuilder, Unary
from knopt.ir.op import PoolKind

F32 = DType.F32


def test_elementwise_op_of_two_broadcasts_has_the_full_shape(rng: np.random.Generator) -> None:
    b = GraphBuilder()
    x = b.input("x", (1, 3), F32)
    y = b.input("y", (1, 3), F32)
    wide = (4, 3)
    total = b.binary(Binary.ADD, b.broadcast(x, wide), b.broadcast(y, wide))
    b.output(b.where(b.binary(Binary.LESS, total, total), total, b.broadcast(x, wide)), "z")
    b.output(total, "total")
    xs = rng.standard_normal((1, 3)).astype(np.float32)
    ys = rng.standard_normal((1, 3)).astype(np.float32)
    z, summed = run_graph(b.build(), {"x": xs, "y": ys})
    assert summed.shape == wide
    np.testing.assert_array_equal(summed, np.broadcast_to(xs + ys, wide))
    np.testing.assert_array_equal(z, np.broadcast_to(xs, wide))


def test_broadcast_read_by_other_ops_still_runs(rng: np.random.Generator) -> None:
    b = GraphBuilder()
    x = b.input("x", (2, 1), F32)
    wide = b.broadcast(x, (2, 5))
    b.output(b.add(wide, wide), "sum")
    b.output(b.softmax(wide, axis=1), "soft")
    xs = rng.standard_normal((2, 1)).astype(np.float32)
    total, soft = run_graph(b.build(), {"x": xs})
    np.testing.assert_array_equal(total, np.broadcast_to(2 * xs, (2, 5)))
    np.testing.assert_allclose(soft, np.full((2, 5), 0.2, np.float32), rtol=1e-6)


def test_repeated_runs_agree_and_leave_inputs_and_constants_alone(
    rng: np.random.Generator,
) -> None:
    b = GraphBuilder()
    x = b.input("x", (3, 4), F32)
    weight = rng.standard_normal((4, 4)).astype(np.float32)
    hidden = b.matmul(x, b.constant(weight))
    positions = b.cast(b.view(b.iota(4), (1, 4)), F32)
    b.output(b.add(hidden, positions), "y")
    b.output(hidden, "hidden")
    graph = b.build()
    xs = rng.standard_normal((3, 4)).astype(np.float32)
    before = xs.copy()
    first = run_graph(graph, {"x": xs})
    second = run_graph(graph, {"x": xs})
    for a, c in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, c)
    np.testing.assert_array_equal(first[1], xs @ weight)
    np.testing.assert_allclose(first[0], xs @ weight + np.arange(4, dtype=np.float32), rtol=1e-6)
    np.testing.assert_array_equal(xs, before)


def test_floating_point_warnings_are_silenced() -> None:
    b = GraphBuilder()
    x = b.input("x", (3,), F32)
    b.output(b.unary(Unary.LOG, b.binary(Binary.DIV, x, x)), "y")
    feeds = {"x": np.array([0.0, -1.0, 2.0], np.float32)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (y,) = run_graph(b.build(), feeds)
    assert np.isnan(y[0])
    assert y[2] == 0.0


def test_timings_name_every_op_that_ran(rng: np.random.Generator) -> None:
    b = GraphBuilder()
    x = b.input("x", (1, 2, 6, 6), F32)
    pooled = b.pool(
        PoolKind.MAX, x, kernel=(2, 2), strides=(2, 2), pads=((0, 0), (0, 0)), dilations=(1, 1)
    )
    b.output(b.unary(Unary.RELU, pooled), "y")
    timings: dict[str, float] = {}
    run_graph(b.build(), {"x": rng.standard_normal((1, 2, 6, 6)).astype(np.float32)}, timings)
    assert set(timings) == {"MAX_POOL", "RELU"}
    assert all(t >= 0 for t in timings.values())


def test_run_node_computes_bf16_in_f32(rng: np.random.Generator) -> None:
    bf16 = DType.BF16.numpy
    b = GraphBuilder()
    x = b.input("x", (8,), DType.BF16)
    b.output(b.unary(Unary.EXP, x), "y")
    node = b.build().nodes[-1]
    xs = rng.standard_normal(8).astype(bf16)
    result = run_node(node, [xs])
    assert result.dtype == bf16
    np.testing.assert_array_equal(result, np.exp(xs.astype(np.float32)).astype(bf16))
