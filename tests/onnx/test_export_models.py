"""Every fixture model optimized and written for each target.

Each runs on onnxruntime like the original (at the manifest's sizes and at longer dynamic
axes), is valid ONNX with the original's input and output names, and a second round of load,
optimize and save writes as many nodes as the first (node counts against the original and
the simplifiers are measured by benchmarks/onnx_output.py).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import knopt
from knopt.ir.graph import Graph
from tests.models import Fixture, fixtures
from tests.oracle import assert_same, run_onnxruntime

# ts14nofold files optimize to the graphs of their ts14 twins: leaving them out saves a minute.
FIXTURES = [f for f in fixtures() if f.style != "ts14nofold"]
ROUND_TRIP = [f for f in FIXTURES if f.style == "ts14"]


@pytest.fixture(scope="module")
def optimized() -> dict[str, Graph]:
    """Every fixture optimized once (without the ILP, which tests/opt covers)."""
    return {f.file: knopt.optimize(knopt.load(f.path), ilp=False).graph for f in FIXTURES}


def _resized(fixture: Fixture) -> dict[str, np.ndarray] | None:
    """Feeds with every dynamic axis one longer than in the manifest, or None if none is."""
    specs = []
    for spec in fixture.inputs:
        shape = list(spec["shape"])
        for axis in spec.get("dynamic_axes", {}):
            shape[int(axis)] += 1
        specs.append({**spec, "shape": shape})
    if specs == fixture.inputs:
        return None
    return Fixture(fixture.file, fixture.model, fixture.style, specs).feeds(seed=3)


@pytest.mark.parametrize("target", ["onnx", "onnxruntime"])
@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.file for f in FIXTURES])
def test_written_model_runs_like_the_original(
    fixture: Fixture, target: str, optimized: dict[str, Graph]
) -> None:
    original = onnx.load(fixture.path)
    model = knopt.save(optimized[fixture.file], opset=18, target=target)
    onnx.checker.check_model(model, full_check=True)
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    assert [i.name for i in model.graph.input] == [i.name for i in original.graph.input]
    assert [o.name for o in model.graph.output] == [o.name for o in original.graph.output]
    for feeds in (fixture.feeds(seed=2), _resized(fixture)):
        if feeds is not None:  # dynamic axes still work at other sizes
            assert_same(run_onnxruntime(model, feeds), run_onnxruntime(original, feeds))


@pytest.mark.parametrize("fixture", ROUND_TRIP, ids=[f.file for f in ROUND_TRIP])
def test_a_second_round_writes_as_many_nodes(fixture: Fixture, optimized: dict[str, Graph]) -> None:
    first = knopt.save(optimized[fixture.file])
    again = knopt.optimize(knopt.load(first.SerializeToString()), ilp=False).graph
    second = knopt.save(again)
    assert len(second.graph.node) == len(first.graph.node)
    feeds = fixture.feeds(seed=4)
    assert_same(run_onnxruntime(second, feeds), run_onnxruntime(first, feeds))
