"""Run a kernel Program on numpy: the oracle for optimized programs and for the GPU backend."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from knopt.cpu.elementwise import NUMPY_BINARY, NUMPY_UNARY
from knopt.cpu.kernels import KERNELS
from knopt.errors import InputError
from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.kernel import KernelKind
from knopt.ir.program import (
    Acc,
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
)
from knopt.ir.shape import format_shape

Array = np.ndarray


def evaluate_expr(expr: Expr, loads: list[Array], acc: Array | None = None) -> Array:
    """A scalar body evaluated elementwise over whole arrays (all of one shape)."""
    if isinstance(expr, Load):
        return loads[expr.index]
    if isinstance(expr, Acc):
        assert acc is not None, "Acc outside an epilogue"
        return acc
    if isinstance(expr, Const):
        return np.asarray(expr.value).astype(expr.dtype.numpy)
    with np.errstate(all="ignore"):
        if isinstance(expr, UnaryE):
            return np.asarray(NUMPY_UNARY[expr.kind](evaluate_expr(expr.x, loads, acc)))
        if isinstance(expr, BinaryE):
            a = evaluate_expr(expr.a, loads, acc)
            b = evaluate_expr(expr.b, loads, acc)
            return np.asarray(NUMPY_BINARY[expr.kind](a, b))
        if isinstance(expr, ClampE):
            x = evaluate_expr(expr.x, loads, acc)
            return KERNELS[ops.Clamp](ops.Clamp(expr.lo, expr.hi), x)
        if isinstance(expr, CastE):
            x = evaluate_expr(expr.x, loads, acc)
            return KERNELS[ops.Cast](ops.Cast(expr.dtype), x)
        assert isinstance(expr, WhereE)
        condition = evaluate_expr(expr.condition, loads, acc)
        return np.where(
            condition, evaluate_expr(expr.a, loads, acc), evaluate_expr(expr.b, loads, acc)
        )


def run_kernel(
    kernel: Kernel, args: list[Array], out_dtype: DType, shape: tuple[int, ...]
) -> Array:
    """Evaluate one kernel on its input arrays."""
    if kernel.kind == KernelKind.ELEMENTWISE:
        assert kernel.body is not None
        result = evaluate_expr(kernel.body, args)
    else:
        op = kernel.op
        assert op is not None
        if kernel.prologue is not None:
            operands = [evaluate_expr(kernel.prologue, args)]
        else:
            arity = op.arity if op.arity is not None else len(args)
            operands = args[:arity]
        result = np.asarray(KERNELS[type(op)](op, *operands))
        if kernel.epilogue is not None:
            result = evaluate_expr(kernel.epilogue, args, result)
    result = np.broadcast_to(result, shape) if result.shape != shape else result
    return result if result.dtype == out_dtype.numpy else result.astype(out_dtype.numpy)


def run_program(program: Program, feeds: Mapping[str, Array]) -> list[Array]:
    """Run a program whose shapes are all static; returns the outputs in order.

    Raises:
        InputError: If a feed is missing or has the wrong shape or dtype.
    """
    values: dict[int, Array] = dict(program.constants)
    for name, tid in zip(program.input_names, program.inputs, strict=True):
        expected = program.tensors[tid].type
        if name not in feeds:
            raise InputError(f"input '{name}' is missing (expected {expected})")
        array = np.asarray(feeds[name])
        if array.shape != expected.shape or array.dtype != expected.dtype.numpy:
            raise InputError(
                f"input '{name}' is {array.dtype}{list(array.shape)}, expected "
                f"{expected.dtype.numpy}{format_shape(expected.shape)}"
            )
        values[tid] = array
    last_use = {tid: i for i, k in enumerate(program.kernels) for tid in k.inputs}
    keep = set(program.outputs)
    for index, kernel in enumerate(program.kernels):
        out = program.tensors[kernel.output].type
        args = [values[t] for t in kernel.inputs]
        if kernel.is_view:
            assert kernel.op is not None
            values[kernel.output] = KERNELS[type(kernel.op)](kernel.op, *args)
        else:
            values[kernel.output] = run_kernel(kernel, args, out.dtype, out.shape)  # type: ignore[arg-type]
        for tid in set(kernel.inputs):
            if last_use[tid] == index and tid not in keep and tid not in program.constants:
                del values[tid]
    return [np.asarray(values[t]) for t in program.outputs]
