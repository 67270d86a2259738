"""The IR's operations: small, orthogonal, declared once.

Each operation is a frozen dataclass whose fields are its attributes, so an op is hashable and
two nodes with equal ops and inputs are the same computation. `infer` gives the result type from
the input types and is the single definition of each op's typing rules; every interpretation
(the CPU executor, the e-graph schema, the cost model, ONNX export, CUDA codegen) keeps its own
table keyed by op class or kind, and tests prove each table complete.

Conventions that keep the op set small:
- Binary and Where take operands of equal shape; broadcasting is an explicit `Broadcast`.
- Reductions keep the reduced axes (as size 1); dropping them is a `View`.
- Conv and MatMul have no bias; a bias is its own `Binary` add.
- Every op has exactly one result.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from knopt.errors import InvalidGraphError
from knopt.ir.dtype import DType
from knopt.ir.shape import Dim, Shape, exact_div, format_shape, numel


@dataclass(frozen=True)
class TensorType:
    """The static type of a value: its shape and element type."""

    shape: Shape
    dtype: DType

    @property
    def rank(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    def __str__(self) -> str:
        return f"{self.dtype.short}{format_shape(self.shape)}"


# ---- kinds -------------------------------------------------------------------------------


class Unary(enum.Enum):
    """Elementwise one-input functions. Member names match schema.egg constructors."""

    NEG = enum.auto()
    ABS = enum.auto()
    SIGN = enum.auto()
    EXP = enum.auto()
    LOG = enum.auto()
    SQRT = enum.auto()
    RSQRT = enum.auto()
    RECIPROCAL = enum.auto()
    SIN = enum.auto()
    COS = enum.auto()
    TAN = enum.auto()
    ASIN = enum.auto()
    ACOS = enum.auto()
    ATAN = enum.auto()
    SINH = enum.auto()
    COSH = enum.auto()
    ASINH = enum.auto()
    ACOSH = enum.auto()
    ATANH = enum.auto()
    TANH = enum.auto()
    ERF = enum.auto()
    FLOOR = enum.auto()
    CEIL = enum.auto()
    ROUND = enum.auto()  # half to even, as ONNX Round
    RELU = enum.auto()
    SIGMOID = enum.auto()
    SOFTPLUS = enum.auto()
    GELU = enum.auto()  # exact: x * (1 + erf(x / sqrt 2)) / 2
    GELU_TANH = enum.auto()  # the tanh approximation
    SILU = enum.auto()  # x * sigmoid(x)
    HARD_SIGMOID = enum.auto()  # clamp(x / 6 + 1/2, 0, 1)
    HARD_SWISH = enum.auto()  # x * hard_sigmoid(x)
    NOT = enum.auto()  # logical not of bool
    BITWISE_NOT = enum.auto()
    IS_NAN = enum.auto()
    IS_INF = enum.auto()


class Binary(enum.Enum):
    """Elementwise two-input functions on operands of equal shape."""

    ADD = enum.auto()
    SUB = enum.auto()
    MUL = enum.auto()
    DIV = enum.auto()  # integer division truncates toward zero, as ONNX Div
    POW = enum.auto()
    MIN = enum.auto()
    MAX = enum.auto()
    MOD = enum.auto()  # sign of the divisor (Python %), ONNX Mod fmod=0
    FMOD = enum.auto()  # sign of the dividend (C fmod), ONNX Mod fmod=1
    EQUAL = enum.auto()
    LESS = enum.auto()
    LESS_EQUAL = enum.auto()
    GREATER = enum.auto()
    GREATER_EQUAL = enum.auto()
    AND = enum.auto()
    OR = enum.auto()
    XOR = enum.auto()
    BITWISE_AND = enum.auto()
    BITWISE_OR = enum.auto()
    BITWISE_XOR = enum.auto()
    SHIFT_LEFT = enum.auto()
    SHIFT_RIGHT = enum.auto()


class Reduction(enum.Enum):
    """How `Reduce` combines elements."""

    SUM = enum.auto()
    PROD = enum.auto()
    MAX = enum.auto()
    MIN = enum.auto()


class PadMode(enum.Enum):
    """How `Pad` fills the border."""

    CONSTANT = enum.auto()
    REFLECT = enum.auto()
    EDGE = enum.auto()
    WRAP = enum.auto()


class PoolKind(enum.Enum):
    """What a pooling window computes."""

    MAX = enum.auto()
    AVG = enum.auto()


class ScatterReduction(enum.Enum):
    """How `Scatter` combines an update with the value it lands on."""

    NONE = enum.auto()
    ADD = enum.auto()
    MUL = enum.auto()
    MAX = enum.auto()
    MIN = enum.auto()


COMPARISONS = frozenset(
    {
        Binary.EQUAL,
        Binary.LESS,
        Binary.LESS_EQUAL,
        Binary.GREATER,
        Binary.GREATER_EQUAL,
    }
)
LOGICAL = frozenset({Binary.AND, Binary.OR, Binary.XOR})
BITWISE = frozenset(
    {
        Binary.BITWISE_AND,
        Binary.BITWISE_OR,
        Binary.BITWISE_XOR,
        Binary.SHIFT_LEFT,
        Binary.SHIFT_RIGHT,
    }
)
UNARY_TO_BOOL = frozenset({Unary.IS_NAN, Unary.IS_INF})
UNARY_FLOAT_ONLY = frozenset(
    {
        Unary.EXP,
        Unary.LOG,
        Unary.SQRT,
        Unary.RSQRT,
        Unary.SIN,
        Unary.COS,
        Unary.TAN,
        Unary.ASIN,
        Unary.ACOS,
        Unary.ATAN,
        Unary.SINH,
        Unary.COSH,
        Unary.ASINH,
        Unary.ACOSH,
        Unary.ATANH,
        Unary.TANH,
        Unary.ERF,
        Unary.SIGMOID,
        Unary.SOFTPLUS,
        Unary.GELU,
        Unary.GELU_TANH,
        Unary.SILU,
        Unary.HARD_SIGMOID,
        Unary.HARD_SWISH,
        Unary.IS_NAN,
        Unary.IS_INF,
        Unary.ROUND,
        Unary.FLOOR,
        Unary.CEIL,
    }
)


# ---- constants ---------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ConstData:
    """An immutable array compared and hashed by content (dtype, shape and bytes)."""

    array: np.ndarray
    digest: str = field(init=False)

    def __post_init__(self) -> None:
        array = np.asarray(self.array)
        if not array.flags.c_contiguous:
            array = array.copy(order="C")
        array.flags.writeable = False
        object.__setattr__(self, "array", array)
        h = hashlib.blake2b(digest_size=16)
        h.update(f"{array.dtype.str}{array.shape}".encode())
        h.update(array.tobytes())
        object.__setattr__(self, "digest", h.hexdigest())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ConstData) and other.digest == self.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def __repr__(self) -> str:
        return f"ConstData({self.array.dtype}{list(self.array.shape)} #{self.digest[:8]})"

    def splat_value(self) -> float | int | bool | None:
        """The single value every element holds, or None if elements differ (or none exist)."""
        flat = self.array.reshape(-1)
        if flat.size == 0:
            return None
        first = flat[0]
        same = flat != flat if first != first else flat == first  # a NaN splat is a splat too
        return first.item() if bool(np.all(same)) else None


# ---- the ops -----------------------------------------------------------------------------


class Op:
    """Base of every op. Subclasses are frozen dataclasses; their fields are the attributes."""

    arity: ClassVar[int | None] = 1  # None: variadic

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        """The result type for these input types.

        Raises:
            InvalidGraphError: If the inputs do not fit this op.
        """
        raise NotImplementedError

    @property
    def name(self) -> str:
        """The op's name, as in dumps and in schema.egg."""
        return type(self).__name__


