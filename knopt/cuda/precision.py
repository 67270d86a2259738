"""Reduced precision: a Program whose f32 tensors become f16 or bf16.

Inputs and outputs keep f32 (a cast kernel converts each at the edge), constants are rounded,
and every f32 dtype inside kernels (casts, literals, iota) follows. Finite constants beyond the
narrow type's range saturate rather than become infinities: attention masks are often written
as `(1 - mask) * float32.min`, which as -inf would turn the zeros of the mask into NaN.
"""

from __future__ import annotations

import dataclasses
import logging

import ml_dtypes
import numpy as np

from knopt.errors import KnoptError
from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.kernel import KernelKind
from knopt.ir.op import Binary, TensorType
from knopt.ir.program import (
    VIEW,
    BinaryE,
    CastE,
    ClampE,
    Const,
    Expr,
    Kernel,
    Load,
    Program,
    Tensor,
    UnaryE,
    WhereE,
    expr_children,
    map_leaves,
)

PRECISIONS = {"f32": None, "tf32": None, "fp16": DType.F16, "bf16": DType.BF16}
logger = logging.getLogger("knopt")


def narrow_dtype(precision: str) -> DType | None:
    """The storage type f32 tensors get under `precision` (None: they stay f32).

    Raises:
        KnoptError: If `precision` is not one of f32, tf32, fp16, bf16.
    """
    if precision not in PRECISIONS:
        raise KnoptError(f"precision '{precision}' is unknown (use {', '.join(PRECISIONS)})")
    return PRECISIONS[precision]


def _scales(expr: Expr | None) -> bool:
    """Whether `expr` multiplies or divides anything (an int32 sum's dequantizing scale)."""
    if expr is None:
        return False
    if isinstance(expr, BinaryE) and expr.kind in (Binary.MUL, Binary.DIV):
        return True
    return any(_scales(child) for child in expr_children(expr))


def unscaled_sums(program: Program) -> list[Kernel]:
    """Integer products that write their int32 sum to an f32 tensor without scaling it.

    Such a sum (up to 127 * 127 * K) passes float16's largest value, 65504, and loses digits
    well before: narrowed, the tensor would hold infinities. It happens when extraction leaves
    the dequantizing scale to a kernel of its own.
    """
    return [
        k
        for k in program.kernels
        if KernelKind.of_name(k.kind) in _F32_EPILOGUES
        and program.tensors[k.output].type.dtype is DType.F32
        and not _scales(k.epilogue)
    ]


def effective_precision(program: Program, precision: str) -> str:
    """`precision`, or "f32" where narrowing would lose an integer product's sum (logged).

    Raises:
        KnoptError: If `precision` is unknown.
    """
    if narrow_dtype(precision) is None or not (kernels := unscaled_sums(program)):
        return precision
    names = ", ".join(f"'{k.names[0] if k.names else k.output}'" for k in kernels[:3])
    logger.warning(
        "precision %s: %d integer product(s) (%s) write an unscaled int32 sum that %s cannot "
        "hold; the program runs in f32",
        precision,
        len(kernels),
        names,
        precision,
    )
    return "f32"


def _retype(dtype: DType, target: DType) -> DType:
    return target if dtype is DType.F32 else dtype


def _narrow_array(array: np.ndarray, target: DType) -> np.ndarray:
    if array.dtype != np.float32:
        return array
    limit = float(ml_dtypes.finfo(target.numpy).max)
    finite = np.isfinite(array)
    clipped = np.where(finite, np.clip(array, -limit, limit), array)
    return clipped.astype(target.numpy)


def _expr(expr: Expr | None, target: DType) -> Expr | None:
    if expr is None or isinstance(expr, Load):
        return expr
    if isinstance(expr, Const):
        if expr.dtype is not DType.F32:
            return expr
        limit = float(ml_dtypes.finfo(target.numpy).max)
        value = expr.value if not np.isfinite(expr.value) else min(max(expr.value, -limit), limit)
        return Const(value, target)
    if isinstance(expr, UnaryE):
        return UnaryE(expr.kind, _expr(expr.x, target))  # type: ignore[arg-type]
    if isinstance(expr, BinaryE):
        return BinaryE(expr.kind, _expr(expr.a, target), _expr(expr.b, target))  # type: ignore[arg-type]
    if isinstance(expr, ClampE):
        return ClampE(_expr(expr.x, target), expr.lo, expr.hi)  # type: ignore[arg-type]
    if isinstance(expr, CastE):
        return CastE(_expr(expr.x, target), _retype(expr.dtype, target))  # type: ignore[arg-type]
    if isinstance(expr, WhereE):
        condition, a, b = (_expr(e, target) for e in (expr.condition, expr.a, expr.b))
        assert condition is not None and a is not None and b is not None
        return WhereE(condition, a, b)
    return expr


