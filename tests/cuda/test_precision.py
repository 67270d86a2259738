"""Reduced-precision programs keep f32 at the edges and compute close to the f32 program."""

from __future__ import annotations

import numpy as np

import knopt
from knopt.cpu.program import run_program
from knopt.cuda.precision import narrow_program
from knopt.ir.dtype import DType
from knopt.ir.program import program_from_graph
from tests.models import fixtures


def test_narrow_program_on_the_cpu_stays_close() -> None:
    fixture = next(f for f in fixtures() if f.file == "mlp_dynamo18.onnx")
    program = program_from_graph(knopt.load(fixture.path))
    narrow = narrow_program(program, DType.F16)
    assert all(narrow.tensors[t].type.dtype is DType.F32 for t in narrow.inputs)
    assert all(narrow.tensors[t].type.dtype is DType.F32 for t in narrow.outputs)
    assert any(t.type.dtype is DType.F16 for t in narrow.tensors)
    feeds = fixture.feeds()
    (expected,) = run_program(program, feeds)
    (actual,) = run_program(narrow, feeds)
    np.testing.assert_allclose(actual, expected, rtol=1e-2, atol=1e-2 * np.abs(expected).max())


def test_constants_saturate_instead_of_overflowing() -> None:
    g = knopt.ir.GraphBuilder("c")
    x = g.input("x", (3,), DType.F32)
    mask = g.constant(np.array([0.0, 1.0, 0.0], np.float32))
    big = g.scalar(float(np.finfo(np.float32).min), DType.F32, (3,))
    g.output(g.add(x, g.mul(mask, big)), "y")
    narrow = narrow_program(program_from_graph(g.build()), DType.F16)
    (y,) = run_program(narrow, {"x": np.ones(3, np.float32)})
    assert np.isfinite(y).all()
