"""Kernel kinds: the fused kernels that extraction may choose, declared once.

A fused kernel computes one main IR op (or none) with elementwise scalar bodies fused around
it. Every table that treats kernels by kind derives from `KernelKind`: the kernel term of
rules/schema.egg (the kind's `constructor`), the op it computes (`main_op`), and how that op
reads its operand (`has_prologue`). A kernel term's arguments are its main op's term
arguments, with the operand a prologue computes written as that prologue, and the epilogue
last: `(Reduce kind x axes out)` fuses as `(KReduce kind prologue axes out epilogue)`.
"""

from __future__ import annotations

import enum

from knopt.ir import op as ops


class KernelKind(enum.StrEnum):
    """A kind of fused kernel; its value is its name in Programs and reports.

    Attributes:
        constructor: The kernel term's constructor in rules/schema.egg.
        main_op: The IR op the kernel computes, or None for an elementwise body alone.
        has_prologue: Whether a scalar prologue computes the main op's operand from the
            kernel's inputs (reductions, softmax, norms); otherwise the main op reads its
            operands as tensors (what cuBLASLt and cuDNN take).
    """

    constructor: str
    main_op: type[ops.Op] | None
    has_prologue: bool

    def __new__(
        cls, value: str, constructor: str, main_op: type[ops.Op] | None, has_prologue: bool
    ) -> KernelKind:
        """A member whose value is `value`, with its other attributes set."""
        member = str.__new__(cls, value)
        member._value_ = value
        member.constructor = constructor
        member.main_op = main_op
        member.has_prologue = has_prologue
        return member

    ELEMENTWISE = "elementwise", "KElem", None, False
    REDUCE = "reduce", "KReduce", ops.Reduce, True
    SOFTMAX = "softmax", "KSoftmax", ops.Softmax, True
    LAYER_NORM = "layer_norm", "KLayerNorm", ops.LayerNorm, True
    RMS_NORM = "rms_norm", "KRmsNorm", ops.RmsNorm, True
    MATMUL = "matmul", "KMatMul", ops.MatMul, False
    CONV = "conv", "KConv", ops.Conv, False
    INT_MATMUL = "int_matmul", "KIntMatMul", ops.IntMatMul, False
    INT_CONV = "int_conv", "KIntConv", ops.IntConv, False
    INT4_MATMUL = "int4_matmul", "KInt4MatMul", ops.Int4MatMul, False

    @classmethod
    def of_name(cls, name: str) -> KernelKind | None:
        """The kind called `name` in Programs, or None if `name` is no fused kind."""
        return _BY_NAME.get(name)

    @classmethod
    def of_constructor(cls, name: str) -> KernelKind | None:
        """The kind whose kernel term is `name`, or None if `name` is no kernel term."""
        return _BY_CONSTRUCTOR.get(name)

    @classmethod
    def of_main_op(cls, op_type: type[ops.Op]) -> KernelKind | None:
        """The kind that fuses around ops of `op_type`, or None if no kind does."""
        return _BY_MAIN_OP.get(op_type)


_BY_NAME = {kind.value: kind for kind in KernelKind}
_BY_CONSTRUCTOR = {kind.constructor: kind for kind in KernelKind}
_BY_MAIN_OP = {kind.main_op: kind for kind in KernelKind if kind.main_op is not None}
# The kernel terms' constructors (rules/schema.egg).
KERNEL_CONSTRUCTORS = frozenset(_BY_CONSTRUCTOR)
# The main ops of fused kinds: ops whose kernels take a prologue and an epilogue.
FUSED_MAIN_OPS: frozenset[type[ops.Op]] = frozenset(_BY_MAIN_OP)
