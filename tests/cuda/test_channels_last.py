"""Channels-last regions of half-precision convolutions: which tensors, and GPU results."""

from __future__ import annotations

import numpy as np
import pytest

import knopt
from knopt.cuda.gen.channels_last import channels_last_layout, is_channels_last
from knopt.cuda.planner import Plan, build_plan
from knopt.cuda.precision import narrow_program
from knopt.cuda.steps import Conv, Launch
from knopt.ir import GraphBuilder
from knopt.ir.dtype import DType
from knopt.ir.graph import Graph
from knopt.ir.program import Program, program_from_graph
from tests.cuda.programs import compare, loaded_nvrtc, random_array


def _graph(rng: np.random.Generator, *, channels: int = 16, convs: int = 2) -> Graph:
    """`convs` 3x3 convolutions with bias and RELU, the last adding the input back."""
    g = GraphBuilder("convs")
    x = g.input("x", (2, channels, 12, 12), DType.F32)
    h = x
    for i in range(convs):
        w = g.constant((0.2 * rng.standard_normal((channels, channels, 3, 3))).astype(np.float32))
        b = g.constant(rng.standard_normal((channels, 1, 1)).astype(np.float32))
        y = g.add(g.conv(h, w, strides=(1, 1), pads=((1, 1), (1, 1)), dilations=(1, 1)), b)
        if i == convs - 1:
            y = g.add(y, x)
        h = g.unary(knopt.ir.op.Unary.RELU, y)
    g.output(h, "y")
    return g.build()


def _half_plan(program: Program) -> Plan:
    return build_plan(narrow_program(program, DType.F16), "fp16")


def test_a_region_of_convolutions_is_stored_channels_last(rng: np.random.Generator) -> None:
    plan = _half_plan(program_from_graph(_graph(rng)))
    convs = [s for s in plan.steps if isinstance(s, Conv)]
    assert len(convs) == 2 and all(c.channels_last for c in convs)
    for conv in convs:
        for tid in (conv.x, conv.w, conv.y):
            assert is_channels_last(plan.tensors[tid].layout)
    # The weights were permuted on the host: their memory is K, R, S, C.
    weight = plan.constants[plan.tensors[convs[0].w].buffer]
    assert weight.shape == (16, 3, 3, 16)
    # The program's output is handed out row-major.
    (_, out) = plan.outputs[0]
    assert plan.tensors[out].layout.is_contiguous


def test_the_kernels_of_a_region_compile(rng: np.random.Generator) -> None:
    nvrtc = loaded_nvrtc()

    plan = _half_plan(program_from_graph(_graph(rng)))
    launches = {s.name: s for s in plan.steps if isinstance(s, Launch)}
    launches.update(
        {s.direct.name: s.direct for s in plan.steps if isinstance(s, Conv) and s.direct}
    )
    source = '#include "common.cuh"\n' + "\n".join(s.source for s in launches.values())
    assert nvrtc.compile_cubin(source, "sm_90")


@pytest.mark.parametrize(
    ("channels", "convs", "precision"),
    [(16, 1, "fp16"), (12, 2, "fp16"), (16, 2, "f32")],
    ids=["a lone convolution", "channels not a multiple of 8", "f32"],
)
def test_no_region_without_two_tensor_core_convolutions(
    rng: np.random.Generator, channels: int, convs: int, precision: str
) -> None:
    program = program_from_graph(_graph(rng, channels=channels, convs=convs))
    plan = _half_plan(program) if precision == "fp16" else build_plan(program, precision)
    assert not any(s.channels_last for s in plan.steps if isinstance(s, Conv))


def test_layouts() -> None:
    layout = channels_last_layout((2, 16, 5, 7))
    assert layout.strides == (16 * 5 * 7, 1, 7 * 16, 16)
    assert layout.dense_order == (0, 2, 3, 1)
    assert is_channels_last(layout)
    assert not is_channels_last(channels_last_layout((2, 16, 1, 1)))  # also row-major


@pytest.mark.cuda
@pytest.mark.parametrize("optimized", [False, True], ids=["unfused", "optimized"])
def test_channels_last_results_match_the_cpu(rng: np.random.Generator, optimized: bool) -> None:
    graph = _graph(rng, convs=3)
    program = (
        knopt.optimize(graph, profile="h200-graph", ilp=False).program
        if optimized
        else program_from_graph(graph)
    )
    assert any(s.channels_last for s in _half_plan(program).steps if isinstance(s, Conv))
    feeds = {"x": random_array(rng, (2, 16, 12, 12), DType.F32)}
    compare(program, feeds, precision="fp16")
