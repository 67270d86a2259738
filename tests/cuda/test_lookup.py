"""Tails after an 8-bit code looked up in a table (knopt/cuda/gen/lookup.py).

Without a GPU: the split is checked by emulating the kernel on the CPU (the code computed by
the CPU executor, then the table read at its bits) against the whole body, bit for bit, and the
planned kernels must compile. On a GPU the program's codes must equal the CPU's.
"""

from __future__ import annotations

import numpy as np
import pytest

import knopt
from knopt.cpu.program import evaluate_expr
from knopt.cuda.context import LoweringContext
from knopt.cuda.gen.constants import add_constant
from knopt.cuda.gen.lookup import code_table
from knopt.cuda.layout import Layout
from knopt.cuda.planner import build_plan
from knopt.cuda.precision import narrow_dtype, narrow_program
from knopt.cuda.steps import Launch
from knopt.ir import bind_symbols
from knopt.ir.dtype import DType
from knopt.ir.op import Binary, Unary
from knopt.ir.program import BinaryE, CastE, ClampE, Expr, Load, Program, UnaryE, WhereE
from tests.cuda.programs import compare, loaded_nvrtc
from tests.rules.test_quantize import I8, U8, Model

SHAPE = (6, 40)
INPUTS = [0, 2, 4, 6, 8, 10]  # the views _context makes, in its order


def _quantize(x: Expr, scale: Expr, zero: Expr, fill: Expr, dtype: DType) -> Expr:
    """Quantization as the rules write it: round half to even, add, clamp, NaN, cast."""
    info = np.iinfo(dtype.numpy)
    lo, hi = float(info.min), float(info.max)
    shifted = BinaryE(Binary.ADD, UnaryE(Unary.ROUND, BinaryE(Binary.DIV, x, scale)), zero)
    clamped = ClampE(shifted, lo, hi)
    return CastE(CastE(WhereE(UnaryE(Unary.IS_NAN, clamped), fill, clamped), DType.I32), dtype)


def _dequantize(code: Expr, scale: Expr, zero: Expr) -> Expr:
    return BinaryE(Binary.MUL, BinaryE(Binary.SUB, CastE(code, DType.F32), zero), scale)


def _context(rng: np.random.Generator, dtype: DType) -> tuple[LoweringContext, list[np.ndarray]]:
    """Tensors 0-5: an int32 accumulator, per-column scales, then scalars broadcast to SHAPE."""
    ctx = LoweringContext()
    acc = rng.integers(-(2**20), 2**20, SHAPE).astype(np.int32)
    acc.flat[:4] = [np.iinfo(np.int32).min, np.iinfo(np.int32).max, 0, -1]
    columns = rng.uniform(1e-4, 1e-3, SHAPE[1]).astype(np.float32)
    zero = 3.0 if dtype is DType.U8 else -2.0
    scalars = [np.float32(0.05), np.float32(zero), np.float32(0.0), np.float32(0.07)]
    arrays = [acc, np.broadcast_to(columns, SHAPE)] + [np.full(SHAPE, s) for s in scalars]
    ctx.new_tensor(SHAPE, DType.I32)
    column = add_constant(ctx, columns, DType.F32)
    ctx.add_tensor(DType.F32, Layout(SHAPE, (0, 1), 0), ctx.tensor(column).buffer)
    for value in scalars:
        one = add_constant(ctx, np.array([value]), DType.F32)
        ctx.add_tensor(DType.F32, Layout(SHAPE, (0, 0), 0), ctx.tensor(one).buffer)
    return ctx, arrays


def _requantized_gelu(dtype: DType) -> Expr:
    """BERT's first feed-forward epilogue: requantize, dequantize, GELU, quantize."""
    acc = BinaryE(Binary.MUL, CastE(Load(0), DType.F32), Load(1))
    code = _quantize(acc, Load(2), Load(3), Load(4), dtype)
    gelu = UnaryE(Unary.GELU, _dequantize(code, Load(2), Load(3)))
    return _quantize(gelu, Load(5), Load(3), Load(4), dtype)


