"""Reduced precision: a Program whose f32 tensors become f16 or bf16, except where it requantizes.

Inputs and outputs keep f32 (a cast kernel converts each at the edge), constants are rounded,
and every f32 dtype inside kernels (casts, literals, iota) follows. Finite constants beyond the
narrow type's range saturate rather than become infinities: attention masks are often written
as `(1 - mask) * float32.min`, which as -inf would turn the zeros of the mask into NaN.

**The quantized region stays f32.** A quantized model's float work between a dequantize and
the next quantize (norms, residual adds, GELU, scale products) decides integer codes: rounded
to f16 on the way, a value moves across a rounding boundary of `round(x / scale)` and its code
flips by a step, which every later requantization keeps (7-10% of the outputs of the QDQ BERT,
LLaMA and dynamically quantized ResNet fixtures flipped by 1-5 steps on the H200). So the rule,
over the Program's dataflow:

- a kernel *quantizes* when one of its bodies rounds half to even (`ROUND`: what
  QuantizeLinear's `round(x / scale) + zero` becomes, before or after its cast to an integer);
- the *quantized region* is every quantizing kernel, and, walking back from each, the producer
  of every float or bool tensor it reads (through views), and so on: the float work whose
  result a requantization rounds. The walk stops at integer tensors (codes and int32 sums are
  exact in any precision: the region starts at their dequantize), at program inputs and
  constants, and at float products (MatMul, Conv, Attention, Int4MatMul): those are a float
  model's work, which the requested precision is for (W4A16 needs f16 activations). Kernels
  that read the region's results and write no float tensor (casts of rounded values to their
  integer type, NaN tests) join it: their result is the same either way;
- region kernels compute in f32 (their literals and casts keep f32) and the float tensors they
  write or read from inputs and constants are stored in f32. Everything else narrows as
  before. A kernel that reads a tensor of the other precision converts it where it loads it,
  or, for an operand the main op reads as a tensor, through a cast kernel of its own;
- except a region result that only kernels outside the region read (a requantized and
  dequantized Q, K or V that only the half-precision Attention reads): its kernel still
  computes in f32, codes included, and rounds the result once as it stores it, in its epilogue
  or elementwise body, where those readers would have rounded it as they load it or through a
  cast kernel. So the region adds no cast kernel: on the int8 BERT-base of the benchmarks, 36
  such casts (Q, K and V of 12 layers) made 138 kernels of 102. Program outputs keep f32.

The trade-off is bytes: the region's float tensors take twice the bytes of f16, and on a
model quantized throughout the region is every float tensor, so fp16 buys nothing there (exact
codes need exactly that float work in f32). Integer weights and codes are untouched. On the QDQ
BERT fixture (`bert_qdq_u8s8_channel.onnx`, batch 2 x 12 tokens, hidden 32) all 79 kernels and
all 218 f32 tensors stay f32: 54 activations (132 KiB) and 164 constants (66 KiB: scales,
biases, embedding tables), so its tensors take 233 KiB instead of 137 KiB narrowed; its int8
weights and uint8 codes (30 KiB) are the same either way. The LLaMA fixture keeps all 120
kernels; the dynamically quantized ResNet all but its head, whose logits no quantization reads.
A program without `ROUND` (a float model, unless it rounds explicitly: then that rounding's
inputs keep f32 too) narrows exactly as before.
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
from knopt.ir.op import Binary, TensorType, Unary
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


# ---- the quantized region -------------------------------------------------------------------

# Main ops whose kernels never join the region: a float model's products, which the requested
# precision is for (and W4A16, whose fast path needs half-precision activations).
_FLOAT_PRODUCTS = (ops.MatMul, ops.Conv, ops.Attention, ops.Int4MatMul)
# The tensors the walk back from a quantization passes: float values, and the bools that
# comparisons of float values make (a flipped comparison flips a code as surely).
_WALKED = frozenset({DType.F32, DType.BOOL})


@dataclasses.dataclass(frozen=True)
class QuantizedRegion:
    """The kernels and tensors of a program that keep f32 under fp16 or bf16.

    Attributes:
        kernels: Indices in `Program.kernels` of the kernels that compute in f32.
        tensors: Ids of the f32 tensors stored in f32; views of them follow them.
    """

    kernels: frozenset[int] = frozenset()
    tensors: frozenset[int] = frozenset()


def _rounds(expr: Expr | None) -> bool:
    if expr is None:
        return False
    if isinstance(expr, UnaryE) and expr.kind is Unary.ROUND:
        return True
    return any(_rounds(child) for child in expr_children(expr))


def quantizes(kernel: Kernel) -> bool:
    """Whether `kernel` rounds half to even, as QuantizeLinear does before its clamp and cast."""
    if isinstance(kernel.op, ops.UnaryOp) and kernel.op.kind is Unary.ROUND:
        return True
    return any(_rounds(e) for e in (kernel.body, kernel.prologue, kernel.epilogue))


def _view_roots(program: Program) -> list[int]:
    """For each tensor, the tensor whose buffer it views (itself where it is no view)."""
    roots = list(range(len(program.tensors)))
    for kernel in program.kernels:
        if kernel.is_view:
            roots[kernel.output] = roots[kernel.inputs[0]]
    return roots


def _rounded_work(program: Program, roots: list[int], producers: dict[int, int]) -> set[int]:
    """The quantizing kernels and, walking back through float and bool tensors, their producers."""
    todo = [i for i, k in enumerate(program.kernels) if not k.is_view and quantizes(k)]
    kernels: set[int] = set()
    while todo:
        index = todo.pop()
        if index in kernels or isinstance(program.kernels[index].op, _FLOAT_PRODUCTS):
            continue
        kernels.add(index)
        for tid in program.kernels[index].inputs:
            source = roots[tid]
            producer = producers.get(source)
            if producer is not None and program.tensors[source].type.dtype in _WALKED:
                todo.append(producer)
    return kernels


def quantized_region(program: Program) -> QuantizedRegion:
    """The quantizing kernels and the float work they round, as the module docstring says.

    Kernels that read the region's results and write no float tensor (the casts of rounded
    values to their integer type, NaN tests) join it too: their result is the same in either
    precision, and reading f32 they need no cast kernel of their input.
    """
    roots = _view_roots(program)
    producers = {k.output: i for i, k in enumerate(program.kernels) if not k.is_view}
    kernels = _rounded_work(program, roots, producers)
    written = {roots[program.kernels[i].output] for i in kernels}
    kernels |= {
        index
        for index, kernel in enumerate(program.kernels)
        if not kernel.is_view
        and not program.tensors[kernel.output].type.dtype.is_float
        and any(roots[t] in written for t in kernel.inputs)
    }
    tensors = {
        roots[tid]
        for index in kernels
        for tid in (*program.kernels[index].inputs, program.kernels[index].output)
        if program.tensors[roots[tid]].type.dtype is DType.F32
        and producers.get(roots[tid], index) in kernels  # not a float product's result
    }
    tensors -= _narrow_stores(program, roots, kernels)
    return QuantizedRegion(frozenset(kernels), frozenset(tensors))


def _stores_narrow(kernel: Kernel) -> bool:
    """Whether `kernel`, computing in f32, can round its result to f16 as it stores it."""
    return kernel.epilogue is not None or (
        kernel.kind == KernelKind.ELEMENTWISE and kernel.body is not None
    )


def _narrow_stores(program: Program, roots: list[int], kernels: set[int]) -> set[int]:
    """The region's results that only kernels outside it read: those are stored narrow.

    A kernel outside the region computes in the narrow type: it would round an f32 tensor
    as it loads it, or read it through a cast kernel. Rounded once at the store instead (its
    writer computes in f32 all the same, so codes are untouched), it needs neither. Program
    outputs keep f32, as do results whose writer has no epilogue or body to round them in.
    """
    kept = {roots[t] for i in kernels for t in program.kernels[i].inputs}
    kept |= {roots[t] for t in program.outputs}
    return {
        program.kernels[i].output
        for i in kernels
        if program.tensors[program.kernels[i].output].type.dtype is DType.F32
        and _stores_narrow(program.kernels[i])
        and program.kernels[i].output not in kept
    }


# ---- narrowing ------------------------------------------------------------------------------


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


def _operand_count(kernel: Kernel) -> int:
    """How many leading inputs the kernel's main op reads as tensors (as the CPU executor does)."""
    if kernel.kind == KernelKind.ELEMENTWISE or kernel.prologue is not None:
        return 0
    assert kernel.op is not None
    return kernel.op.arity if kernel.op.arity is not None else len(kernel.inputs)


