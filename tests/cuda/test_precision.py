"""Reduced-precision programs keep f32 at the edges and compute close to the f32 program.

Where a quantization rounds float work, that work stays f32 and the codes equal f32's.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import knopt
from knopt.cpu.program import run_program
from knopt.cuda.precision import QuantizedRegion, narrow_program, quantized_region
from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.op import Binary, Unary
from knopt.ir.program import (
    BinaryE,
    CastE,
    ClampE,
    Const,
    Expr,
    Kernel,
    Load,
    Program,
    UnaryE,
    WhereE,
    program_from_graph,
)
from tests.cuda.programs import ProgramBuilder
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


# ---- the quantized region stays f32 ----------------------------------------------------------

F32, F16 = DType.F32, DType.F16
SHAPE = (64, 64)


def _quantize(x: Expr, scale: Expr) -> Expr:
    """QuantizeLinear to uint8 with zero point 128, as a body: `cast<u8>(clamp(round(x/s)+128))`."""
    rounded = BinaryE(
        Binary.ADD, UnaryE(Unary.ROUND, BinaryE(Binary.DIV, x, scale)), Const(128, F32)
    )
    return CastE(ClampE(rounded, 0.0, 255.0), DType.U8)


def _requantized_residual(rng: np.random.Generator) -> tuple[Program, dict[str, int]]:
    """codes -> dequantize -> + residual -> requantize, the sum also read by float kernels."""
    b = ProgramBuilder()
    ids = {"codes": b.input("codes", SHAPE, DType.U8), "residual": b.input("residual", SHAPE)}
    ids["scale"] = b.constant(rng.uniform(0.002, 0.004, SHAPE).astype(np.float32))
    dequantize = BinaryE(
        Binary.MUL, BinaryE(Binary.SUB, CastE(Load(0), F32), Const(128, F32)), Load(1)
    )
    ids["dq"] = b.kernel(
        "elementwise", None, (ids["codes"], ids["scale"]), SHAPE, F32, body=dequantize
    )
    add = BinaryE(Binary.ADD, Load(0), Load(1))
    ids["sum"] = b.kernel("elementwise", None, (ids["dq"], ids["residual"]), SHAPE, F32, body=add)
    q = _quantize(Load(0), Load(1))
    ids["q"] = b.kernel("elementwise", None, (ids["sum"], ids["scale"]), SHAPE, DType.U8, body=q)
    exp = UnaryE(Unary.EXP, Load(0))
    ids["exp"] = b.kernel("elementwise", None, (ids["sum"],), SHAPE, F32, body=exp)
    ids["neg"] = b.op(ops.UnaryOp(Unary.NEG), (ids["sum"],))
    return b.build([ids["q"], ids["exp"], ids["neg"]]), ids


def _kernel_writing(program: Program, tid: int) -> Kernel:
    return next(k for k in program.kernels if k.output == tid)


def test_the_float_work_a_requantization_rounds_stays_f32(rng: np.random.Generator) -> None:
    program, ids = _requantized_residual(rng)
    region = quantized_region(program)
    assert region.kernels == {0, 1, 2}  # dequantize, add, quantize; not exp or neg
    assert region.tensors == {ids["residual"], ids["scale"], ids["dq"], ids["sum"]}
    narrow = narrow_program(program, F16)
    assert [narrow.tensors[ids[n]].type.dtype for n in ("dq", "sum", "exp", "neg")] == [
        F32,
        F32,
        F16,
        F16,
    ]
    assert narrow.constants[ids["scale"]].dtype == np.float32
    assert not any(k.kind == "Cast" and k.inputs == (ids["residual"],) for k in narrow.kernels)
    # The float branch computes in f16: exp converts as it loads, neg reads a cast copy.
    assert _kernel_writing(narrow, ids["exp"]).body == UnaryE(Unary.EXP, CastE(Load(0), F16))
    (copy,) = _kernel_writing(narrow, ids["neg"]).inputs
    assert _kernel_writing(narrow, copy) == Kernel("Cast", ops.Cast(F16), (ids["sum"],), copy)


def test_requantized_codes_under_fp16_equal_f32_bit_for_bit(rng: np.random.Generator) -> None:
    program, _ = _requantized_residual(rng)
    feeds: dict[str, np.ndarray] = {
        "codes": rng.integers(1, 256, SHAPE).astype(np.uint8),
        "residual": rng.uniform(-0.2, 0.2, SHAPE).astype(np.float32),
    }
    expected = run_program(program, feeds)
    (codes, exp, neg) = run_program(narrow_program(program, F16), feeds)
    np.testing.assert_array_equal(codes, expected[0])
    np.testing.assert_allclose(exp, expected[1], rtol=1e-2)
    np.testing.assert_allclose(neg, expected[2], rtol=1e-2)
    # Without the region the sum is rounded to f16 and codes flip: the check above has teeth.
    (flipped, _, _) = run_program(narrow_program(program, F16, QuantizedRegion()), feeds)
    assert (flipped != expected[0]).any()


def test_float_products_end_the_region_and_are_read_widened(rng: np.random.Generator) -> None:
    b = ProgramBuilder()
    x = b.input("x", (8, 16))
    w = b.constant(rng.standard_normal((16, 8)).astype(np.float32))
    product = b.op(ops.MatMul(), (x, w))
    scale = b.constant(np.full((8, 8), 0.05, np.float32))
    codes = b.kernel(
        "elementwise", None, (product, scale), (8, 8), DType.U8, body=_quantize(Load(0), Load(1))
    )
    program = b.build([codes])
    region = quantized_region(program)
    assert region == QuantizedRegion(frozenset({1}), frozenset({scale}))
    narrow = narrow_program(program, F16)
    assert narrow.tensors[product].type.dtype is F16
    assert _kernel_writing(narrow, codes).body == _quantize(CastE(Load(0), F32), Load(1))


def test_integer_tensors_end_the_walk_and_bool_tensors_do_not() -> None:
    b = ProgramBuilder()
    x = b.input("x", SHAPE)
    y = b.input("y", SHAPE)
    truncated = b.op(ops.Cast(DType.I32), (x,))  # an integer: exact in any precision
    positive = b.op(ops.BinaryOp(Binary.GREATER), (y, b.constant(np.zeros(SHAPE, np.float32))))
    body = WhereE(Load(1), CastE(Load(0), F32), Const(0.5, F32))
    chosen = b.kernel("elementwise", None, (truncated, positive), SHAPE, F32, body=body)
    codes = b.kernel(
        "elementwise", None, (chosen, y), SHAPE, DType.U8, body=_quantize(Load(0), Load(1))
    )
    program = b.build([codes])
    region = quantized_region(program)
    kinds = sorted(program.kernels[i].kind for i in region.kernels)
    assert kinds == ["GREATER", "elementwise", "elementwise"]  # not the Cast to int32
    assert x not in region.tensors and y in region.tensors
    narrow = narrow_program(program, F16)
    assert any(k.kind == "Cast" and k.inputs == (x,) for k in narrow.kernels)  # x narrows


def test_float_programs_narrow_exactly_as_without_a_region() -> None:
    for file in ("mlp_dynamo18.onnx", "bert_dynamo18.onnx"):
        fixture = next(f for f in fixtures() if f.file == file)
        program = program_from_graph(knopt.load(fixture.path))
        assert quantized_region(program) == QuantizedRegion()
        narrow = narrow_program(program, F16)
        empty = narrow_program(program, F16, QuantizedRegion())
        assert pickle.dumps(narrow) == pickle.dumps(empty)
        edges = {*narrow.inputs, *narrow.outputs}
        assert all(t.type.dtype is not F32 for t in narrow.tensors if t.id not in edges)
        f32_edges = [t for t in (*program.inputs, *program.outputs) if t in _f32(program)]
        assert len(narrow.kernels) == len(program.kernels) + len(f32_edges)  # the edge casts


def _f32(program: Program) -> set[int]:
    return {t.id for t in program.tensors if t.type.dtype is F32}


def test_results_only_float_products_read_are_stored_narrow(rng: np.random.Generator) -> None:
    """A requantize-dequantize whose result only a MatMul reads rounds it as it stores it."""
    b = ProgramBuilder()
    x = b.input("x", (8, 16))
    bias = b.constant(rng.uniform(-0.1, 0.1, (8, 16)).astype(np.float32))
    scale = b.constant(np.full((8, 16), 0.01, np.float32))
    codes = _quantize(BinaryE(Binary.ADD, Load(0), Load(1)), Load(2))
    dequantize = BinaryE(
        Binary.MUL, BinaryE(Binary.SUB, CastE(codes, F32), Const(128, F32)), Load(2)
    )
    fake = b.kernel("elementwise", None, (x, bias, scale), (8, 16), F32, body=dequantize)
    rows = b.view(ops.View((16, 8)), fake)
    w = b.constant(rng.standard_normal((8, 4)).astype(np.float32))
    product = b.op(ops.MatMul(), (rows, w))
    program = b.build([product])
    region = quantized_region(program)
    assert region == QuantizedRegion(frozenset({0}), frozenset({x, bias, scale}))
    narrow = narrow_program(program, F16)
    casts = [k.inputs for k in narrow.kernels if k.kind == "Cast"]
    assert casts == [(product,)]  # the output's to f32; none for the MatMul's operand
    assert narrow.tensors[fake].type.dtype is F16
    assert _kernel_writing(narrow, fake).body == CastE(dequantize, F16)  # computed in f32
    assert _kernel_writing(narrow, product).inputs[0] == rows
    feeds = {"x": rng.uniform(-1, 1, (8, 16)).astype(np.float32)}
    (expected,) = run_program(program, feeds)
    (actual,) = run_program(narrow, feeds)
    np.testing.assert_allclose(actual, expected, rtol=1e-2, atol=1e-2 * np.abs(expected).max())


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
    feeds: dict[str, np.ndarray] = {
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
    feeds: dict[str, np.ndarray] = {
        "p": rng.standard_normal((2, 3, 5)).astype(np.float32),
        "v": rng.standard_normal((2, 5, 4)).astype(np.float16),
    }
    (expected,) = run_program(program, feeds)
    (actual,) = prepare(program, "fp16").run(feeds)
    np.testing.assert_allclose(actual, expected, rtol=1e-2, atol=1e-2 * np.abs(expected).max())