def _fail(where: str, message: str) -> InvalidGraphError:
    return InvalidGraphError(f"{where}: {message}")


def _same_dtype(inputs: Sequence[TensorType], where: str) -> DType:
    dtypes = {t.dtype for t in inputs}
    if len(dtypes) != 1:
        names = ", ".join(sorted(d.short for d in dtypes))
        raise _fail(where, f"operands have different element types ({names})")
    return inputs[0].dtype


def _same_shape(inputs: Sequence[TensorType], where: str) -> Shape:
    shapes = {t.shape for t in inputs}
    if len(shapes) != 1:
        text = " vs ".join(format_shape(t.shape) for t in inputs)
        raise _fail(where, f"operands must have equal shapes, got {text} (broadcast first)")
    return inputs[0].shape


def _check_axis(axis: int, rank: int, where: str) -> None:
    if not 0 <= axis < rank:
        raise _fail(where, f"axis {axis} is out of range for rank {rank}")


@dataclass(frozen=True)
class Input(Op):
    """A graph input called `name`."""

    arity: ClassVar[int | None] = 0
    input_name: str
    tensor_type: TensorType

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        return self.tensor_type


@dataclass(frozen=True)
class Constant(Op):
    """A constant tensor."""

    arity: ClassVar[int | None] = 0
    data: ConstData

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        return TensorType(tuple(self.data.array.shape), DType.from_numpy(self.data.array.dtype))