class _Narrowing:
    """The narrowed program under construction: its tensors, kernels and cast copies."""

    def __init__(self, program: Program, target: DType, region: QuantizedRegion) -> None:
        self.program = program
        self.target = target
        self.region = region
        roots = _view_roots(program)
        inputs = set(program.inputs)  # f32 at the edge; those that narrow get a cast copy
        self.tensors = [
            t
            if roots[t.id] in region.tensors or t.id in inputs
            else Tensor(t.id, TensorType(t.type.shape, _retype(t.type.dtype, target)), t.role)
            for t in program.tensors
        ]
        self.kernels: list[Kernel] = []
        self.copies: dict[tuple[int, DType], int] = {}

    def dtype(self, tid: int) -> DType:
        """The type tensor `tid` is stored in."""
        return self.tensors[tid].type.dtype

    def differs(self, tid: int, compute: DType) -> bool:
        """Whether `tid`, f32 in the program (or a copy of such), is stored unlike `compute`."""
        if tid < len(self.program.tensors) and self.program.tensors[tid].type.dtype != DType.F32:
            return False
        return self.dtype(tid) != compute

    def copy(self, tid: int, dtype: DType) -> int:
        """Tensor `tid` converted to `dtype` by a cast kernel (one per tensor and type)."""
        if (tid, dtype) not in self.copies:
            new = len(self.tensors)
            self.tensors.append(
                Tensor(new, TensorType(self.tensors[tid].type.shape, dtype), "intermediate")
            )
            self.kernels.append(Kernel("Cast", ops.Cast(dtype), (tid,), new))
            self.copies[tid, dtype] = new
        return self.copies[tid, dtype]

    def body(self, expr: Expr | None, compute: DType, inputs: tuple[int, ...]) -> Expr | None:
        """`expr` computing in `compute`, converting the loads stored in the other type."""
        if expr is None:
            return None
        if compute is not DType.F32:
            expr = _expr(expr, compute)
        assert expr is not None

        def load(leaf: Expr) -> Expr:
            if isinstance(leaf, Load) and self.differs(inputs[leaf.index], compute):
                return CastE(leaf, compute)
            return leaf

        return map_leaves(expr, load)

    def add(self, index: int, kernel: Kernel, inputs: tuple[int, ...]) -> None:
        """Append `kernel` (reading `inputs`, the edge copies of program inputs) narrowed."""
        if kernel.is_view:
            self.kernels.append(dataclasses.replace(kernel, inputs=inputs))
            return
        compute = DType.F32 if index in self.region.kernels else self.target
        operands = _operand_count(kernel)
        inputs = tuple(
            self.copy(t, compute) if i < operands and self.differs(t, compute) else t
            for i, t in enumerate(inputs)
        )
        final = DType.F32 if KernelKind.of_name(kernel.kind) in _F32_EPILOGUES else compute
        epilogue = self.body(kernel.epilogue, final, inputs)
        if epilogue is not None and self.differs(kernel.output, final):
            epilogue = CastE(epilogue, self.dtype(kernel.output))
        body = self.body(kernel.body, compute, inputs)
        if (
            kernel.kind == KernelKind.ELEMENTWISE
            and body is not None
            and epilogue is None
            and self.differs(kernel.output, compute)
        ):
            body = CastE(body, self.dtype(kernel.output))  # the region's result, stored narrow
        narrowed = dataclasses.replace(
            kernel,
            op=kernel.op if compute is DType.F32 else _op(kernel.op, compute),
            inputs=inputs,
            body=body,
            prologue=self.body(kernel.prologue, compute, inputs),
            epilogue=epilogue,
        )
        self.kernels.append(_alias_if_identity(narrowed, self.tensors))


