"""Moves that write out what the rules look for, in the variants exporters produce.

They write affine chains, LayerNorm and RMSNorm, GELU (erf and tanh), SiLU, Sigmoid,
HardSigmoid, HardSwish, softmax from exp and sum, attention, SwiGLU, rotary embeddings (and
the Rope op they become, so that random graphs hold it), and neutral elements and no-ops.
"""

from __future__ import annotations

import math

import numpy as np

from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.graph import Value
from knopt.ir.op import Binary, Reduction, Unary
from knopt.testing.generator import GraphGen, static_shape


def affine_chain(gen: GraphGen) -> Value | None:
    """Two to four scales and biases (per channel or scalar; subtract and divide too)."""
    g = gen.builder
    x = gen.float_value(min_rank=1)
    axis = gen.integer(0, x.rank - 1)
    for _ in range(gen.integer(2, 4)):
        full = static_shape(x)
        shape = full if gen.boolean(0.2) else gen.per_channel(full, axis)
        c = (
            gen.constant(shape, positive=True)
            if gen.boolean(0.7)
            else gen.splat(gen.choose((1.5, 2.0, 0.5)))
        )
        kind = gen.choose((Binary.MUL, Binary.ADD, Binary.SUB, Binary.DIV))
        left = kind in (Binary.MUL, Binary.ADD) and gen.boolean(0.3)
        x = g.binary(kind, c, x) if left else g.binary(kind, x, c)
    return gen.add(x)


def _mean_last(gen: GraphGen, x: Value) -> Value:
    """The mean over the last axis as exporters write it: a sum times 1/n, or divided by n."""
    g = gen.builder
    total = g.reduce(Reduction.SUM, x, axes=[x.rank - 1])
    n = float(static_shape(x)[-1])
    return g.mul(total, gen.splat(1 / n)) if gen.boolean() else g.div(total, gen.splat(n))


def _square(gen: GraphGen, x: Value) -> Value:
    g = gen.builder
    return g.mul(x, x) if gen.boolean() else g.binary(Binary.POW, x, gen.splat(2.0))


def _inverse_root(gen: GraphGen, x: Value, v: Value) -> Value:
    """`x / sqrt(v)` in one of its spellings."""
    g = gen.builder
    what = gen.choose(("div-sqrt", "mul-rsqrt", "mul-reciprocal-sqrt"))
    if what == "div-sqrt":
        return g.div(x, g.unary(Unary.SQRT, v))
    if what == "mul-rsqrt":
        return g.mul(x, g.unary(Unary.RSQRT, v))
    return g.mul(x, g.unary(Unary.RECIPROCAL, g.unary(Unary.SQRT, v)))


def _affine_tail(gen: GraphGen, y: Value) -> Value:
    g = gen.builder
    n = static_shape(y)[-1]
    if gen.boolean(0.6):
        y = g.mul(y, gen.constant((n,)))
    if gen.boolean(0.6):
        y = g.add(y, gen.constant((n,)))
    return y


def layer_norm(gen: GraphGen) -> Value | None:
    """LayerNorm over the last axis, written out, with its affine tail."""
    g = gen.builder
    x = gen.normalizable()
    d = g.sub(x, _mean_last(gen, x))
    var = _mean_last(gen, _square(gen, d))
    eps = gen.splat(gen.choose((1e-5, 1e-6, 1e-12)))
    return gen.add(_affine_tail(gen, _inverse_root(gen, d, g.add(var, eps))))


def rms_norm(gen: GraphGen) -> Value | None:
    """RMSNorm over the last axis, written out (LLaMA's x * rsqrt(mean(x^2) + eps))."""
    g = gen.builder
    x = gen.normalizable()
    ms = _mean_last(gen, _square(gen, x))
    eps = gen.splat(gen.choose((1e-5, 1e-6)))
    return gen.add(_affine_tail(gen, _inverse_root(gen, x, g.add(ms, eps))))


def _half_product(gen: GraphGen, x: Value, t: Value) -> Value:
    """`x * t * 0.5` in the three orders exporters use."""
    g = gen.builder
    half = gen.splat(0.5)
    what = gen.choose(("x-t-half", "x-half-t", "x-(t-half)"))
    if what == "x-t-half":
        return g.mul(g.mul(x, t), half)
    if what == "x-half-t":
        return g.mul(g.mul(x, half), t)
    return g.mul(x, g.mul(t, half))


def _plus_one(gen: GraphGen, x: Value) -> Value:
    g = gen.builder
    one = gen.splat(1.0)
    return g.add(x, one) if gen.boolean() else g.add(one, x)