@dataclass(frozen=True)
class Iota(Op):
    """The integers `0, 1, ..., length - 1`, a 1-D tensor whose length may be symbolic."""

    arity: ClassVar[int | None] = 0
    length: Dim
    dtype: DType

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        return TensorType((self.length,), self.dtype)


@dataclass(frozen=True)
class Sizes(Op):
    """A 1-D tensor holding the sizes `dims` (which may be symbolic) as values."""

    arity: ClassVar[int | None] = 0
    dims: tuple[Dim, ...]
    dtype: DType = DType.I64

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        if not self.dtype.is_int:
            raise _fail(where, f"sizes must be an integer tensor, not {self.dtype.short}")
        return TensorType((len(self.dims),), self.dtype)


@dataclass(frozen=True)
class View(Op):
    """Reshape to `shape` (same number of elements, row-major order)."""

    shape: Shape

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        (x,) = inputs
        if numel(x.shape) != numel(self.shape):
            raise _fail(
                where,
                f"cannot view {format_shape(x.shape)} as {format_shape(self.shape)} "
                "(element counts differ)",
            )
        return TensorType(self.shape, x.dtype)


@dataclass(frozen=True)
class Broadcast(Op):
    """Repeat size-1 axes up to `shape` (same rank as the input)."""

    shape: Shape

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        (x,) = inputs
        if len(x.shape) != len(self.shape) or any(
            d != 1 and d != s for d, s in zip(x.shape, self.shape, strict=True)
        ):
            raise _fail(
                where, f"cannot broadcast {format_shape(x.shape)} to {format_shape(self.shape)}"
            )
        return TensorType(self.shape, x.dtype)


@dataclass(frozen=True)
class Permute(Op):
    """Reorder axes: output axis i is input axis `perm[i]`."""

    perm: tuple[int, ...]

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        (x,) = inputs
        if sorted(self.perm) != list(range(x.rank)):
            raise _fail(where, f"permutation {list(self.perm)} does not fit rank {x.rank}")
        return TensorType(tuple(x.shape[p] for p in self.perm), x.dtype)


