"""Differential fuzzing on the GPU: hypothesis-drawn graphs, optimized, match the CPU oracle.

The same strategy as tests/testing/test_fuzz.py: each drawn graph is optimized under the H200
cost model and its kernel program runs on the GPU (strict f32); the result must equal the CPU
result of the original graph. `KNOPT_GPU_FUZZ_EXAMPLES` sets the count; on the GPU machine,
several processes with different `--hypothesis-seed`s share the work (tests/testing/NOTES.md).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import given

import knopt
from knopt.cpu import run_graph
from knopt.ir import format_graph
from knopt.opt.egraph import Limits
from knopt.testing import Case, compare_outputs, fuzz_settings, graph_and_inputs
from knopt.testing.arrays import describe_inputs

pytestmark = pytest.mark.cuda

EXAMPLES = int(os.environ.get("KNOPT_GPU_FUZZ_EXAMPLES", "300"))
LIMITS = Limits(seconds=20, nodes=50_000)  # as on the CPU (tests/testing/test_fuzz.py)


@fuzz_settings(EXAMPLES)
@given(case=graph_and_inputs(opaque=False))  # the GPU refuses opaque ops
def test_optimized_programs_on_the_gpu_agree_with_the_cpu(case: Case) -> None:
    from knopt.cuda import prepare

    expected = run_graph(case.graph, case.inputs)
    program = knopt.optimize(case.graph, profile="h200-graph", ilp=False, limits=LIMITS).program
    actual = prepare(program, "f32").run(case.inputs)
    comparison = compare_outputs(actual, expected)
    assert comparison.ok, (
        f"the GPU disagrees: {comparison.message}\n{format_graph(case.graph)}\n"
        f"inputs:\n{describe_inputs(case.inputs)}"
    )
