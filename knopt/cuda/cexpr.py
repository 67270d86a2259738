"""Scalar bodies (`Expr`) as CUDA C statements, and the C facts of each dtype.

Half types (f16, bf16) are stored narrow and computed in float; a `CastE` to a half type rounds
through the narrow type so the value is what the numpy oracle would hold. The functions called
(`kn::u_exp`, `kn::b_add`, ...) live in codegen/common.cuh, named after the IR kinds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import ml_dtypes
import numpy as np

from knopt.errors import CodegenError, UnsupportedModelError
from knopt.ir.dtype import DType
from knopt.ir.op import COMPARISONS, UNARY_TO_BOOL, Binary
from knopt.ir.program import Acc, BinaryE, CastE, ClampE, Const, Expr, Load, UnaryE, WhereE

HALF_TYPES = frozenset({DType.F16, DType.BF16})
GPU_DTYPES = frozenset(
    {
        DType.F32,
        DType.F64,
        DType.F16,
        DType.BF16,
        DType.BOOL,
        DType.I8,
        DType.I16,
        DType.I32,
        DType.I64,
        DType.U8,
        DType.U16,
        DType.U32,
        DType.U64,
    }
)


def check_dtype(dtype: DType, where: str) -> None:
    """Reject dtypes the CUDA backend cannot hold.

    Raises:
        UnsupportedModelError: For the narrow float and sub-byte integer types.
    """
    if dtype not in GPU_DTYPES:
        supported = ", ".join(sorted(d.short for d in GPU_DTYPES))
        raise UnsupportedModelError(
            f"{where}: element type {dtype.short} is not supported on CUDA ({supported})"
        )


def storage_type(dtype: DType) -> str:
    """The C type a tensor of `dtype` is stored as."""
    return dtype.info.c_name


def compute_type(dtype: DType) -> str:
    """The C type arithmetic on `dtype` happens in (float for the half types)."""
    return "float" if dtype in HALF_TYPES else dtype.info.c_name


def accumulate_dtype(dtype: DType) -> DType:
    """The dtype sums and products of `dtype` accumulate in (f32 for halves, i64 for bool)."""
    if dtype is DType.BOOL:
        return DType.I64
    if dtype in HALF_TYPES:
        return DType.F32
    return dtype


def accumulate_type(dtype: DType) -> str:
    """The C type sums and products of `dtype` accumulate in."""
    return compute_type(accumulate_dtype(dtype))


def literal(value: float, dtype: DType) -> str:
    """`value` as a C literal of `dtype`'s compute type, rounded as numpy would store it."""
    if dtype is DType.BOOL:
        return "true" if value else "false"
    if dtype.is_int:
        info = ml_dtypes.iinfo(dtype.numpy)
        number = int(value)
        if not info.min <= number <= info.max:
            number = int(np.asarray(value).astype(np.float64).astype(dtype.numpy))
        c_type = compute_type(dtype)
        if number == -(2**63):
            return f"(({c_type})(-9223372036854775807LL - 1))"
        suffix = "ULL" if not dtype.is_signed else "LL"
        return f"(({c_type}){number}{suffix})"
    with np.errstate(over="ignore"):  # beyond the type's range is infinity, as numpy stores it
        rounded = float(np.asarray(value, np.float64).astype(dtype.numpy).astype(np.float64))
    double = dtype is DType.F64
    if math.isnan(rounded):
        return "KN_NAN_D" if double else "KN_NAN_F"
    if math.isinf(rounded):
        name = "KN_INF_D" if double else "KN_INF_F"
        return name if rounded > 0 else f"(-{name})"
    return repr(rounded) if double else f"{rounded!r}f"


def expr_dtype(expr: Expr, loads: Sequence[DType], acc: DType | None = None) -> DType:
    """The element type of a body.

    Raises:
        CodegenError: If the body reads `Acc` where there is none or a load out of range.
    """
    if isinstance(expr, Load):
        if not 0 <= expr.index < len(loads):
            raise CodegenError(f"body loads input {expr.index} of {len(loads)}")
        return loads[expr.index]
    if isinstance(expr, Acc):
        if acc is None:
            raise CodegenError("body reads Acc outside an epilogue")
        return acc
    if isinstance(expr, Const | CastE):
        return expr.dtype
    if isinstance(expr, UnaryE):
        return DType.BOOL if expr.kind in UNARY_TO_BOOL else expr_dtype(expr.x, loads, acc)
    if isinstance(expr, BinaryE):
        return DType.BOOL if expr.kind in COMPARISONS else expr_dtype(expr.a, loads, acc)
    if isinstance(expr, ClampE):
        return expr_dtype(expr.x, loads, acc)
    assert isinstance(expr, WhereE)
    return expr_dtype(expr.a, loads, acc)


def used_loads(expr: Expr | None) -> set[int]:
    """The input indices a body reads."""
    if expr is None:
        return set()
    if isinstance(expr, Load):
        return {expr.index}
    children: tuple[Expr, ...] = ()
    if isinstance(expr, UnaryE | ClampE | CastE):
        children = (expr.x,)
    elif isinstance(expr, BinaryE):
        children = (expr.a, expr.b)
    elif isinstance(expr, WhereE):
        children = (expr.condition, expr.a, expr.b)
    found: set[int] = set()
    for child in children:
        found |= used_loads(child)
    return found


