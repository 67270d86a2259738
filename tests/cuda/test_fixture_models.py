"""Every committed real-model fixture runs on the GPU and matches the CPU executor."""

from __future__ import annotations

import pytest

import knopt
from knopt.ir import bind_symbols, infer_sizes
from knopt.opt.program import program_from_graph
from tests.cuda.programs import compare
from tests.models import Fixture, fixtures

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("precision", ["f32", "fp16"])
@pytest.mark.parametrize("fixture", fixtures(), ids=lambda f: f.file)
def test_fixture_matches_cpu(fixture: Fixture, precision: str) -> None:
    feeds = fixture.feeds()
    graph = knopt.load(fixture.path)
    if graph.symbols():
        graph = bind_symbols(graph, infer_sizes(graph, {k: v.shape for k, v in feeds.items()}))
    compare(program_from_graph(graph), feeds, precision=precision)
