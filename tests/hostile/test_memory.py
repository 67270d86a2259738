"""Sizes that a model or its inputs ask for are refused before anything that large is made."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import knopt
from knopt.errors import MemoryLimitError
from knopt.ir import DType, GraphBuilder, sym
from tests.hostile.builders import I64, info, ints, model


@pytest.fixture
def small_limit() -> Iterator[None]:
    knopt.set_memory_limit("1M")
    yield
    knopt.set_memory_limit(None)


def _one(name: str, op: str, inputs: list[str], **attrs: Any) -> onnx.NodeProto:
    return helper.make_node(op, inputs, ["y"], name=name, **attrs)


ONE = numpy_helper.from_array(np.array([1], np.int64))
# Integer values computed while loading, which the importer evaluates (74 GiB to 64 TiB).
HUGE_AT_IMPORT = {
    "constant_of_shape": (
        [_one("fill", "ConstantOfShape", ["s"], value=ONE)],
        [ints("s", [2**20, 2**20, 8])],
    ),
    "expand": (
        [_one("grow", "Expand", ["one", "s"])],
        [ints("one", [3]), ints("s", [2**18, 2**18])],
    ),
    "range": (
        [_one("count", "Range", ["a", "b", "c"])],
        [ints("a", 0), ints("b", 2**40), ints("c", 1)],
    ),
    "tile": (
        [_one("copies", "Tile", ["one", "r"])],
        [ints("one", [[3]]), ints("r", [2**19, 2**19])],
    ),
}


@pytest.mark.parametrize("case", sorted(HUGE_AT_IMPORT))
def test_integer_tensors_computed_while_loading_are_refused_by_name(case: str) -> None:
    nodes, initializers = HUGE_AT_IMPORT[case]
    proto = model(nodes, [], [info("y", None, I64)], initializers)
    with pytest.raises(MemoryLimitError, match=f"node '{nodes[0].name}'.*KNOPT_MEMORY_LIMIT"):
        knopt.load(proto.SerializeToString())


def test_sizes_computed_from_symbolic_shapes_are_refused_by_name() -> None:
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Expand", ["s", "big"], ["e"], name="grow"),
        helper.make_node("Reshape", ["x", "s"], ["y"], name="same"),
    ]
    proto = model(
        nodes,
        [info("x", ["n"])],
        [info("y", None), info("e", None, I64)],
        [ints("big", [2**40, 1])],
    )
    with pytest.raises(MemoryLimitError, match="node 'grow'"):
        knopt.load(proto.SerializeToString())


def test_sizes_bound_at_run_time_are_refused_before_running(small_limit: None) -> None:
    b = GraphBuilder("outer")
    n = sym("n")
    x = b.input("x", (n, 1), DType.F32)
    b.current_name = "outer_product"
    b.output(b.mul(x, b.view(x, (1, n))), "y")
    session = knopt.compile(b.build())
    (small,) = session.run(None, {"x": np.ones((100, 1), np.float32)})
    assert small.shape == (100, 100)
    with pytest.raises(MemoryLimitError, match=r"node 'outer_product'.*\[1000, 1000\]"):
        session.run(None, {"x": np.ones((1000, 1), np.float32)})


def test_optimizing_refuses_a_folded_result_over_the_limit() -> None:
    b = GraphBuilder("fold")
    x = b.input("x", (1,), DType.F32)
    b.current_name = "spread"
    wide = b.broadcast(b.constant(np.ones((1, 1), np.float32)), (512, 1024))
    b.output(b.add(b.mul(wide, b.scalar(2.0, DType.F32, (512, 1024))), b.view(x, (1, 1))), "y")
    graph = b.build()
    knopt.set_memory_limit("1M")
    try:
        with pytest.raises(MemoryLimitError, match=r"\[512, 1024\]"):
            knopt.optimize(graph, ilp=False)
    finally:
        knopt.set_memory_limit(None)