@dataclass(frozen=True)
class Slice(Op):
    """Elements `start, start + step, ...` below `stop` along `axis` (0 <= start <= stop)."""

    axis: int
    start: Dim
    stop: Dim
    step: int = 1

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        (x,) = inputs
        _check_axis(self.axis, x.rank, where)
        if self.step < 1:
            raise _fail(where, f"slice step must be positive, got {self.step}")
        dim = x.shape[self.axis]
        if isinstance(self.start, int) and self.start < 0:
            raise _fail(where, f"slice start {self.start} is negative")
        if isinstance(dim, int) and isinstance(self.stop, int) and self.stop > dim:
            raise _fail(where, f"slice stop {self.stop} is beyond dimension {dim}")
        length = self.stop - self.start
        if isinstance(length, int):
            size: Dim = max(0, -(-length // self.step))
        else:
            size = exact_div(length + (self.step - 1), self.step)
        shape = list(x.shape)
        shape[self.axis] = size
        return TensorType(tuple(shape), x.dtype)


@dataclass(frozen=True)
class Flip(Op):
    """Reverse the order of elements along `axis`."""

    axis: int

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        (x,) = inputs
        _check_axis(self.axis, x.rank, where)
        return x


@dataclass(frozen=True)
class Pad(Op):
    """Grow each axis by `pads[i] = (before, after)` elements (never negative)."""

    pads: tuple[tuple[int, int], ...]
    mode: PadMode = PadMode.CONSTANT
    value: float = 0.0

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        (x,) = inputs
        if len(self.pads) != x.rank or any(b < 0 or a < 0 for b, a in self.pads):
            raise _fail(where, f"pads {list(self.pads)} do not fit rank {x.rank}")
        shape = tuple(d + b + a for d, (b, a) in zip(x.shape, self.pads, strict=True))
        return TensorType(shape, x.dtype)


@dataclass(frozen=True)
class Concat(Op):
    """Join inputs along `axis`; all other dimensions must agree."""

    arity: ClassVar[int | None] = None
    axis: int

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        if not inputs:
            raise _fail(where, "concat needs at least one input")
        dtype = _same_dtype(inputs, where)
        first = inputs[0]
        _check_axis(self.axis, first.rank, where)
        total: Dim = 0
        for t in inputs:
            rest = [d for i, d in enumerate(t.shape) if i != self.axis]
            if t.rank != first.rank or rest != [
                d for i, d in enumerate(first.shape) if i != self.axis
            ]:
                raise _fail(
                    where,
                    f"cannot concat {format_shape(t.shape)} with {format_shape(first.shape)} "
                    f"on axis {self.axis}",
                )
            total = total + t.shape[self.axis]
        shape = list(first.shape)
        shape[self.axis] = total
        return TensorType(tuple(shape), dtype)


@dataclass(frozen=True)
class Gather(Op):
    """`x.take(indices, axis)`: indices of any shape replace axis `axis` (negatives wrap once)."""

    arity: ClassVar[int | None] = 2
    axis: int

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        x, indices = inputs
        _check_axis(self.axis, x.rank, where)
        if not indices.dtype.is_int:
            raise _fail(where, f"gather indices must be integers, got {indices.dtype.short}")
        shape = x.shape[: self.axis] + indices.shape + x.shape[self.axis + 1 :]
        return TensorType(shape, x.dtype)


@dataclass(frozen=True)
class Scatter(Op):
    """ONNX ScatterElements: a copy of `data` with `updates` written at `indices` on `axis`."""

    arity: ClassVar[int | None] = 3
    axis: int
    reduction: ScatterReduction = ScatterReduction.NONE

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        data, indices, updates = inputs
        _check_axis(self.axis, data.rank, where)
        if indices.shape != updates.shape or indices.rank != data.rank:
            raise _fail(where, "scatter indices and updates must have equal shapes of data's rank")
        if not indices.dtype.is_int or updates.dtype != data.dtype:
            raise _fail(where, "scatter needs integer indices and updates of data's type")
        return data


@dataclass(frozen=True)
class Cast(Op):
    """Convert elements to `dtype` (floats to ints truncate; to bool is `!= 0`)."""

    dtype: DType

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        (x,) = inputs
        return TensorType(x.shape, self.dtype)


@dataclass(frozen=True)
class UnaryOp(Op):
    """An elementwise function of one operand."""

    kind: Unary

    @property
    def name(self) -> str:
        """The kind's name, as in dumps."""
        return self.kind.name

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        (x,) = inputs
        if self.kind in UNARY_FLOAT_ONLY and not x.dtype.is_float:
            raise _fail(where, f"{self.kind.name} needs a float operand, got {x.dtype.short}")
        if self.kind is Unary.NOT and x.dtype is not DType.BOOL:
            raise _fail(where, f"NOT needs a bool operand, got {x.dtype.short}")
        if self.kind is Unary.BITWISE_NOT and not x.dtype.is_int:
            raise _fail(where, f"BITWISE_NOT needs an integer operand, got {x.dtype.short}")
        if self.kind in UNARY_TO_BOOL:
            return TensorType(x.shape, DType.BOOL)
        return x


@dataclass(frozen=True)
class BinaryOp(Op):
    """An elementwise function of two operands of equal shape and type."""

    arity: ClassVar[int | None] = 2
    kind: Binary

    @property
    def name(self) -> str:
        """The kind's name, as in dumps."""
        return self.kind.name

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        shape = _same_shape(inputs, where)
        # ONNX Pow allows a differently typed exponent.
        dtype = inputs[0].dtype if self.kind is Binary.POW else _same_dtype(inputs, where)
        if self.kind in LOGICAL and dtype is not DType.BOOL:
            raise _fail(where, f"{self.kind.name} needs bool operands, got {dtype.short}")
        if self.kind in BITWISE and not dtype.is_int:
            raise _fail(where, f"{self.kind.name} needs integer operands, got {dtype.short}")
        if self.kind in COMPARISONS:
            return TensorType(shape, DType.BOOL)
        return TensorType(shape, dtype)


@dataclass(frozen=True)
class Clamp(Op):
    """Elementwise `min(max(x, lo), hi)`; either bound may be infinite."""

    lo: float
    hi: float

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        (x,) = inputs
        if x.dtype is DType.BOOL:
            raise _fail(where, "clamp needs a numeric operand, got bool")
        return x


@dataclass(frozen=True)
class Where(Op):
    """`x` where `condition` holds, else `y`; all three of equal shape."""

    arity: ClassVar[int | None] = 3

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        condition, x, y = inputs
        shape = _same_shape(inputs, where)
        if condition.dtype is not DType.BOOL:
            raise _fail(where, f"where needs a bool condition, got {condition.dtype.short}")
        return TensorType(shape, _same_dtype([x, y], where))


@dataclass(frozen=True)
class Reduce(Op):
    """Combine elements over `axes`, which stay in the result with size 1."""

    kind: Reduction
    axes: tuple[int, ...]

    @property
    def name(self) -> str:
        """REDUCE_SUM and so on, as in dumps."""
        return f"REDUCE_{self.kind.name}"

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        (x,) = inputs
        if len(set(self.axes)) != len(self.axes) or list(self.axes) != sorted(self.axes):
            raise _fail(where, f"reduce axes {list(self.axes)} must be sorted and distinct")
        for axis in self.axes:
            _check_axis(axis, x.rank, where)
        shape = tuple(1 if i in self.axes else d for i, d in enumerate(x.shape))
        return TensorType(shape, x.dtype)


@dataclass(frozen=True)
class ArgReduce(Op):
    """Index (int64) of the largest (or smallest) element along `axis`, which stays as size 1.

    Ties go to the first index, or to the last one when `last` is set.
    """

    axis: int
    largest: bool = True
    last: bool = False

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        (x,) = inputs
        _check_axis(self.axis, x.rank, where)
        shape = tuple(1 if i == self.axis else d for i, d in enumerate(x.shape))
        return TensorType(shape, DType.I64)


@dataclass(frozen=True)
class ArgSort(Op):
    """Indices (int64) that sort `axis` in ascending (or descending) order; ties keep order."""

    axis: int
    descending: bool = False

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        (x,) = inputs
        _check_axis(self.axis, x.rank, where)
        return TensorType(x.shape, DType.I64)


@dataclass(frozen=True)
class CumSum(Op):
    """Running sums along `axis`, optionally exclusive (shifted by one) or from the end."""

    axis: int
    exclusive: bool = False
    reverse: bool = False

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        (x,) = inputs
        _check_axis(self.axis, x.rank, where)
        return x


@dataclass(frozen=True)
class MatMul(Op):
    """Batched matrix product `[..., m, k] @ [..., k, n]` with equal batch dimensions."""

    arity: ClassVar[int | None] = 2

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        a, b = inputs
        dtype = _same_dtype(inputs, where)
        return TensorType(_matmul_shape(a, b, where), dtype)


def _matmul_shape(a: TensorType, b: TensorType, where: str) -> Shape:
    """The shape of `a @ b` (equal batch dimensions), checking that they fit."""
    if a.rank < 2 or a.rank != b.rank or a.shape[:-2] != b.shape[:-2]:
        raise _fail(
            where,
            f"matmul needs equal batch dims and rank >= 2, got {format_shape(a.shape)} "
            f"@ {format_shape(b.shape)}",
        )
    if a.shape[-1] != b.shape[-2]:
        raise _fail(
            where,
            f"matmul inner dimensions differ: {format_shape(a.shape)} @ {format_shape(b.shape)}",
        )
    return a.shape[:-1] + b.shape[-1:]


def _window_size(
    size: Dim,
    kernel: int,
    stride: int,
    pad: tuple[int, int],
    dilation: int,
    ceil: bool,
    where: str,
) -> Dim:
    if kernel < 1 or stride < 1 or dilation < 1 or min(pad) < 0:
        raise _fail(
            where,
            f"window of kernel {kernel}, stride {stride}, dilation {dilation} and pads "
            f"{list(pad)} is not positive",
        )
    span = size + pad[0] + pad[1] - (dilation * (kernel - 1) + 1)
    if isinstance(span, int):
        if span < 0:
            return 0
        out = -(-span // stride) if ceil else span // stride
        if ceil and isinstance(size, int) and out * stride >= size + pad[0]:
            out -= 1  # the last window must start inside the input or the leading padding
        return out + 1
    return exact_div(span, stride) + 1


@dataclass(frozen=True)
class Conv(Op):
    """N-d cross-correlation of `x [N, C, *spatial]` with `w [M, C / groups, *kernel]`."""

    arity: ClassVar[int | None] = 2
    strides: tuple[int, ...]
    pads: tuple[tuple[int, int], ...]
    dilations: tuple[int, ...]
    groups: int = 1

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        x, w = inputs
        dtype = _same_dtype(inputs, where)
        return TensorType(_conv_shape(self, x, w, where), dtype)


def _conv_shape(op: Conv | IntConv, x: TensorType, w: TensorType, where: str) -> Shape:
    """The result shape of a convolution of `x` with `w`, checking that they fit."""
    spatial = x.rank - 2
    if spatial < 1 or w.rank != x.rank:
        raise _fail(where, f"conv needs x and w of equal rank >= 3, got {x} and {w}")
    if not len(op.strides) == len(op.pads) == len(op.dilations) == spatial:
        raise _fail(where, "conv strides, pads and dilations must have one entry per axis")
    if x.shape[1] != w.shape[1] * op.groups or not _divides(op.groups, w.shape[0]):
        raise _fail(where, f"conv channels do not fit: x {x}, w {w}, groups {op.groups}")
    dims = []
    for i in range(spatial):
        k = w.shape[2 + i]
        if not isinstance(k, int):
            raise _fail(where, "conv kernel sizes must be static")
        dims.append(
            _window_size(
                x.shape[2 + i], k, op.strides[i], op.pads[i], op.dilations[i], False, where
            )
        )
    return (x.shape[0], w.shape[0], *dims)


def _divides(a: int, b: Dim) -> bool:
    return (isinstance(b, int) and b % a == 0) or (not isinstance(b, int) and a == 1)


@dataclass(frozen=True)
class Pool(Op):
    """Max or average over sliding windows of the spatial axes of `x [N, C, *spatial]`.

    Padding never wins a max; `count_include_pad` says whether it counts in an average.
    With `ceil_mode` a partial last window is kept.
    """

    kind: PoolKind
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    pads: tuple[tuple[int, int], ...]
    dilations: tuple[int, ...]
    ceil_mode: bool = False
    count_include_pad: bool = False

    @property
    def name(self) -> str:
        """MAX_POOL or AVG_POOL, as in dumps."""
        return f"{self.kind.name}_POOL"

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        (x,) = inputs
        spatial = x.rank - 2
        if spatial < 1 or not (
            len(self.kernel)
            == len(self.strides)
            == len(self.pads)
            == len(self.dilations)
            == spatial
        ):
            raise _fail(where, f"pool attributes do not fit input {x}")
        dims = [
            _window_size(
                x.shape[2 + i],
                self.kernel[i],
                self.strides[i],
                self.pads[i],
                self.dilations[i],
                self.ceil_mode,
                where,
            )
            for i in range(spatial)
        ]
        return TensorType((*x.shape[:2], *dims), x.dtype)


@dataclass(frozen=True)
class Softmax(Op):
    """`exp(x) / sum(exp(x))` along `axis` (computed stably)."""

    axis: int

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        (x,) = inputs
        _check_axis(self.axis, x.rank, where)
        if not x.dtype.is_float:
            raise _fail(where, f"softmax needs a float operand, got {x.dtype.short}")
        return x


@dataclass(frozen=True)
class LayerNorm(Op):
    """`(x - mean) / sqrt(var + eps)` over the axes from `axis` to the last; no scale or bias."""

    axis: int
    eps: float

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        (x,) = inputs
        _check_axis(self.axis, x.rank, where)
        if not x.dtype.is_float:
            raise _fail(where, f"layernorm needs a float operand, got {x.dtype.short}")
        return x


@dataclass(frozen=True)
class RmsNorm(Op):
    """`x / sqrt(mean(x^2) + eps)` over the axes from `axis` to the last; no scale."""

    axis: int
    eps: float

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        (x,) = inputs
        _check_axis(self.axis, x.rank, where)
        if not x.dtype.is_float:
            raise _fail(where, f"rmsnorm needs a float operand, got {x.dtype.short}")
        return x


@dataclass(frozen=True)
class Attention(Op):
    """Scaled dot-product attention: `softmax(q @ k^T * scale + bias) @ v` over the last axes.

    Inputs q `[..., s, d]`, k `[..., t, d]`, v `[..., t, e]` and an additive bias `[..., s, t]`
    (a mask: 0 where a key may be attended, very negative where not), all with equal leading
    dimensions. Kernels never materialize the `[s, t]` scores when they can avoid it.
    """

    arity: ClassVar[int | None] = 4
    scale: float

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        q, k, v, bias = inputs
        dtype = _same_dtype(inputs, where)
        if not dtype.is_float:
            raise _fail(where, f"attention needs float operands, got {dtype.short}")
        rank = q.rank
        if rank < 2 or not k.rank == v.rank == bias.rank == rank:
            raise _fail(where, "attention operands must have equal ranks >= 2")
        lead = q.shape[:-2]
        if k.shape[:-2] != lead or v.shape[:-2] != lead or bias.shape[:-2] != lead:
            raise _fail(where, "attention operands must have equal leading dimensions")
        s, d = q.shape[-2:]
        t = k.shape[-2]
        if k.shape[-1] != d or v.shape[-2] != t or bias.shape[-2:] != (s, t):
            raise _fail(
                where,
                f"attention shapes do not fit: q {q}, k {k}, v {v}, bias {bias}",
            )
        return TensorType((*lead, s, v.shape[-1]), dtype)


@dataclass(frozen=True)
class Rope(Op):
    """Rotary position embedding: `x * cos + rotate_half(x) * sin` over the last axis.

    `rotate_half(x)` is `concat(-x[..., h:], x[..., :h])` along the last axis, `h` half its
    (static, even) size, as LLaMA-class decoders write it. `cos` and `sin` have x's shape (a
    broadcast of a per-position table costs nothing). The arithmetic is the template's, op by
    op: each product rounded to x's type, then their sum.
    """

    arity: ClassVar[int | None] = 3

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        x = inputs[0]
        shape = _same_shape(inputs, where)
        dtype = _same_dtype(inputs, where)
        if not dtype.is_float:
            raise _fail(where, f"rope needs float operands, got {dtype.short}")
        size = shape[-1] if shape else None
        if not isinstance(size, int) or size % 2:
            raise _fail(where, f"rope rotates a last axis of static even size, got {x}")
        return x


# ---- quantized arithmetic ----------------------------------------------------------------
# Integer products of 8-bit operands, exact in int32, and float products with 4-bit weights.
# The float scales of a quantized model stay outside these ops, as elementwise ops that
# extraction fuses into the kernel's epilogue (rules/quantize.egg).

EIGHT_BIT = frozenset({DType.I8, DType.U8})


def _zero_point(value: TensorType, zero: TensorType, what: str, where: str) -> None:
    """Check that an 8-bit operand and its zero point fit: same type, same shape."""
    if value.dtype not in EIGHT_BIT:
        raise _fail(where, f"{what} must be int8 or uint8, got {value.dtype.short}")
    if zero.dtype is not value.dtype or zero.shape != value.shape:
        raise _fail(
            where, f"the zero point of {what} must be {value} (its type and shape), got {zero}"
        )


@dataclass(frozen=True)
class IntMatMul(Op):
    """`(a - a_zero) @ (b - b_zero)` in int32, for int8 or uint8 `a [..., m, k]`, `b [..., k, n]`.

    Each zero point has its operand's type and shape (a per-tensor or per-channel zero point is
    a broadcast, which costs nothing). Products accumulate exactly in int32 (they cannot
    overflow below k = 2^15), as ONNX MatMulInteger and onnxruntime's kernels compute.
    """

    arity: ClassVar[int | None] = 4

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        a, b, a_zero, b_zero = inputs
        _zero_point(a, a_zero, "the left operand", where)
        _zero_point(b, b_zero, "the right operand", where)
        return TensorType(_matmul_shape(a, b, where), DType.I32)


@dataclass(frozen=True)
class IntConv(Op):
    """Conv (as `Conv`) of `x - x_zero` with `w - w_zero` in int32, for int8 or uint8 x and w.

    Padding holds the zero point, so padded taps add nothing (ONNX ConvInteger); the zero
    points have their operand's type and shape.
    """

    arity: ClassVar[int | None] = 4
    strides: tuple[int, ...]
    pads: tuple[tuple[int, int], ...]
    dilations: tuple[int, ...]
    groups: int = 1

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        x, w, x_zero, w_zero = inputs
        _zero_point(x, x_zero, "the input", where)
        _zero_point(w, w_zero, "the weight", where)
        return TensorType(_conv_shape(self, x, w, where), DType.I32)


INT4_BLOCKS = (16, 32, 64, 128, 256)


@dataclass(frozen=True)
class Int4MatMul(Op):
    """`a @ W^T` with a 4-bit weight `W [n, k]` packed as onnxruntime's MatMulNBits stores it.

    Inputs: `a [..., m, k]` (a float type), `packed` uint8 `[n, blocks, block / 2]` (codes of
    k along each row, two a byte, low nibble first, k padded to `blocks * block`), `scales
    [n, blocks]` of a's type and `zeros` uint8 `[n, ceil(blocks / 2)]` (4-bit zero points
    packed the same way). `W[j, i] = (code - zero) * scale` of i's block, computed in a's type
    (codes and zero points are exact there), then the product in a's type.
    """

    arity: ClassVar[int | None] = 4
    block: int

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        a, packed, scales, zeros = inputs
        if self.block not in INT4_BLOCKS:
            raise _fail(where, f"int4 block size {self.block} is not one of {INT4_BLOCKS}")
        if not a.dtype.is_float or a.rank < 2 or scales.dtype is not a.dtype:
            raise _fail(
                where,
                f"int4 matmul needs float a of rank >= 2 and scales of its type, got {a}, {scales}",
            )
        k = a.shape[-1]
        if not isinstance(k, int) or packed.dtype is not DType.U8 or zeros.dtype is not DType.U8:
            raise _fail(where, "int4 matmul needs a static k and uint8 packed codes and zeros")
        n = packed.shape[0]
        blocks = -(-k // self.block)
        expected = ((n, blocks, self.block // 2), (n, blocks), (n, -(-blocks // 2)))
        if (packed.shape, scales.shape, zeros.shape) != expected:
            raise _fail(
                where,
                f"int4 matmul over k={k} in blocks of {self.block} needs packed, scales and "
                f"zeros of shapes {[list(e) for e in expected]}, got {packed}, {scales}, {zeros}",
            )
        return TensorType((*a.shape[:-1], n), a.dtype)


# ---- ONNX nodes kept as they are ---------------------------------------------------------


@dataclass(frozen=True)
class OpaqueCall:
    """An ONNX node of an op knopt has no importer for, kept as the model wrote it.

    Attributes:
        op_type: The ONNX op type.
        domain: The op's domain ('' for the default one).
        version: The version of that domain the model imports.
        node: The node, serialized (an `onnx.NodeProto`: attributes, name, input and output
            names); the ONNX writer writes it back with new value names.
        inputs: How many inputs it has (absent optional ones, named '', not counted).
        outputs: How many outputs it has (including unused and absent ones).
        node_name: The node's name in the model, for messages.
    """

    op_type: str
    domain: str
    version: int
    node: bytes = field(repr=False)
    inputs: int
    outputs: int
    node_name: str = ""

    def __str__(self) -> str:
        return f"{self.domain}.{self.op_type}" if self.domain else self.op_type


@dataclass(frozen=True)
class Opaque(Op):
    """Output `output` of an `OpaqueCall`, whose type the model declares (or onnx infers).

    Nothing looks inside it: no rule matches through it (it is a leaf to every rule, as an
    input is), nothing folds it, and its value is known only when it runs (on the CPU through
    onnx's reference evaluator, where onnx has the op). Each output of a call is one `Opaque`
    op over the call's inputs, and the writer writes the call once for all of them.
    """

    arity: ClassVar[int | None] = None
    call: OpaqueCall
    output: int
    tensor_type: TensorType

    @property
    def name(self) -> str:
        """Opaque[com.microsoft.FastGelu] and so on, as in dumps."""
        return f"Opaque[{self.call}]"

    def infer(self, inputs: Sequence[TensorType], where: str) -> TensorType:
        call = self.call
        if len(inputs) != call.inputs:
            raise _fail(where, f"{call} takes {call.inputs} inputs, got {len(inputs)}")
        if not 0 <= self.output < call.outputs:
            raise _fail(where, f"{call} has {call.outputs} outputs, not an output {self.output}")
        return self.tensor_type


OP_CLASSES: tuple[type[Op], ...] = (
    Input,
    Constant,
    Iota,
    Sizes,
    View,
    Broadcast,
    Permute,
    Slice,
    Flip,
    Pad,
    Concat,
    Gather,
    Scatter,
    Cast,
    UnaryOp,
    BinaryOp,
    Clamp,
    Where,
    Reduce,
    ArgReduce,
    ArgSort,
    CumSum,
    MatMul,
    Conv,
    Pool,
    Softmax,
    LayerNorm,
    RmsNorm,
    Attention,
    Rope,
    IntMatMul,
    IntConv,
    Int4MatMul,
    Opaque,
)

# ---- op groups ---------------------------------------------------------------------------
# Class names are the schema.egg constructor names. Tables that treat a group alike derive
# from these sets, so a new op joins a group in one place.

LEAF_OPS: frozenset[type[Op]] = frozenset({Input, Constant, Iota, Sizes})  # no operands
# No work: a kernel reads the input through strides (a layout), never a copy.
VIEW_OPS: frozenset[type[Op]] = frozenset({View, Broadcast, Permute, Slice, Flip})
# Each output element from the elements at the same index of equally shaped operands: the ops
# a fused kernel's scalar body is made of.
ELEMENTWISE_OPS: frozenset[type[Op]] = frozenset({Cast, UnaryOp, BinaryOp, Clamp, Where})
