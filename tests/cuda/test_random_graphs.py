"""A few hundred random graphs match between the GPU and the CPU executor."""

from __future__ import annotations

import numpy as np
import pytest

from tests.cuda.programs import compare_graph
from tests.cuda.random_graphs import RandomGraphs

pytestmark = pytest.mark.cuda

GRAPHS = 300
PER_PROGRAM = 30  # graphs share one program, so their kernels compile together


@pytest.mark.parametrize("batch", range(GRAPHS // PER_PROGRAM))
def test_random_graphs_match_cpu(batch: int) -> None:
    graphs = RandomGraphs(np.random.default_rng(1000 + batch))
    for index in range(PER_PROGRAM):
        graphs.add_graph(index)
    compare_graph(graphs.builder.build(), graphs.feeds, rtol=1e-4, atol=1e-4)