def narrow_program(
    program: Program, target: DType, region: QuantizedRegion | None = None
) -> Program:
    """A copy of `program` computing in `target` where it computed in f32.

    Args:
        program: The program, with f32 inputs and outputs.
        target: The narrow type, F16 or BF16.
        region: What keeps f32 (by default `quantized_region(program)`).
    """
    region = quantized_region(program) if region is None else region
    narrowing = _Narrowing(program, target, region)
    renamed: dict[int, int] = {}
    for tid in program.inputs:
        if narrowing.differs(tid, target) and tid not in region.tensors:
            renamed[tid] = narrowing.copy(tid, target)
    for index, kernel in enumerate(program.kernels):
        narrowing.add(index, kernel, tuple(renamed.get(t, t) for t in kernel.inputs))
    tensors = narrowing.tensors
    outputs = []
    for tid in program.outputs:
        source = renamed.get(tid, tid)
        if not narrowing.differs(source, DType.F32):
            outputs.append(source)
            continue
        wide = len(tensors)
        tensors.append(Tensor(wide, program.tensors[tid].type, "output"))
        narrowing.kernels.append(Kernel("Cast", ops.Cast(DType.F32), (source,), wide))
        if tensors[source].role == "output":
            tensors[source] = dataclasses.replace(tensors[source], role="intermediate")
        outputs.append(wide)
    return Program(
        tensors,
        narrowing.kernels,
        list(program.inputs),
        list(program.input_names),
        outputs,
        list(program.output_names),
        {
            tid: array if tid in region.tensors else _narrow_array(np.asarray(array), target)
            for tid, array in program.constants.items()
        },
        program.name,
    )