# Kinds whose epilogue stays in f32: their accumulator is int32, and dequantized (before a
# requantization scales it back) it can pass float16's largest value, 65504.
_F32_EPILOGUES = frozenset({KernelKind.INT_MATMUL, KernelKind.INT_CONV})


def _widened_loads(expr: Expr, wide: frozenset[int]) -> Expr:
    """`expr` reading the inputs in `wide` (f32 tensors, now narrowed) back in f32."""

    def widen(leaf: Expr) -> Expr:
        return CastE(leaf, DType.F32) if isinstance(leaf, Load) and leaf.index in wide else leaf

    return map_leaves(expr, widen)


def _f32_epilogue(program: Program, kernel: Kernel, target: DType) -> Expr | None:
    """An integer product's epilogue computing in f32 between narrowed inputs and output."""
    assert kernel.epilogue is not None
    wide = frozenset(
        i for i, t in enumerate(kernel.inputs) if program.tensors[t].type.dtype is DType.F32
    )
    expr = _widened_loads(kernel.epilogue, wide)
    if program.tensors[kernel.output].type.dtype is DType.F32:
        return CastE(expr, target)
    return expr


def _epilogue(program: Program, kernel: Kernel, target: DType) -> Expr | None:
    if kernel.epilogue is not None and KernelKind.of_name(kernel.kind) in _F32_EPILOGUES:
        return _f32_epilogue(program, kernel, target)
    return _expr(kernel.epilogue, target)


def _op(op: ops.Op | None, target: DType) -> ops.Op | None:
    if isinstance(op, ops.Cast | ops.Iota) and op.dtype is DType.F32:
        return dataclasses.replace(op, dtype=target)
    return op


def _alias_if_identity(kernel: Kernel, tensors: list[Tensor]) -> Kernel:
    """A view of its input for a Cast that narrowing made a no-op (f16 to f32, now f16 to f16).

    Exports of half-precision models widen operands to f32 where a constant was f32 (the V
    cache of a TorchScript decoder before `probabilities @ v`); narrowed, such a cast would
    copy the whole tensor every run. A view reads the input where it lies. A program output
    keeps its kernel: outputs get buffers of their own.
    """
    if kernel.kind != "Cast" or not isinstance(kernel.op, ops.Cast):
        return kernel
    (source,) = kernel.inputs
    out = tensors[kernel.output]
    if out.role == "output" or tensors[source].type.dtype is not kernel.op.dtype:
        return kernel
    return dataclasses.replace(kernel, kind=VIEW, op=ops.View(out.type.shape))


def narrow_program(program: Program, target: DType) -> Program:
    """A copy of `program` computing in `target` where it computed in f32."""
    tensors = [
        Tensor(t.id, TensorType(t.type.shape, _retype(t.type.dtype, target)), t.role)
        for t in program.tensors
    ]
    constants = {tid: _narrow_array(np.asarray(a), target) for tid, a in program.constants.items()}
    renamed: dict[int, int] = {}
    kernels: list[Kernel] = []
    inputs = list(program.inputs)
    for tid in program.inputs:
        if program.tensors[tid].type.dtype is DType.F32:
            narrow = len(tensors)
            tensors.append(
                Tensor(narrow, TensorType(program.tensors[tid].type.shape, target), "intermediate")
            )
            tensors[tid] = program.tensors[tid]
            kernels.append(Kernel("Cast", ops.Cast(target), (tid,), narrow))
            renamed[tid] = narrow
    for kernel in program.kernels:
        narrowed = dataclasses.replace(
            kernel,
            op=_op(kernel.op, target),
            inputs=tuple(renamed.get(t, t) for t in kernel.inputs),
            body=_expr(kernel.body, target),
            prologue=_expr(kernel.prologue, target),
            epilogue=_epilogue(program, kernel, target),
        )
        kernels.append(_alias_if_identity(narrowed, tensors))
    outputs = []
    for tid in program.outputs:
        source = renamed.get(tid, tid)
        if program.tensors[tid].type.dtype is DType.F32:
            wide = len(tensors)
            tensors.append(Tensor(wide, program.tensors[tid].type, "output"))
            kernels.append(Kernel("Cast", ops.Cast(DType.F32), (source,), wide))
            tensors[source] = (
                dataclasses.replace(tensors[source], role="intermediate")
                if tensors[source].role == "output"
                else tensors[source]
            )
            outputs.append(wide)
        else:
            outputs.append(source)
    return Program(
        tensors,
        kernels,
        inputs,
        list(program.input_names),
        outputs,
        list(program.output_names),
        constants,
        program.name,
    )
