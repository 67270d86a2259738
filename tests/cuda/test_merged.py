"""Merged GEMMs and convolutions (rules/merge.egg) on the GPU: slices of one result as views."""

from __future__ import annotations

import numpy as np
import pytest

import knopt
from knopt.ir import Graph, GraphBuilder, Unary, Value
from knopt.ir.program import Program
from tests.cuda.programs import compare
from tests.rules.helpers import graph_of, random_feeds
from tests.rules.test_merge import _convs, _projections

pytestmark = pytest.mark.cuda


def _merged(graph: Graph) -> Program:
    """The optimized program, which must read the merged result through slices."""
    program = knopt.optimize(graph, profile="h200-graph", ilp=False).program
    assert any(k.is_view and k.op is not None and k.op.name == "Slice" for k in program.kernels)
    return program


@pytest.mark.parametrize("precision", ["f32", "fp16"])
def test_projections_merged_with_biases_match_cpu(precision: str) -> None:
    def build(g: GraphBuilder) -> list[Value]:
        q, k, v = _projections(g, (16, 8, 8))
        # The slices are read through a head-split view and by an elementwise kernel.
        return [g.view(q, (10, 2, 8)), g.unary(Unary.TANH, k), v]

    graph = graph_of(build)
    compare(_merged(graph), random_feeds(graph, np.random.default_rng(3)), precision=precision)


def test_parallel_convolutions_merged_with_bias_and_relu_match_cpu() -> None:
    graph = graph_of(lambda g: _convs(g, (4, 8, 2), (1, 1, 1)))
    compare(_merged(graph), random_feeds(graph, np.random.default_rng(4)))
