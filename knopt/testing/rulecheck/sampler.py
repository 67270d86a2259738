"""Backward samplers, which propose the arguments of an IR constructor from its result's type.

For each IR constructor of schema.egg, given the type its result should have and the arguments
already fixed, a sampler proposes the other attributes and the types of the tensor arguments.
Proposals are hints: the IR builder types the result (`Op.infer`) and a proposal that does not
fit is rejected there.

Arguments are numbered as in schema.egg; derived arguments (the result shapes that some
constructors carry last, constant indices, input names) are never proposed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from knopt.errors import InvalidGraphError
from knopt.ir.dtype import DType
from knopt.ir.op import Binary, BinaryOp, TensorType, Unary, UnaryOp
from knopt.testing.choices import Choices, choose

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Hint:
    """The type a tensor should have; `bound` marks integer indices into an axis that long."""

    shape: Shape
    dtype: DType
    bound: int | None = None


Proposal = tuple[dict[int, Any], dict[int, Hint | list[Hint]]]
Sampler = Callable[["Sampling", Hint, dict[int, Any]], Proposal]

DERIVED: dict[str, frozenset[int]] = {
    "Input": frozenset({0}),
    "Constant": frozenset({0}),
    "Permute": frozenset({2}),
    "Slice": frozenset({5}),
    "Pad": frozenset({4}),
    "Concat": frozenset({2}),
    "Gather": frozenset({3}),
    "Reduce": frozenset({3}),
    "ArgReduce": frozenset({4}),
    "Conv": frozenset({6}),
    "Pool": frozenset({8}),
    "IntConv": frozenset({8}),
    "Opaque": frozenset({0}),
}
BOUNDS = (-math.inf, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 6.0, math.inf)
# Small integer types are here so that a rule wrong only when a narrow sum or product wraps is
# found (the checker also runs integers near their limits: `arrays.limit_inputs`).
INTEGERS = (DType.I64, DType.I32, DType.I16, DType.U16, DType.I8, DType.U8)
DTYPES = (DType.F32, DType.F64, *INTEGERS, DType.BOOL, DType.F16)
NUMERIC = (DType.F32, DType.F64, *INTEGERS)


class Sampling:
    """Random decisions for samplers."""

    def __init__(self, choices: Choices) -> None:
        self.choices = choices

    def integer(self, lo: int, hi: int) -> int:
        """An integer in `[lo, hi]`."""
        return self.choices.integer(lo, hi)

    def boolean(self, p: float = 0.5) -> bool:
        """True with probability `p`."""
        return self.choices.boolean(p)

    def choose(self, options: Any) -> Any:
        """One of `options`."""
        return choose(self.choices, list(options))

    def dim(self) -> int:
        """A size, sometimes 1."""
        return 1 if self.boolean(0.2) else self.integer(2, 4)

    def shape(self, rank: int | None = None) -> Shape:
        """A random shape (rank 1 to 4 unless given)."""
        rank = self.integer(1, 4) if rank is None else rank
        return tuple(self.dim() for _ in range(rank))

    def dtype(self) -> DType:
        """A dtype, mostly f32."""
        return DType.F32 if self.boolean(0.55) else self.choose(DTYPES)

    def axis(self, rank: int) -> int:
        """An axis of a tensor of `rank` (rank 0 has none: the proposal is rejected)."""
        if rank == 0:
            raise InvalidGraphError("no axis to choose in a rank-0 tensor")
        return self.integer(0, rank - 1)

    def value(self) -> float:
        """A float attribute value: a round one or a random one."""
        if self.boolean(0.5):
            return float(self.choose((2.0, 0.5, 1.0, -1.0, 3.0, 1.5, -0.5, 6.0)))
        return round(self.choices.integer(-300, 300) / 100, 2) or 0.75


def _valid(kind: Unary | Binary, dtype: DType) -> DType | None:
    t = TensorType((1,), dtype)
    try:
        if isinstance(kind, Unary):
            return UnaryOp(kind).infer([t], "").dtype
        return BinaryOp(kind).infer([t, t], "").dtype
    except InvalidGraphError:
        return None


def _pick(fixed: dict[int, Any], position: int, make: Callable[[], Any]) -> Any:
    # Draw even when the value is fixed, so that fixing one value (a repair) leaves every
    # later random decision as it was.
    made = make()
    return fixed.get(position, made)


def _reshaped(s: Sampling, shape: Shape) -> Shape:
    dims = list(shape)
    what = s.choose(("same", "merge", "split", "unsqueeze"))
    if what == "merge" and len(dims) >= 2:
        i = s.integer(0, len(dims) - 2)
        dims[i : i + 2] = [dims[i] * dims[i + 1]]
    elif what == "split" and any(d > 1 for d in dims):
        i = s.choose([i for i, d in enumerate(dims) if d > 1])
        f = s.choose([f for f in range(1, dims[i] + 1) if dims[i] % f == 0])
        dims[i : i + 1] = [f, dims[i] // f]
    elif what == "unsqueeze":
        dims.insert(s.integer(0, len(dims)), 1)
    return tuple(dims)


# ---- leaves and elementwise ops ---------------------------------------------------------------


def _leaf(s: Sampling, out: Hint, fixed: dict[int, Any]) -> Proposal:
    attrs = {1: _pick(fixed, 1, lambda: out.shape), 2: _pick(fixed, 2, lambda: out.dtype.name)}
    return attrs, {}


def _splat(s: Sampling, out: Hint, fixed: dict[int, Any]) -> Proposal:
    attrs, _ = _leaf(s, out, fixed)
    attrs[0] = _pick(fixed, 0, s.value)
    return attrs, {}


def _unary(s: Sampling, out: Hint, fixed: dict[int, Any]) -> Proposal:
    def kind() -> str:
        if out.dtype is DType.BOOL:
            return str(s.choose(("NOT", "IS_NAN", "IS_INF")))
        return str(s.choose([k.name for k in Unary if _valid(k, out.dtype) is out.dtype]))

    name = _pick(fixed, 0, kind)
    operand = out.dtype
    if name in ("IS_NAN", "IS_INF"):
        operand = s.choose((DType.F32, DType.F64))
    return {0: name}, {1: Hint(out.shape, operand)}


def _binary(s: Sampling, out: Hint, fixed: dict[int, Any]) -> Proposal:
    def kind() -> str:
        options = [k.name for k in Binary if _valid(k, out.dtype) is out.dtype]
        if out.dtype is DType.BOOL:
            options += ["LESS", "GREATER", "EQUAL", "LESS_EQUAL", "GREATER_EQUAL"]
        return str(s.choose(options))

    name = _pick(fixed, 0, kind)
    operand = out.dtype
    if out.dtype is DType.BOOL and name not in ("AND", "OR", "XOR"):
        operand = s.choose(NUMERIC)
    return {0: name}, {1: Hint(out.shape, operand), 2: Hint(out.shape, operand)}


def _clamp(s: Sampling, out: Hint, fixed: dict[int, Any]) -> Proposal:
    lo, hi = sorted((s.choose(BOUNDS), s.choose(BOUNDS)))
    return {1: _pick(fixed, 1, lambda: lo), 2: _pick(fixed, 2, lambda: hi)}, {0: out}


def _where(s: Sampling, out: Hint, fixed: dict[int, Any]) -> Proposal:
    return {}, {0: Hint(out.shape, DType.BOOL), 1: out, 2: out}


def _cast(s: Sampling, out: Hint, fixed: dict[int, Any]) -> Proposal:
    target = _pick(fixed, 1, lambda: out.dtype.name)
    source = s.choose(NUMERIC) if s.boolean(0.9) else DType.BOOL
    return {1: target}, {0: Hint(out.shape, source)}


# ---- data movement ---------------------------------------------------------------------------


def _view(s: Sampling, out: Hint, fixed: dict[int, Any]) -> Proposal:
    shape = tuple(_pick(fixed, 1, lambda: out.shape))
    return {1: shape}, {0: Hint(_reshaped(s, shape), out.dtype)}


def _broadcast(s: Sampling, out: Hint, fixed: dict[int, Any]) -> Proposal:
    shape = tuple(_pick(fixed, 1, lambda: out.shape))
    inner = tuple(1 if s.boolean(0.4) else d for d in shape)
    return {1: shape}, {0: Hint(inner, out.dtype)}


def _permute(s: Sampling, out: Hint, fixed: dict[int, Any]) -> Proposal:
    rank = len(out.shape)
    order = list(range(rank))
    for i in range(rank - 1, 0, -1):  # Fisher-Yates through the choices
        j = s.integer(0, i)
        order[i], order[j] = order[j], order[i]
    perm = tuple(_pick(fixed, 1, lambda: tuple(order)))
    inner = [1] * len(perm)
    for i, p in enumerate(perm):
        if 0 <= p < len(perm) and i < rank:
            inner[p] = out.shape[i]
    return {1: perm}, {0: Hint(tuple(inner), out.dtype)}


def _slice(s: Sampling, out: Hint, fixed: dict[int, Any]) -> Proposal:
    axis = _pick(fixed, 1, lambda: s.axis(len(out.shape)))
    step = _pick(fixed, 4, lambda: s.choose((1, 1, 2)))
    start = _pick(fixed, 2, lambda: s.integer(0, 2))
    size = out.shape[axis] if 0 <= axis < len(out.shape) else 1
    stop = _pick(fixed, 3, lambda: start + (size - 1) * step + 1)
    inner = list(out.shape)
    if 0 <= axis < len(inner):
        inner[axis] = max(stop, 1) + (0 if 3 in fixed else s.integer(0, 1))
    return {1: axis, 2: start, 3: stop, 4: step}, {0: Hint(tuple(inner), out.dtype)}


def _flip(s: Sampling, out: Hint, fixed: dict[int, Any]) -> Proposal:
    return {1: _pick(fixed, 1, lambda: s.axis(len(out.shape)))}, {0: out}


def _pad(s: Sampling, out: Hint, fixed: dict[int, Any]) -> Proposal:
    def pads() -> tuple[int, ...]:
        return tuple(min(s.integer(0, 1), max(d - 1, 0) // 2) for d in out.shape for _ in "ab")

    flat = tuple(_pick(fixed, 1, pads))
    inner = tuple(
        d - flat[2 * i] - flat[2 * i + 1] if 2 * i + 1 < len(flat) else d
        for i, d in enumerate(out.shape)
    )
    mode = _pick(
        fixed, 2, lambda: s.choose(("PAD_CONSTANT", "PAD_EDGE", "PAD_REFLECT", "PAD_WRAP"))
    )
    return {1: flat, 2: mode, 3: _pick(fixed, 3, s.value)}, {0: Hint(inner, out.dtype)}


def _concat(s: Sampling, out: Hint, fixed: dict[int, Any]) -> Proposal:
    axis = _pick(fixed, 1, lambda: s.axis(len(out.shape)))
    size = out.shape[axis] if 0 <= axis < len(out.shape) else 1
    first = s.integer(1, size - 1) if size > 1 else size
    parts = [first, size - first] if size > 1 else [size]
    hints: list[Hint] = []
    for part in parts:
        shape = list(out.shape)
        if 0 <= axis < len(shape):
            shape[axis] = part
        hints.append(Hint(tuple(shape), out.dtype))
    return {1: axis}, {0: hints}


def _gather(s: Sampling, out: Hint, fixed: dict[int, Any]) -> Proposal:
    rank = len(out.shape)
    depth = s.integer(0, min(2, rank))
    axis = _pick(fixed, 2, lambda: s.integer(0, rank - depth))
    size = s.integer(1, 4)
    indices = out.shape[axis : axis + depth]
    inner = (*out.shape[:axis], size, *out.shape[axis + depth :])
    return {2: axis}, {0: Hint(inner, out.dtype), 1: Hint(indices, DType.I64, bound=size)}


def _scatter(s: Sampling, out: Hint, fixed: dict[int, Any]) -> Proposal:
    axis = _pick(fixed, 3, lambda: s.axis(len(out.shape)))
    part = tuple(s.integer(1, d) for d in out.shape)
    bound = out.shape[axis] if 0 <= axis < len(out.shape) else 1
    reduction = _pick(fixed, 4, lambda: s.choose(("SCATTER_NONE", "SCATTER_ADD", "SCATTER_MAX")))
    children: dict[int, Hint | list[Hint]] = {
        0: out,
        1: Hint(part, DType.I64, bound=bound),
        2: Hint(part, out.dtype),
    }
    return {3: axis, 4: reduction}, children


# ---- reductions, contractions, windows, norms -----------------------------------------------


def _reduce(s: Sampling, out: Hint, fixed: dict[int, Any]) -> Proposal:
    kind = _pick(
        fixed, 0, lambda: s.choose(("REDUCE_SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD"))
    )

    def axes() -> tuple[int, ...]:
        ones = [i for i, d in enumerate(out.shape) if d == 1] or list(range(len(out.shape)))
        picked = sorted({s.choose(ones) for _ in range(s.integer(1, 2))}) if ones else []
        return tuple(picked)

    chosen = tuple(_pick(fixed, 2, axes))
    inner = tuple(s.integer(1, 4) if i in chosen else d for i, d in enumerate(out.shape))
    return {0: kind, 2: chosen}, {1: Hint(inner, out.dtype)}


def _arg_reduce(s: Sampling, out: Hint, fixed: dict[int, Any]) -> Proposal:
    axis = _pick(fixed, 1, lambda: s.axis(len(out.shape)))
    inner = tuple(s.integer(1, 4) if i == axis else d for i, d in enumerate(out.shape))
    attrs = {1: axis, 2: _pick(fixed, 2, s.boolean), 3: _pick(fixed, 3, s.boolean)}
    return attrs, {0: Hint(inner, s.choose(NUMERIC))}


def _arg_sort(s: Sampling, out: Hint, fixed: dict[int, Any]) -> Proposal:
    attrs = {1: _pick(fixed, 1, lambda: s.axis(len(out.shape))), 2: _pick(fixed, 2, s.boolean)}
    return attrs, {0: Hint(out.shape, s.choose(NUMERIC))}


def _cumsum(s: Sampling, out: Hint, fixed: dict[int, Any]) -> Proposal:
    attrs = {
        1: _pick(fixed, 1, lambda: s.axis(len(out.shape))),
        2: _pick(fixed, 2, s.boolean),
        3: _pick(fixed, 3, s.boolean),
    }
    return attrs, {0: out}


def _matmul(s: Sampling, out: Hint, fixed: dict[int, Any]) -> Proposal:
    if len(out.shape) < 2:
        raise InvalidGraphError("matmul results have rank 2 or more")
    k = s.integer(1, 4)
    *lead, m, n = out.shape
    return {}, {0: Hint((*lead, m, k), out.dtype), 1: Hint((*lead, k, n), out.dtype)}


def _window(s: Sampling, size: int, fixed: dict[str, Any], i: int) -> tuple[int, ...]:
    """Kernel, stride, dilation, pads and input size for one spatial axis of output `size`."""
    k = fixed["kernel"][i] if "kernel" in fixed else s.integer(1, 3)
    stride = fixed["strides"][i] if "strides" in fixed else s.integer(1, 2)
    dilation = fixed["dilations"][i] if "dilations" in fixed else s.integer(1, 2)
    span = dilation * (k - 1) + 1
    before, after = (
        (fixed["pads"][2 * i], fixed["pads"][2 * i + 1])
        if "pads" in fixed
        else (s.integer(0, (k - 1) // 2), s.integer(0, (k - 1) // 2))
    )
    length = max((size - 1) * stride + span - before - after, 1)
    return k, stride, dilation, before, after, length


def _spatial(s: Sampling, out: Hint, fixed: dict[str, Any]) -> list[tuple[int, ...]]:
    if not 3 <= len(out.shape) <= 5:
        raise InvalidGraphError("convolutions and pools have 1 to 3 spatial axes")
    return [_window(s, d, fixed, i) for i, d in enumerate(out.shape[2:])]


def _named(fixed: dict[int, Any], names: dict[str, int]) -> dict[str, Any]:
    return {name: fixed[i] for name, i in names.items() if i in fixed}


def _conv_window(
    s: Sampling, out: Hint, fixed: dict[int, Any], first: int
) -> tuple[dict[int, Any], Shape, Shape]:
    """Attributes at positions `first...` (strides, pads, dilations, groups), x and w shapes."""
    names = {"strides": first, "pads": first + 1, "dilations": first + 2}
    axes = _spatial(s, out, _named(fixed, names))
    n, m = out.shape[:2]
    groups = _pick(fixed, first + 3, lambda: s.choose([g for g in (1, m) if m % g == 0]))
    per_group = s.integer(1, 2)
    attrs = {
        first: tuple(a[1] for a in axes),
        first + 1: tuple(p for a in axes for p in a[3:5]),
        first + 2: tuple(a[2] for a in axes),
        first + 3: groups,
    }
    x = (n, groups * per_group, *(a[5] for a in axes))
    w = (m, per_group, *(a[0] for a in axes))
    return attrs, x, w


def _conv(s: Sampling, out: Hint, fixed: dict[int, Any]) -> Proposal:
    attrs, x, w = _conv_window(s, out, fixed, 2)
    return attrs, {0: Hint(x, out.dtype), 1: Hint(w, out.dtype)}


EIGHT_BIT = (DType.U8, DType.I8)


def _with_zeros(s: Sampling, a: Shape, b: Shape) -> dict[int, Hint | list[Hint]]:
    """Hints for two 8-bit operands (each int8 or uint8) and their zero points."""
    ta, tb = s.choose(EIGHT_BIT), s.choose(EIGHT_BIT)
    return {0: Hint(a, ta), 1: Hint(b, tb), 2: Hint(a, ta), 3: Hint(b, tb)}


def _int_matmul(s: Sampling, out: Hint, fixed: dict[int, Any]) -> Proposal:
    if len(out.shape) < 2:
        raise InvalidGraphError("matmul results have rank 2 or more")
    k = s.integer(1, 4)
    *lead, m, n = out.shape
    return {}, _with_zeros(s, (*lead, m, k), (*lead, k, n))


def _int_conv(s: Sampling, out: Hint, fixed: dict[int, Any]) -> Proposal:
    attrs, x, w = _conv_window(s, out, fixed, 4)
    return attrs, _with_zeros(s, x, w)


def _int4_matmul(s: Sampling, out: Hint, fixed: dict[int, Any]) -> Proposal:
    if len(out.shape) < 2 or not out.dtype.is_float:
        raise InvalidGraphError("int4 matmul results are float matrices")
    block = _pick(fixed, 4, lambda: s.choose((16, 32)))
    k = s.integer(1, 40)
    *lead, m, n = out.shape
    blocks = -(-k // block)
    children: dict[int, Hint | list[Hint]] = {
        0: Hint((*lead, m, k), out.dtype),
        1: Hint((n, blocks, block // 2), DType.U8),
        2: Hint((n, blocks), out.dtype),
        3: Hint((n, -(-blocks // 2)), DType.U8),
    }
    return {4: block}, children


def _pool(s: Sampling, out: Hint, fixed: dict[int, Any]) -> Proposal:
    names = {"kernel": 2, "strides": 3, "pads": 4, "dilations": 5}
    axes = _spatial(s, out, _named(fixed, names))
    attrs = {
        0: _pick(fixed, 0, lambda: s.choose(("POOL_MAX", "POOL_AVG"))),
        2: tuple(a[0] for a in axes),
        3: tuple(a[1] for a in axes),
        4: tuple(p for a in axes for p in a[3:5]),
        5: tuple(a[2] for a in axes),
        6: _pick(fixed, 6, lambda: False),
        7: _pick(fixed, 7, s.boolean),
    }
    return attrs, {1: Hint((*out.shape[:2], *(a[5] for a in axes)), out.dtype)}


def _normalize(s: Sampling, out: Hint, fixed: dict[int, Any]) -> Proposal:
    attrs = {1: _pick(fixed, 1, lambda: s.axis(len(out.shape)))}
    if 2 not in fixed:
        attrs[2] = s.choose((1e-5, 1e-6, 1e-3))
    return attrs, {0: out}


def _attention(s: Sampling, out: Hint, fixed: dict[int, Any]) -> Proposal:
    if len(out.shape) < 2:
        raise InvalidGraphError("attention results have rank 2 or more")
    *lead, rows, e = out.shape
    d, t = s.integer(1, 4), s.integer(1, 4)
    children: dict[int, Hint | list[Hint]] = {
        0: Hint((*lead, rows, d), out.dtype),
        1: Hint((*lead, t, d), out.dtype),
        2: Hint((*lead, t, e), out.dtype),
        3: Hint((*lead, rows, t), out.dtype),
    }
    return {4: _pick(fixed, 4, lambda: 1 / math.sqrt(d))}, children


def _rope(s: Sampling, out: Hint, fixed: dict[int, Any]) -> Proposal:
    # x, cos and sin have the result's type; an odd last axis is rejected by `Rope.infer`.
    return {}, {0: out, 1: out, 2: out}


def _iota(s: Sampling, out: Hint, fixed: dict[int, Any]) -> Proposal:
    length = out.shape[0] if len(out.shape) == 1 else s.integer(1, 4)
    return {0: _pick(fixed, 0, lambda: length), 1: _pick(fixed, 1, lambda: out.dtype.name)}, {}


def _sizes(s: Sampling, out: Hint, fixed: dict[int, Any]) -> Proposal:
    count = out.shape[0] if len(out.shape) == 1 else s.integer(1, 3)
    values = _pick(fixed, 0, lambda: tuple(s.integer(1, 4) for _ in range(count)))
    return {0: values, 1: _pick(fixed, 1, lambda: "I64")}, {}


SAMPLERS: dict[str, Sampler] = {
    "Input": _leaf,
    "Constant": _leaf,
    "Splat": _splat,
    "Iota": _iota,
    "Sizes": _sizes,
    "View": _view,
    "Broadcast": _broadcast,
    "Permute": _permute,
    "Slice": _slice,
    "Flip": _flip,
    "Pad": _pad,
    "Concat": _concat,
    "Gather": _gather,
    "Scatter": _scatter,
    "Cast": _cast,
    "UnaryOp": _unary,
    "BinaryOp": _binary,
    "Clamp": _clamp,
    "Where": _where,
    "Reduce": _reduce,
    "ArgReduce": _arg_reduce,
    "ArgSort": _arg_sort,
    "CumSum": _cumsum,
    "MatMul": _matmul,
    "Conv": _conv,
    "Pool": _pool,
    "Softmax": _flip,  # an axis and the same type, as Flip
    "LayerNorm": _normalize,
    "RmsNorm": _normalize,
    "Attention": _attention,
    "Rope": _rope,
    "IntMatMul": _int_matmul,
    "IntConv": _int_conv,
    "Int4MatMul": _int4_matmul,
    "Opaque": _leaf,
}
