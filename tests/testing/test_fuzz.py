"""Differential fuzzing: every drawn graph computes the same after `knopt.optimize`.

The CPU result of a random graph must equal that of the optimized graph and of its kernel
program. `KNOPT_FUZZ_EXAMPLES` sets how many graphs are drawn (CI: the default), and a
failure shrinks to a small graph that is printed and saved (ONNX, text and inputs) into
`KNOPT_FUZZ_DIR` (default: a pytest temporary folder). See tests/testing/NOTES.md.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import event, given

import knopt
from knopt.cpu import run_graph
from knopt.cpu.program import run_program
from knopt.ir import DType, GraphBuilder, format_graph
from knopt.opt.egraph import Limits, saturate
from knopt.testing import Case, compare_outputs, fuzz_settings, graph_and_inputs
from knopt.testing.arrays import describe_inputs

EXAMPLES = int(os.environ.get("KNOPT_FUZZ_EXAMPLES", "300"))
# Below the default node limit: a step can grow the e-graph tenfold before the bridge checks
# it again, and some affine chains do (see test_cancelling_biases_stay_small, #6).
LIMITS = Limits(seconds=20, nodes=50_000)


@pytest.fixture(scope="module")
def failure_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = os.environ.get("KNOPT_FUZZ_DIR")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        return Path(folder)
    return tmp_path_factory.mktemp("fuzz")


def _save(case: Case, folder: Path) -> str:
    """Save the failing case; each failure overwrites the last, so the shrunk one remains."""
    knopt.save(case.graph, folder / "fuzz-failure.onnx")
    (folder / "fuzz-failure.txt").write_text(format_graph(case.graph) + "\n")
    inputs: dict[str, Any] = case.inputs
    np.savez(folder / "fuzz-failure-inputs.npz", **inputs)
    text = format_graph(case.graph)
    return f"{text}\ninputs:\n{describe_inputs(case.inputs)}\nsaved as {folder}/fuzz-failure.onnx"


@fuzz_settings(EXAMPLES)
@given(case=graph_and_inputs())
def test_optimized_graph_and_program_agree_with_the_original(case: Case, failure_dir: Path) -> None:
    expected = run_graph(case.graph, case.inputs)
    try:
        result = knopt.optimize(case.graph, ilp=False, limits=LIMITS)
        outputs = {
            "optimized graph": run_graph(result.graph, case.inputs),
            "kernel program": run_program(result.program, case.inputs),
        }
    except Exception as err:
        err.add_note(_save(case, failure_dir))
        raise
    if result.report.stopped_by:
        event(f"saturation stopped by the {result.report.stopped_by.split(' (')[0]}")
    for what, actual in outputs.items():
        comparison = compare_outputs(actual, expected)
        if not comparison.ok:
            pytest.fail(f"the {what} disagrees: {comparison.message}\n{_save(case, failure_dir)}")


# ---- regressions the fuzzer found ------------------------------------------------------------


def test_a_negative_zero_constant_optimizes(rng: np.random.Generator) -> None:
    g = GraphBuilder("negative-zero")
    x = g.input("x", (2,), DType.F32)
    g.output(g.add(x, g.constant(np.array([-0.0, -0.0], np.float32))), "y")
    graph = g.build()
    feeds = {"x": rng.uniform(0.5, 2.0, (2,)).astype(np.float32)}
    result = knopt.optimize(graph, ilp=False)
    assert compare_outputs(run_graph(result.graph, feeds), run_graph(graph, feeds)).ok


def test_cancelling_biases_stay_small() -> None:
    g = GraphBuilder("cancelling-biases")
    x = g.input("x", (2, 3), DType.F32)
    scale = g.constant(np.array([[1.5], [2.5]], np.float32))
    shifted = g.sub(g.add(x, g.constant(np.float32(1.5))), g.constant(np.float32(1.5)))
    g.output(g.mul(shifted, scale), "y")
    saturation = saturate(g.build(), limits=Limits(seconds=30, nodes=5_000))
    assert saturation.stopped_by is None
    assert saturation.egraph_nodes < 5_000