@pytest.mark.parametrize("dtype", [DType.I8, DType.U8])
def test_a_requantized_gelu_tail_is_looked_up_and_agrees_with_the_body(
    rng: np.random.Generator, dtype: DType
) -> None:
    ctx, arrays = _context(rng, dtype)
    inputs = INPUTS
    body = _requantized_gelu(dtype)
    out = ctx.new_tensor(SHAPE, dtype)
    found = code_table(ctx, body, inputs, out)
    assert found is not None
    codes = evaluate_expr(found.code, arrays)
    assert codes.dtype == dtype.numpy
    table = ctx.constants[ctx.tensor(found.table).buffer]
    emulated = table[codes.view(np.uint8)]
    np.testing.assert_array_equal(emulated, evaluate_expr(body, arrays))


def test_a_tail_that_reads_a_per_column_tensor_is_computed(rng: np.random.Generator) -> None:
    ctx, _ = _context(rng, DType.I8)
    body = _requantized_gelu(DType.I8)
    gelu_on_columns = BinaryE(Binary.MUL, CastE(body, DType.F32), Load(1))
    out = ctx.new_tensor(SHAPE, DType.F32)
    assert code_table(ctx, gelu_on_columns, INPUTS, out) is None


def test_a_body_that_ends_at_its_code_is_computed(rng: np.random.Generator) -> None:
    ctx, _ = _context(rng, DType.I8)
    acc = BinaryE(Binary.MUL, CastE(Load(0), DType.F32), Load(1))
    body = _quantize(acc, Load(2), Load(3), Load(4), DType.I8)
    out = ctx.new_tensor(SHAPE, DType.I8)
    assert code_table(ctx, body, INPUTS, out) is None


# ---- whole programs --------------------------------------------------------------------------


def _qdq_gelu_linear(rng: np.random.Generator, act: type) -> bytes:
    """A QDQ linear layer whose requantized output goes through an erf GELU, quantized again."""
    m = Model()
    zero = 3 if act is U8 else -2
    x = m.qdq(m.input("x", ["batch", 16, 64]), 0.05, zero, act)
    codes: np.ndarray = rng.integers(-128, 128, (64, 32)).astype(I8)
    scales = rng.uniform(0.002, 0.02, 32).astype(np.float32)
    w = m.dq(codes, scales, np.zeros(32, I8), axis=1)
    h = m.qdq(m.node("MatMul", [x, w]), 0.1, zero, act)
    erf = m.node("Erf", [m.node("Div", [h, m.const(np.float32(np.sqrt(2.0)))])])
    half = m.node("Mul", [h, m.node("Add", [erf, m.const(np.float32(1.0))])])
    gelu = m.node("Mul", [half, m.const(np.float32(0.5))])
    s, z = m.const(np.float32(0.05)), m.const(np.array(zero, dtype=act))
    m.node("QuantizeLinear", [gelu, s, z])
    return m.build("y")


def _program(rng: np.random.Generator, act: type) -> Program:
    graph = bind_symbols(knopt.load(_qdq_gelu_linear(rng, act)), {"batch": 2})
    return knopt.optimize(graph, profile="h200", ilp=False).program


def _launches(program: Program, precision: str) -> list[Launch]:
    target = narrow_dtype(precision)
    narrowed = program if target is None else narrow_program(program, target)
    return [s for s in build_plan(narrowed, precision).steps if isinstance(s, Launch)]


@pytest.mark.parametrize("precision", ["f32", "fp16"])
def test_a_quantized_gelu_layer_plans_a_table_that_compiles(
    rng: np.random.Generator, precision: str, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("KNOPT_CACHE_DIR", str(tmp_path))
    launches = _launches(_program(rng, I8), precision)
    assert any("lut[" in s.source for s in launches)
    nvrtc = loaded_nvrtc()
    sources = {s.name: s.source for s in launches}
    cubin = nvrtc.compile_cubin('#include "common.cuh"\n' + "\n".join(sources.values()), "sm_90")
    for name in sources:
        assert name.encode() in cubin


@pytest.mark.cuda
@pytest.mark.parametrize("precision", ["f32", "fp16"])
@pytest.mark.parametrize("act", [I8, U8])
def test_a_quantized_gelu_layer_matches_the_cpu(
    rng: np.random.Generator, act: type, precision: str
) -> None:
    program = _program(rng, act)
    feeds = {"x": rng.uniform(-3, 3, (2, 16, 64)).astype(np.float32)}
    compare(program, feeds, precision=precision)  # integer outputs: bit for bit