def uses_acc(expr: Expr | None) -> bool:
    """True if a body reads `Acc`."""
    if expr is None or isinstance(expr, Load | Const):
        return False
    if isinstance(expr, Acc):
        return True
    if isinstance(expr, UnaryE | ClampE | CastE):
        return uses_acc(expr.x)
    if isinstance(expr, BinaryE):
        return uses_acc(expr.a) or uses_acc(expr.b)
    assert isinstance(expr, WhereE)
    return uses_acc(expr.condition) or uses_acc(expr.a) or uses_acc(expr.b)


class ScalarCode:
    """Emits a body as C statements over variables holding the loads (in compute types).

    Args:
        loads: The dtype of each kernel input.
        load_names: The C variable holding each input's value (compute type).
        acc: The dtype of `Acc`, if the body is an epilogue.
        acc_name: The C variable holding `Acc` (compute type).
        prefix: Prefix of the temporaries, unique within the kernel.
    """

    def __init__(
        self,
        loads: Sequence[DType],
        load_names: Sequence[str],
        acc: DType | None = None,
        acc_name: str = "acc",
        prefix: str = "t",
    ) -> None:
        self.loads = list(loads)
        self.load_names = list(load_names)
        self.acc = acc
        self.acc_name = acc_name
        self.prefix = prefix
        self.lines: list[str] = []
        self._memo: dict[Expr, str] = {}

    def dtype(self, expr: Expr) -> DType:
        """The element type of `expr`."""
        return expr_dtype(expr, self.loads, self.acc)

    def emit(self, expr: Expr) -> str:
        """The C variable (or literal) holding `expr`, in its compute type."""
        if isinstance(expr, Load):
            self.dtype(expr)
            return self.load_names[expr.index]
        if isinstance(expr, Acc):
            self.dtype(expr)
            return self.acc_name
        if isinstance(expr, Const):
            return literal(expr.value, expr.dtype)
        if expr in self._memo:
            return self._memo[expr]
        value = self._compute(expr)
        name = f"{self.prefix}{len(self._memo)}"
        self.lines.append(f"const {compute_type(self.dtype(expr))} {name} = {value};")
        self._memo[expr] = name
        return name

    def _compute(self, expr: Expr) -> str:
        if isinstance(expr, UnaryE):
            return f"kn::u_{expr.kind.name.lower()}({self.emit(expr.x)})"
        if isinstance(expr, BinaryE):
            a = self.emit(expr.a)
            b = self.emit(expr.b)
            kind_type = compute_type(self.dtype(expr.a))
            if expr.kind is Binary.POW and self.dtype(expr.b) != self.dtype(expr.a):
                b = f"kn::cvt<{kind_type}>({b})"
            return f"kn::b_{expr.kind.name.lower()}<{kind_type}>({a}, {b})"
        if isinstance(expr, ClampE):
            dtype = self.dtype(expr.x)
            lo, hi = _clamp_bounds(expr.lo, expr.hi, dtype)
            return f"kn::clamp_<{compute_type(dtype)}>({self.emit(expr.x)}, {lo}, {hi})"
        if isinstance(expr, CastE):
            return cast(self.emit(expr.x), self.dtype(expr.x), expr.dtype)
        assert isinstance(expr, WhereE)
        condition = self.emit(expr.condition)
        if self.dtype(expr.condition) is not DType.BOOL:
            condition = f"kn::cvt<bool>({condition})"
        return f"({condition} ? {self.emit(expr.a)} : {self.emit(expr.b)})"


def cast(value: str, source: DType, target: DType) -> str:
    """C converting `value` (in `source`'s compute type) to `target`'s compute type."""
    if target in HALF_TYPES:
        narrow = storage_type(target)
        return f"kn::cvt<float>(kn::cvt<{narrow}>({value}))"
    if compute_type(source) == compute_type(target):
        return value
    return f"kn::cvt<{compute_type(target)}>({value})"


def _clamp_bounds(lo: float, hi: float, dtype: DType) -> tuple[str, str]:
    if dtype.is_int:
        info = ml_dtypes.iinfo(dtype.numpy)
        low = int(info.min) if lo == -math.inf else math.ceil(max(lo, info.min))
        high = int(info.max) if hi == math.inf else math.floor(min(hi, info.max))
        return literal(low, dtype), literal(high, dtype)
    return literal(lo, dtype), literal(hi, dtype)


def load_value(pointer_expr: str, dtype: DType) -> str:
    """C reading one element (an lvalue of the storage type) into its compute type."""
    if dtype in HALF_TYPES:
        return f"kn::cvt<float>({pointer_expr})"
    return pointer_expr


def store_value(value: str, dtype: DType) -> str:
    """C converting a compute-type value to `dtype`'s storage type."""
    if dtype in HALF_TYPES or dtype is DType.BOOL:
        return f"kn::cvt<{storage_type(dtype)}>({value})"
    return f"({storage_type(dtype)})({value})"
