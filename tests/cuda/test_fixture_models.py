"""Every committed real-model fixture runs on the GPU and matches the CPU executor."""

from __future__ import annotations

import numpy as np
import pytest

import knopt
from knopt.ir import bind_symbols, infer_sizes
from knopt.ir.program import program_from_graph
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


@pytest.mark.parametrize("precision", ["f32", "fp16"])
@pytest.mark.parametrize("fixture", fixtures(), ids=lambda f: f.file)
def test_fused_program_matches_cpu(fixture: Fixture, precision: str) -> None:
    feeds = fixture.feeds()
    graph = knopt.load(fixture.path)
    if graph.symbols():
        graph = bind_symbols(graph, infer_sizes(graph, {k: v.shape for k, v in feeds.items()}))
    program = knopt.optimize(graph, profile="h200-graph", ilp=False).program
    compare(program, feeds, precision=precision)


def test_session_runs_the_optimized_program_on_the_gpu() -> None:
    fixture = next(f for f in fixtures() if f.file == "bert_ts14.onnx")
    feeds = fixture.feeds()
    session = knopt.compile(fixture.path, device="cuda")
    assert session.optimize
    expected = knopt.compile(fixture.path).run(None, feeds)
    for mine, theirs in zip(session.run(None, feeds), expected, strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)
