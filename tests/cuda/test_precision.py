"""Reduced-precision programs keep f32 at the edges and compute close to the f32 program."""

from __future__ import annotations

import numpy as np
import pytest

import knopt
from knopt.cpu.program import run_program
from knopt.cuda.precision import narrow_program
from knopt.ir.dtype import DType
from knopt.ir.program import Program, program_from_graph
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


def _widened_matmul(output_cast: bool) -> Program:
    """p @ cast<f32>(v) with v in f16, as TorchScript exports of fp16 decoders read the V cache."""
    g = knopt.ir.GraphBuilder("widened")
    p = g.input("p", (2, 3, 5), DType.F32)
    v = g.input("v", (2, 5, 4), DType.F16)
    widened = g.cast(v, DType.F32)
    g.output(g.matmul(p, widened), "y")
    if output_cast:
        g.output(widened, "v32")
    return program_from_graph(g.build())


def test_casts_that_narrowing_makes_no_ops_become_views() -> None:
    # Narrowed to f16, the cast would copy v each run; as a view it reads v where it lies.
    program = _widened_matmul(output_cast=False)
    narrow = narrow_program(program, DType.F16)
    assert not any(k.kind == "Cast" for k in narrow.kernels if k.inputs == (program.inputs[1],))
    assert any(k.is_view for k in narrow.kernels if k.inputs == (program.inputs[1],))
    rng = np.random.default_rng(0)
    feeds = {
        "p": rng.standard_normal((2, 3, 5)).astype(np.float32),
        "v": rng.standard_normal((2, 5, 4)).astype(np.float16),
    }
    (expected,) = run_program(program, feeds)
    (actual,) = run_program(narrow, feeds)
    np.testing.assert_allclose(actual, expected, rtol=1e-2, atol=1e-2 * np.abs(expected).max())


def test_a_no_op_cast_to_an_output_keeps_its_kernel() -> None:
    program = _widened_matmul(output_cast=True)
    narrow = narrow_program(program, DType.F16)
    (cast,) = [k for k in narrow.kernels if k.inputs == (program.inputs[1],)]
    assert cast.kind == "Cast"


@pytest.mark.cuda
def test_a_no_op_cast_read_as_a_view_runs_on_the_gpu() -> None:
    from knopt.cuda import prepare

    program = _widened_matmul(output_cast=False)
    rng = np.random.default_rng(1)
    feeds = {
        "p": rng.standard_normal((2, 3, 5)).astype(np.float32),
        "v": rng.standard_normal((2, 5, 4)).astype(np.float16),
    }
    (expected,) = run_program(program, feeds)
    (actual,) = prepare(program, "fp16").run(feeds)
    np.testing.assert_allclose(actual, expected, rtol=1e-2, atol=1e-2 * np.abs(expected).max())
