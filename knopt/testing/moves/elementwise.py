"""Elementwise moves: unary and binary kinds of every dtype, clamps, casts and `Where`."""

from __future__ import annotations

import math

from knopt.ir.dtype import DType
from knopt.ir.graph import Value
from knopt.ir.op import COMPARISONS, Binary, Cast, Constant, Input, Unary
from knopt.testing.generator import GraphGen, static_shape

# Float unary kinds by the operand guard they need.
TOTAL = (
    Unary.NEG, Unary.ABS, Unary.RELU, Unary.TANH, Unary.SIGMOID, Unary.SIN, Unary.COS,
    Unary.ATAN, Unary.ERF, Unary.SOFTPLUS, Unary.GELU, Unary.GELU_TANH, Unary.SILU,
    Unary.HARD_SIGMOID, Unary.HARD_SWISH, Unary.ASINH,
)  # fmt: skip
GROWING = (Unary.EXP, Unary.SINH, Unary.COSH)  # on a clamp to [-5, 5]
POSITIVE = (Unary.LOG, Unary.SQRT, Unary.RSQRT, Unary.RECIPROCAL)  # on |x| + 1/2
UNIT = (Unary.ASIN, Unary.ACOS, Unary.ATANH)  # on a clamp to [-0.9, 0.9]
STEPS = (Unary.SIGN, Unary.FLOOR, Unary.CEIL, Unary.ROUND)  # exact operands only
EXACT_UNARY = frozenset(
    {Unary.NEG, Unary.ABS, Unary.RELU, Unary.SIGN, Unary.FLOOR, Unary.CEIL, Unary.ROUND}
)
BOUNDS = (-math.inf, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0, 6.0, math.inf)
POWERS = (2.0, 3.0, 0.5, -1.0, 1.0, 1.5, -2.0)


def unary_float(gen: GraphGen) -> Value | None:
    """A float unary op on a guarded operand."""
    g = gen.builder
    group = gen.weighted(
        [
            ("total", 6),
            ("growing", 2),
            ("positive", 3),
            ("unit", 1),
            ("acosh", 1),
            ("tan", 1),
            ("step", 1),
            ("test", 1),
        ]
    )
    exact = group == "step"
    entry = gen.pick("float", exact=exact)
    if entry is None:
        return None
    x = entry.value
    if group == "total":
        kind = gen.choose(TOTAL)
        return gen.add(g.unary(kind, x), entry.exact and kind in EXACT_UNARY)
    if group == "growing":
        return gen.add(g.unary(gen.choose(GROWING), gen.bounded(x, 5.0)))
    if group == "positive":
        return gen.add(g.unary(gen.choose(POSITIVE), gen.positive(x)))
    if group == "unit":
        return gen.add(g.unary(gen.choose(UNIT), gen.bounded(x, 0.9)))
    if group == "acosh":
        one = g.add(gen.positive(x), gen.splat(1.0, x.dtype))
        return gen.add(g.unary(Unary.ACOSH, one))
    if group == "tan":
        return gen.add(g.unary(Unary.TAN, gen.bounded(x, 1.2)))
    if group == "step":
        return gen.add(g.unary(gen.choose(STEPS), x), True)
    return gen.add(g.unary(gen.choose((Unary.IS_NAN, Unary.IS_INF)), x), True)


def binary_float(gen: GraphGen) -> Value | None:
    """A float binary op; denominators, bases and rounding-sensitive kinds are guarded."""
    g = gen.builder
    kind = gen.weighted(
        [
            (Binary.ADD, 4),
            (Binary.MUL, 4),
            (Binary.SUB, 3),
            (Binary.DIV, 3),
            (Binary.MAX, 1),
            (Binary.MIN, 1),
            (Binary.POW, 2),
            (Binary.MOD, 1),
            (Binary.FMOD, 1),
            (Binary.GREATER, 1),
            (Binary.LESS_EQUAL, 1),
            (Binary.EQUAL, 1),
            (Binary.LESS, 1),
            (Binary.GREATER_EQUAL, 1),
        ]
    )
    rounding = kind in COMPARISONS or kind in (Binary.MOD, Binary.FMOD)
    entry = gen.pick("float", exact=rounding)
    if entry is None:
        return None
    x = entry.value
    if kind is Binary.POW:
        power = gen.choose(POWERS)
        base = x if power in (2.0, 3.0) else gen.positive(x)
        return gen.add(g.binary(kind, base, gen.splat(power, x.dtype)))
    if kind in (Binary.MOD, Binary.FMOD):
        return gen.add(g.binary(kind, x, gen.constant(gen.broadcastable(static_shape(x)))), True)
    if rounding:
        same = gen.entries(lambda e: e.exact and e.value.type == x.type)
        y = gen.choose(same).value if gen.boolean() else gen.splat(0.5, x.dtype)
        return gen.add(g.binary(kind, x, y), True)
    y = gen.operand_for(x)
    if kind is Binary.DIV:
        if not isinstance(y.producer.op, Constant | Input):  # those are never near zero
            y = gen.positive(y)
        return gen.add(g.binary(kind, x, y))
    if gen.boolean(0.3):
        x, y = y, x
    exact = kind in (Binary.MAX, Binary.MIN) and entry.exact
    return gen.add(g.binary(kind, x, y), exact)


