"""Every kernel kind, fused ones included, runs on the GPU and matches the CPU executor."""

from __future__ import annotations

import numpy as np
import pytest

from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.op import Binary, Reduction, Unary
from knopt.ir.program import Acc, BinaryE, CastE, ClampE, Const, Load, UnaryE, WhereE
from tests.cuda.programs import ProgramBuilder, compare, random_feeds

pytestmark = pytest.mark.cuda

F32 = DType.F32


def _add(a, b):
    return BinaryE(Binary.ADD, a, b)


def _mul(a, b):
    return BinaryE(Binary.MUL, a, b)


def test_elementwise_over_strided_and_broadcast_views(rng: np.random.Generator) -> None:
    p = ProgramBuilder()
    x = p.input("x", (4, 6, 8))
    bias = p.input("bias", (8,))
    y = p.input("y", (8, 6, 4))
    b = p.view(ops.Broadcast((4, 6, 8)), p.view(ops.View((1, 1, 8)), bias))
    t = p.view(ops.Permute((2, 1, 0)), y)
    f = p.view(ops.Flip(1), x)
    body = WhereE(
        BinaryE(Binary.GREATER, Load(0), Const(0.0, F32)),
        UnaryE(Unary.TANH, _mul(_add(Load(0), Load(1)), Load(2))),
        ClampE(BinaryE(Binary.SUB, Load(3), Const(1.5, F32)), -1.0, 1.0),
    )
    out = p.kernel("elementwise", None, (x, b, t, f), (4, 6, 8), F32, body=body)
    s = p.view(ops.Slice(1, 1, 6, 2), x)
    narrow = p.kernel(
        "elementwise",
        None,
        (s,),
        (4, 3, 8),
        DType.F16,
        body=CastE(UnaryE(Unary.GELU, Load(0)), DType.F16),
    )
    program = p.build([out, narrow])
    compare(program, random_feeds(program, rng), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("axes", [(2,), (0,), (0, 2), (1,)])
def test_reduce_with_prologue_and_epilogue(rng: np.random.Generator, axes: tuple[int, ...]) -> None:
    p = ProgramBuilder()
    x = p.input("x", (5, 40, 64))
    y = p.input("y", (5, 40, 64))
    out_shape = tuple(1 if i in axes else d for i, d in enumerate((5, 40, 64)))
    scale = p.input("scale", out_shape)
    prologue = _mul(BinaryE(Binary.SUB, Load(0), Load(1)), BinaryE(Binary.SUB, Load(0), Load(1)))
    epilogue = UnaryE(Unary.SQRT, _mul(Acc(), Load(2)))
    out = p.kernel(
        "reduce",
        ops.Reduce(Reduction.SUM, axes),
        (x, y, scale),
        out_shape,
        F32,
        prologue=prologue,
        epilogue=UnaryE(Unary.ABS, epilogue),
    )
    top = p.kernel(
        "reduce",
        ops.Reduce(Reduction.MAX, axes),
        (x,),
        out_shape,
        F32,
        epilogue=_add(Acc(), Const(1.0, F32)),
    )
    program = p.build([out, top])
    compare(program, random_feeds(program, rng))


@pytest.mark.parametrize("kind", ["softmax", "layer_norm", "rms_norm"])
@pytest.mark.parametrize("length", [33, 768, 5000])
def test_rowwise_with_prologue_and_epilogue(
    rng: np.random.Generator, kind: str, length: int
) -> None:
    p = ProgramBuilder()
    shape = (6, 3, length)
    x = p.input("x", shape)
    residual = p.input("residual", shape)
    gamma = p.view(
        ops.Broadcast(shape), p.view(ops.View((1, 1, length)), p.input("gamma", (length,)))
    )
    beta = p.view(
        ops.Broadcast(shape), p.view(ops.View((1, 1, length)), p.input("beta", (length,)))
    )
    op = {
        "softmax": ops.Softmax(2),
        "layer_norm": ops.LayerNorm(2, 1e-5),
        "rms_norm": ops.RmsNorm(2, 1e-6),
    }[kind]
    out = p.kernel(
        kind,
        op,
        (x, residual, gamma, beta),
        shape,
        F32,
        prologue=_add(Load(0), Load(1)),
        epilogue=_add(_mul(Acc(), Load(2)), Load(3)),
    )
    plain = p.kernel(kind, op, (x,), shape, F32)
    program = p.build([out, plain])
    compare(program, random_feeds(program, rng))


_MATMUL_EPILOGUES = {
    "bias": _add(Acc(), Load(2)),
    "relu_bias": UnaryE(Unary.RELU, _add(Acc(), Load(2))),
    "gelu_tanh_bias": UnaryE(Unary.GELU_TANH, _add(Acc(), Load(2))),
    "scale": _mul(Acc(), Const(0.125, F32)),
    "residual_bias": _add(_add(Acc(), Load(2)), Load(3)),
    "relu": UnaryE(Unary.RELU, Acc()),
    "unfusable": UnaryE(Unary.SIGMOID, _mul(_add(Acc(), Load(2)), Load(3))),
}


@pytest.mark.parametrize("epilogue", sorted(_MATMUL_EPILOGUES))
@pytest.mark.parametrize("precision", ["f32", "fp16"])
def test_matmul_epilogues(rng: np.random.Generator, epilogue: str, precision: str) -> None:
    p = ProgramBuilder()
    a = p.input("a", (2, 48, 64))
    w = p.input("w", (64, 40))
    wb = p.view(ops.Broadcast((2, 64, 40)), p.view(ops.View((1, 64, 40)), w))
    bias = p.view(ops.Broadcast((2, 48, 40)), p.view(ops.View((1, 1, 40)), p.input("bias", (40,))))
    residual = p.input("residual", (2, 48, 40))
    out = p.kernel(
        "matmul",
        ops.MatMul(),
        (a, wb, bias, residual),
        (2, 48, 40),
        F32,
        epilogue=_MATMUL_EPILOGUES[epilogue],
    )
    program = p.build([out])
    compare(
        program,
        random_feeds(program, rng),
        precision=precision,
        **({"rtol": 1e-4, "atol": 1e-4} if precision == "f32" else {}),
    )


_CONV_EPILOGUES = {
    "bias_relu": UnaryE(Unary.RELU, _add(Acc(), Load(2))),
    "bias_residual_relu": UnaryE(Unary.RELU, _add(_add(Acc(), Load(2)), Load(3))),
    "residual": _add(Acc(), Load(3)),
    "unfusable": _mul(UnaryE(Unary.SILU, _add(Acc(), Load(2))), Const(0.5, F32)),
}


@pytest.mark.parametrize("epilogue", sorted(_CONV_EPILOGUES))
@pytest.mark.parametrize("precision", ["f32", "fp16"])
def test_conv_epilogues(rng: np.random.Generator, epilogue: str, precision: str) -> None:
    p = ProgramBuilder()
    x = p.input("x", (2, 16, 12, 12))
    w = p.input("w", (32, 16, 3, 3))
    bias = p.view(
        ops.Broadcast((2, 32, 12, 12)), p.view(ops.View((1, 32, 1, 1)), p.input("bias", (32,)))
    )
    residual = p.input("residual", (2, 32, 12, 12))
    op = ops.Conv((1, 1), ((1, 1), (1, 1)), (1, 1))
    out = p.kernel(
        "conv", op, (x, w, bias, residual), (2, 32, 12, 12), F32, epilogue=_CONV_EPILOGUES[epilogue]
    )
    program = p.build([out])
    compare(
        program,
        random_feeds(program, rng),
        precision=precision,
        **({"rtol": 1e-4, "atol": 1e-4} if precision == "f32" else {}),
    )


def test_single_op_kernels_with_split_prologue_and_epilogue(rng: np.random.Generator) -> None:
    # Ops whose generators do not fuse get their prologue and epilogue as separate kernels.
    p = ProgramBuilder()
    x = p.input("x", (3, 8, 5))
    y = p.input("y", (3, 8, 5))
    out = p.kernel(
        "CumSum",
        ops.CumSum(1),
        (x, y),
        (3, 8, 5),
        F32,
        prologue=_mul(Load(0), Load(1)),
        epilogue=_add(Acc(), Load(0)),
    )
    program = p.build([out])
    compare(program, random_feeds(program, rng), rtol=1e-4, atol=1e-4)


def test_attention_op_kernel(rng: np.random.Generator) -> None:
    p = ProgramBuilder()
    q = p.input("q", (2, 4, 128, 64))
    k = p.input("k", (2, 4, 128, 64))
    v = p.input("v", (2, 4, 128, 64))
    causal = np.triu(np.full((128, 128), -1e9, np.float32), 1)
    bias = p.view(
        ops.Broadcast((2, 4, 128, 128)), p.view(ops.View((1, 1, 128, 128)), p.constant(causal))
    )
    out = p.op(ops.Attention(0.125), (q, k, v, bias))
    program = p.build([out])
    compare(program, random_feeds(program, rng))
    compare(program, random_feeds(program, rng), precision="fp16")