def gelu(gen: GraphGen) -> Value | None:
    """GELU written out: the erf form, or the tanh form with a cube or a power of 3."""
    g = gen.builder
    x = gen.float_value()
    if gen.boolean():
        scaled = (
            g.div(x, gen.splat(math.sqrt(2.0)))
            if gen.boolean()
            else g.mul(x, gen.splat(1 / math.sqrt(2.0)))
        )
        return gen.add(_half_product(gen, x, _plus_one(gen, g.unary(Unary.ERF, scaled))))
    x = gen.bounded(x, 6.0)
    cube = g.binary(Binary.POW, x, gen.splat(3.0)) if gen.boolean() else g.mul(g.mul(x, x), x)
    inner = g.add(x, g.mul(cube, gen.splat(0.044715)))
    t = g.unary(Unary.TANH, g.mul(inner, gen.splat(math.sqrt(2 / math.pi))))
    return gen.add(_half_product(gen, x, _plus_one(gen, t)))


def gates(gen: GraphGen) -> Value | None:
    """SiLU, Sigmoid, HardSigmoid and HardSwish written out, each in two spellings."""
    g = gen.builder
    x = gen.float_value()
    what = gen.choose(("silu", "sigmoid", "hard-sigmoid", "hard-swish"))
    if what == "silu":
        s = g.unary(Unary.SIGMOID, x)
        return gen.add(g.mul(x, s) if gen.boolean() else g.mul(s, x))
    if what == "sigmoid":
        denominator = _plus_one(gen, g.unary(Unary.EXP, g.unary(Unary.NEG, gen.bounded(x, 20))))
        if gen.boolean():
            return gen.add(g.div(gen.splat(1.0), denominator))
        return gen.add(g.unary(Unary.RECIPROCAL, denominator))
    sixth = gen.splat(1 / 6) if gen.boolean() else None
    relu6 = g.clamp(g.add(x, gen.splat(3.0)), lo=0.0, hi=6.0)
    scaled = g.mul(relu6, sixth) if sixth is not None else g.div(relu6, gen.splat(6.0))
    if what == "hard-sigmoid":
        if gen.boolean():
            return gen.add(scaled)
        inner = g.add(g.mul(x, gen.splat(1 / 6)), gen.splat(0.5))
        return gen.add(g.clamp(inner, lo=0.0, hi=1.0))
    if gen.boolean():
        return gen.add(g.mul(x, g.unary(Unary.HARD_SIGMOID, x)))
    return gen.add(g.mul(g.mul(x, relu6), gen.splat(1 / 6)))


def softmax(gen: GraphGen) -> Value | None:
    """Softmax from exp, max and sum: shifted or not, mostly over the last axis."""
    g = gen.builder
    x = gen.bounded(gen.float_value(min_rank=1), 8.0)
    axis = x.rank - 1 if gen.boolean(0.8) else gen.integer(0, x.rank - 1)
    if gen.boolean():
        x = g.sub(x, g.reduce(Reduction.MAX, x, axes=[axis]))
    e = g.unary(Unary.EXP, x)
    return gen.add(g.div(e, g.reduce(Reduction.SUM, e, axes=[axis])))


def attention(gen: GraphGen) -> Value | None:
    """softmax(q @ k^T * scale [+ mask]) @ v, with k^T a permute, heads split or not."""
    g = gen.builder
    lead = gen.shape(gen.integer(0, 2))
    s, t, d, e = (gen.integer(1, 4) for _ in range(4))
    q, k, v = gen.input((*lead, s, d)), gen.input((*lead, t, d)), gen.input((*lead, t, e))
    perm = [*range(len(lead)), len(lead) + 1, len(lead)]
    scores = g.matmul(q, g.permute(k, perm))
    what = gen.choose(("mul", "div", "none"))
    if what == "mul":
        scores = g.mul(scores, gen.splat(1 / math.sqrt(d)))
    elif what == "div":
        scores = g.div(scores, gen.splat(math.sqrt(d)))
    if gen.boolean():
        blocked = gen.rng.random((*lead, s, t)) < 0.3
        blocked[..., 0] = False
        scores = g.add(scores, g.constant(np.where(blocked, -1e4, 0.0).astype(gen.main.numpy)))
    return gen.add(g.matmul(g.softmax(scores, axis=scores.rank - 1), v))


