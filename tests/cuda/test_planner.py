"""The planner: arena placement, lifetimes, lower bounds, and plans for every fixture model."""

from __future__ import annotations

import numpy as np
import pytest

import knopt
from knopt.cuda.context import Buffer
from knopt.cuda.lower import OP_LOWERINGS
from knopt.cuda.planner import align, assign_offsets, build_plan, check_plan, lower_bound
from knopt.cuda.steps import Conv, Gemm, Launch
from knopt.ir import bind_symbols, infer_sizes
from knopt.ir import op as ops
from knopt.ir.program import program_from_graph
from tests.models import Fixture, fixtures


def _buffers(specs: list[tuple[int, int, int]]) -> list[Buffer]:
    return [
        Buffer(i, size, "arena", first=first, last=last)
        for i, (size, first, last) in enumerate(specs)
    ]


def _overlapping_live(buffers: list[Buffer]) -> bool:
    for a in buffers:
        for b in buffers:
            if (
                a.id < b.id
                and a.first <= b.last
                and b.first <= a.last
                and a.offset < b.offset + align(b.nbytes)
                and b.offset < a.offset + align(a.nbytes)
            ):
                return True
    return False


def test_buffers_with_disjoint_lifetimes_share_memory() -> None:
    buffers = _buffers([(1000, 0, 1), (1000, 2, 3), (1000, 4, 5)])
    assert assign_offsets(buffers) == align(1000)
    assert {b.offset for b in buffers} == {0}


def test_reuse_is_by_offset_not_by_equal_sizes() -> None:
    # A big buffer dies; two smaller ones of other sizes live in its space afterwards.
    buffers = _buffers([(4096, 0, 1), (1024, 2, 3), (2048, 2, 3), (256, 0, 3)])
    size = assign_offsets(buffers)
    assert size == 4096 + 256
    assert not _overlapping_live(buffers)


@pytest.mark.parametrize("seed", range(20))
def test_random_lifetimes_never_overlap_and_stay_near_the_bound(seed: int) -> None:
    rng = np.random.default_rng(seed)
    specs = []
    for _ in range(60):
        first = int(rng.integers(0, 50))
        specs.append((int(rng.integers(1, 100_000)), first, first + int(rng.integers(0, 8))))
    buffers = _buffers(specs)
    size = assign_offsets(buffers)
    assert not _overlapping_live(buffers)
    assert lower_bound(buffers) <= size <= 1.5 * lower_bound(buffers)


def test_every_op_class_has_a_gpu_lowering() -> None:
    handled_by_planner = {ops.Input, ops.Constant}
    assert set(OP_LOWERINGS) | handled_by_planner == set(ops.OP_CLASSES)


def _program(fixture: Fixture):
    graph = knopt.load(fixture.path)
    if graph.symbols():
        feeds = fixture.feeds()
        graph = bind_symbols(graph, infer_sizes(graph, {k: v.shape for k, v in feeds.items()}))
    return program_from_graph(graph)


@pytest.mark.parametrize("fixture", fixtures(), ids=lambda f: f.file)
def test_every_fixture_plans_within_ten_percent_of_the_bound(fixture: Fixture) -> None:
    plan = build_plan(_program(fixture))
    check_plan(plan)
    assert plan.region_bytes["arena"] <= 1.1 * plan.arena_lower_bound + 4096
    assert plan.steps
    assert all(isinstance(s, Launch | Gemm | Conv) for s in plan.steps)


def test_views_launch_nothing() -> None:
    g = knopt.ir.GraphBuilder("v")
    x = g.input("x", (4, 6), knopt.ir.DType.F32)
    y = g.permute(x, (1, 0))
    sliced = g.slice(x, axis=0, start=1, stop=3)
    g.output(g.unary(knopt.ir.Unary.RELU, g.view(sliced, (12,))), "a")
    g.output(g.unary(knopt.ir.Unary.NEG, y), "b")
    plan = build_plan(program_from_graph(g.build()))
    assert len(plan.steps) == 2  # the two elementwise kernels, reading the views in place


def test_an_input_that_is_also_an_output_keeps_its_input_buffer() -> None:
    # Regression: a Tensor's role says "output" then, and the input got no buffer.
    g = knopt.ir.GraphBuilder("io")
    x = g.input("x", (3,), knopt.ir.DType.F32)
    g.output(x, "same")
    g.output(g.unary(knopt.ir.Unary.NEG, x), "negated")
    plan = build_plan(program_from_graph(g.build()))
    ((_, tid),) = plan.inputs
    assert plan.buffers[plan.tensors[tid].buffer].region == "input"
    assert plan.buffers[plan.tensors[plan.outputs[0][1]].buffer].region == "output"