def integer_ops(gen: GraphGen) -> Value | None:
    """An integer op: arithmetic, bitwise, shifts, comparisons; from an integer input or cast."""
    g = gen.builder
    entry = gen.pick("int")
    x = (
        entry.value
        if entry is not None
        else gen.input(gen.shape(), gen.choose((DType.I32, DType.I64)))
    )
    kinds: tuple[Binary | Unary, ...] = (
        Binary.ADD,
        Binary.MUL,
        Binary.SUB,
        Binary.MAX,
        Binary.MIN,
        Binary.DIV,
        Binary.MOD,
        Binary.FMOD,
        Binary.BITWISE_AND,
        Binary.BITWISE_OR,
        Binary.BITWISE_XOR,
        Binary.SHIFT_LEFT,
        Binary.SHIFT_RIGHT,
        Binary.LESS,
        Binary.EQUAL,
        Unary.NEG,
        Unary.ABS,
        Unary.SIGN,
        Unary.BITWISE_NOT,
        Unary.RELU,
    )
    kind = gen.choose(kinds)
    if isinstance(kind, Unary):
        return gen.add(g.unary(kind, x), True)
    if kind in (Binary.SHIFT_LEFT, Binary.SHIFT_RIGHT):
        shifts = gen.rng.integers(0, 4, gen.broadcastable(static_shape(x)))
        y = g.constant(shifts.astype(x.dtype.numpy))
    elif kind in (Binary.DIV, Binary.MOD, Binary.FMOD):
        y = gen.constant(gen.broadcastable(static_shape(x)), x.dtype, positive=True)
    else:
        y = gen.operand_for(x)
    return gen.add(g.binary(kind, x, y), True)


def logic(gen: GraphGen) -> Value | None:
    """Bool ops: and, or, xor, not, and `Where` choosing between two values."""
    g = gen.builder
    entry = gen.pick("bool")
    if entry is None:
        x = gen.float_value(exact=True)
        entry_value = g.binary(Binary.GREATER, x, gen.splat(0.0, x.dtype))
    else:
        entry_value = entry.value
    what = gen.choose(("where", "and", "or", "xor", "not"))
    if what == "not":
        return gen.add(g.unary(Unary.NOT, entry_value), True)
    if what == "where":
        same = gen.entries(
            lambda e: e.value.shape == entry_value.shape and e.value.dtype is gen.main
        )
        a = gen.choose(same).value if same else gen.input(static_shape(entry_value))
        return gen.add(g.where(entry_value, a, gen.operand_for(a)))
    same = gen.entries(lambda e: e.value.type == entry_value.type)
    shape = static_shape(entry_value)
    y = gen.choose(same).value if same else g.constant(gen.rng.random(shape) < 0.5)
    kind = {"and": Binary.AND, "or": Binary.OR, "xor": Binary.XOR}[what]
    return gen.add(g.binary(kind, entry_value, y), True)


def clamp_chain(gen: GraphGen) -> Value | None:
    """One to three of Clamp, Relu, Max and Min against constants, as exporters chain them."""
    g = gen.builder
    entry = gen.pick(gen.choose(("float", "int")))
    if entry is None:
        return None
    x = entry.value
    for _ in range(gen.integer(1, 3)):
        lo, hi = sorted((gen.choose(BOUNDS), gen.choose(BOUNDS)))
        link = gen.choose(("clamp", "relu", "max", "min", "max-left", "min-left"))
        bound = gen.choose(BOUNDS[1:-1])
        if link == "clamp":
            x = g.clamp(x, lo=lo, hi=hi)
        elif link == "relu":
            x = g.unary(Unary.RELU, x)
        else:
            unsigned = x.dtype.numpy.kind == "u"  # (a uint8 of a quantize move)
            c = gen.splat(abs(bound) if unsigned else bound, x.dtype)
            kind = Binary.MAX if link.startswith("max") else Binary.MIN
            x = g.binary(kind, c, x) if link.endswith("left") else g.binary(kind, x, c)
    return gen.add(x, entry.exact)


def cast(gen: GraphGen) -> Value | None:
    """Casts: widen and narrow back, to the same type, exact floats to integers and back."""
    g = gen.builder
    what = gen.choose(("round-trip", "same", "to-int", "from-int", "from-bool", "to-f16"))
    if what in ("round-trip", "same"):
        entry = gen.pick("float")
        if entry is None:
            return None
        x = entry.value
        if what == "same":
            return gen.add(g.apply(Cast(x.dtype), [x]), entry.exact)
        wide = DType.F64 if x.dtype is DType.F32 else DType.F32
        return gen.add(g.cast(g.cast(x, wide), x.dtype), entry.exact)
    if what in ("to-int", "to-f16"):
        entry = gen.pick("float", exact=True)
        if entry is None:
            return None
        target = DType.F16 if what == "to-f16" else gen.choose((DType.I32, DType.I64))
        narrow = g.cast(entry.value, target)
        return gen.add(g.cast(narrow, gen.main) if what == "to-f16" else narrow, True)
    entry = gen.pick("int" if what == "from-int" else "bool")
    if entry is None:
        return None
    return gen.add(g.cast(entry.value, gen.main), True)