def _rope_input(gen: GraphGen) -> tuple[Value, Value, Value]:
    """Operands of a rope: x `[..., s, 2h]` (from the pool if one fits), cos and sin `[s, 2h]`."""
    entry = gen.pick("float", min_rank=2)
    if entry is not None and static_shape(entry.value)[-1] % 2 == 0:
        x = entry.value
    else:
        x = gen.input((*gen.shape(gen.integer(0, 2)), gen.dim(), 2 * gen.integer(1, 3)))
    table = static_shape(x)[-2:]
    return x, gen.constant(table), gen.constant(table)


def rope(gen: GraphGen) -> Value | None:
    """The rotary template, x * cos + concat(-x2, x1) * sin, with operands in either order."""
    g = gen.builder
    x, cos, sin = _rope_input(gen)
    h = static_shape(x)[-1] // 2
    last = x.rank - 1
    lower, upper = (
        g.slice(x, axis=last, start=0, stop=h),
        g.slice(x, axis=last, start=h, stop=2 * h),
    )
    rotated = g.concat([g.unary(Unary.NEG, upper), lower], axis=last)

    def times(a: Value, b: Value) -> Value:
        return g.mul(a, b) if gen.boolean() else g.mul(b, a)

    kept, turned = times(x, cos), times(rotated, sin)
    return gen.add(g.add(kept, turned) if gen.boolean() else g.add(turned, kept))


def rope_op(gen: GraphGen) -> Value | None:
    """The Rope op, with per-position cos and sin tables broadcast over the leading axes."""
    x, cos, sin = _rope_input(gen)
    return gen.add(gen.builder.rope(x, cos, sin))


def swiglu(gen: GraphGen) -> Value | None:
    """silu(x @ wg) * (x @ wu) with constant weights (LLaMA's MLP)."""
    g = gen.builder
    x = gen.input(gen.shape(gen.integer(2, 3)))
    k, n = static_shape(x)[-1], gen.dim()
    lead = static_shape(x)[:-2]
    wg = g.broadcast(gen.constant((k, n)), (*lead, k, n))
    wu = g.broadcast(gen.constant((k, n)), (*lead, k, n))
    gate = g.matmul(x, wg)
    silu = g.unary(Unary.SILU, gate) if gen.boolean() else g.mul(gate, g.unary(Unary.SIGMOID, gate))
    return gen.add(g.mul(silu, g.matmul(x, wu)))


def neutral(gen: GraphGen) -> Value | None:
    """A neutral element or an involution: x + 0, x * 1, x / 1, x ** 1, --x, x * 0 (ints)."""
    g = gen.builder
    what = gen.choose(
        (
            "add-0",
            "0-add",
            "sub-0",
            "mul-1",
            "1-mul",
            "div-1",
            "pow-1",
            "neg-neg",
            "int-mul-0",
            "and-false",
            "or-true",
            "not-not",
        )
    )
    if what in ("and-false", "or-true", "not-not"):
        entry = gen.pick("bool")
        if entry is None:
            return None
        b = entry.value
        if what == "not-not":
            return gen.add(g.unary(Unary.NOT, g.unary(Unary.NOT, b)), True)
        kind = Binary.AND if what == "and-false" else Binary.OR
        return gen.add(g.binary(kind, b, g.constant(what == "or-true")), True)
    if what == "int-mul-0":
        entry = gen.pick("int")
        if entry is None:
            return None
        return gen.add(g.mul(entry.value, g.constant(np.array(0, entry.value.dtype.numpy))), True)
    entry = gen.pick("float")
    if entry is None:
        return None
    x = entry.value
    one, zero = gen.splat(1.0), gen.splat(0.0)
    made = {
        "add-0": lambda: g.add(x, zero),
        "0-add": lambda: g.add(zero, x),
        "sub-0": lambda: g.sub(x, zero),
        "mul-1": lambda: g.mul(x, one),
        "1-mul": lambda: g.mul(one, x),
        "div-1": lambda: g.div(x, one),
        "pow-1": lambda: g.binary(Binary.POW, x, one),
        "neg-neg": lambda: g.unary(Unary.NEG, g.unary(Unary.NEG, x)),
    }[what]()
    return gen.add(made, entry.exact)


def no_op_views(gen: GraphGen) -> Value | None:
    """Views that change nothing, as exporters leave them: reshape or cast to the same type."""
    g = gen.builder
    entry = gen.pick("any")
    if entry is None:
        return None
    x = entry.value
    if gen.boolean():
        return gen.add(g.apply(ops.View(x.shape), [x]), entry.exact)
    if x.dtype is DType.BOOL:
        return None
    return gen.add(g.apply(ops.Cast(x.dtype), [x]), entry.exact)
