"""Moves for the ops that combine many elements.

They make reductions, arg-reductions, cumulative sums, softmax, norms, matmuls (with bias and
activation), convolutions (with BatchNorm written out), pools and attention.
"""

from __future__ import annotations

import math

from knopt.ir.graph import Value
from knopt.ir.op import Attention, PoolKind, Reduction, Unary
from knopt.testing.generator import GraphGen, static_shape

ACTIVATIONS = ("none", "relu", "relu6", "gelu", "gelu-tanh", "sigmoid", "tanh", "silu")


def activation(gen: GraphGen, x: Value) -> Value:
    """`x` through a random activation, as exporters write them (Relu6 as a clip)."""
    g = gen.builder
    what = gen.choose(ACTIVATIONS)
    if what == "none":
        return x
    if what == "relu":
        return g.unary(Unary.RELU, x)
    if what == "relu6":
        return g.clamp(x, lo=0.0, hi=6.0)
    kinds = {
        "gelu": Unary.GELU,
        "gelu-tanh": Unary.GELU_TANH,
        "sigmoid": Unary.SIGMOID,
        "tanh": Unary.TANH,
        "silu": Unary.SILU,
    }
    return g.unary(kinds[what], x)


def reduce(gen: GraphGen) -> Value | None:
    """A sum, product, max or min over random axes (products over a few elements only)."""
    entry = gen.pick(gen.choose(("float", "int")), min_rank=1)
    if entry is None:
        return None
    x = entry.value
    axes = sorted({gen.integer(0, x.rank - 1) for _ in range(gen.integer(1, x.rank))})
    count = math.prod(static_shape(x)[a] for a in axes)
    kinds = [Reduction.SUM, Reduction.MAX, Reduction.MIN] + ([Reduction.PROD] if count <= 6 else [])
    kind = gen.choose(kinds)
    exact = entry.exact and (kind in (Reduction.MAX, Reduction.MIN) or x.dtype.is_int)
    return gen.add(gen.builder.reduce(kind, x, axes=axes), exact)


def arg_or_cumsum(gen: GraphGen) -> Value | None:
    """ArgMax/ArgMin or ArgSort of an exact value, or a cumulative sum."""
    g = gen.builder
    what = gen.choose(("arg-reduce", "arg-sort", "cumsum"))
    entry = gen.pick(gen.choose(("float", "int")), min_rank=1, exact=what != "cumsum")
    if entry is None:
        return None
    x = entry.value
    axis = gen.integer(0, x.rank - 1)
    if what == "arg-reduce":
        return gen.add(g.arg_reduce(x, axis=axis, largest=gen.boolean(), last=gen.boolean()), True)
    if what == "arg-sort":
        return gen.add(g.arg_sort(x, axis=axis, descending=gen.boolean()), True)
    y = g.cumsum(x, axis=axis, exclusive=gen.boolean(), reverse=gen.boolean())
    return gen.add(y, x.dtype.is_int and entry.exact)


def softmax_or_norm(gen: GraphGen) -> Value | None:
    """Softmax along any axis, or LayerNorm / RmsNorm of an input from any axis on."""
    g = gen.builder
    what = gen.choose(("softmax", "layer-norm", "rms-norm"))
    if what == "softmax":
        x = gen.float_value(min_rank=1)
        return gen.add(g.softmax(x, axis=gen.integer(0, x.rank - 1)))
    x = gen.normalizable()
    axis = gen.integer(0, x.rank - 1)
    eps = gen.choose((1e-5, 1e-6, 1e-3))
    if what == "layer-norm":
        return gen.add(g.layer_norm(x, axis=axis, eps=eps))
    return gen.add(g.rms_norm(x, axis=axis, eps=eps))


def matmul(gen: GraphGen) -> Value | None:
    """`act(x @ w [* scale] [+ bias])` with constant or input weights, batch dims broadcast."""
    g = gen.builder
    x = gen.float_value(min_rank=1)
    if x.rank == 1:
        x = g.view(x, (1, *x.shape))
    k, n = static_shape(x)[-1], gen.dim()
    w = gen.constant((k, n)) if gen.boolean(0.7) else gen.input((k, n))
    if x.rank > 2:
        w = g.broadcast(w, (*x.shape[:-2], k, n))
    y = g.matmul(x, w)
    if gen.boolean(0.3):
        scale = gen.splat(gen.choose((0.5, 0.125, 2.0))) if gen.boolean() else gen.constant((n,))
        y = g.mul(y, scale)
    if gen.boolean(0.6):
        y = g.add(y, gen.constant((n,)))
    if gen.boolean(0.3):
        residual = gen.pick("float")
        if residual is not None and residual.value.shape == y.shape:
            y = g.add(y, residual.value)
    return gen.add(activation(gen, y))


def _conv_input(gen: GraphGen, spatial: int) -> Value:
    entry = gen.pick("float", min_rank=spatial + 2)
    if entry is not None and entry.value.rank == spatial + 2:
        return entry.value
    return gen.input((gen.integer(1, 2), gen.integer(1, 4), *gen.shape(spatial)))


def conv(gen: GraphGen) -> Value | None:
    """A 1-d or 2-d convolution, then BatchNorm written out, an activation, a residual."""
    g = gen.builder
    x = _conv_input(gen, gen.integer(1, 2))
    spatial = x.rank - 2
    channels = static_shape(x)[1]
    groups = gen.choose([d for d in (1, 2, channels) if channels % d == 0])
    out = groups * gen.integer(1, 2)
    kernel = tuple(gen.integer(1, 3) for _ in range(spatial))
    w = gen.constant((out, channels // groups, *kernel))
    pads = tuple((gen.integer(0, 1), gen.integer(0, 1)) for _ in range(spatial))
    strides = tuple(gen.integer(1, 2) for _ in range(spatial))
    dilations = tuple(gen.integer(1, 2) for _ in range(spatial))
    if any(
        d + a + b < (k - 1) * dl + 1
        for d, (a, b), k, dl in zip(static_shape(x)[2:], pads, kernel, dilations, strict=True)
    ):
        return None
    y = g.conv(x, w, strides=strides, pads=pads, dilations=dilations, groups=groups)
    channel = (out,) + (1,) * spatial
    if gen.boolean(0.6):  # BatchNorm as exporters decompose it
        mean, var = gen.constant(channel), gen.constant(channel, positive=True)
        eps = gen.splat(1e-5)
        y = g.div(g.sub(y, mean), g.unary(Unary.SQRT, g.add(var, eps)))
        y = g.add(g.mul(y, gen.constant(channel)), gen.constant(channel))
    elif gen.boolean():
        y = g.add(y, gen.constant(channel))
    if gen.boolean(0.3):
        y = g.add(y, gen.input(static_shape(y)))
    return gen.add(activation(gen, y))


def pool(gen: GraphGen) -> Value | None:
    """A max or average pool with strides, pads below the window, dilations and ceil mode."""
    g = gen.builder
    x = _conv_input(gen, gen.integer(1, 2))
    spatial = x.rank - 2
    kernel = tuple(gen.integer(1, 3) for _ in range(spatial))
    pads = tuple((gen.integer(0, (k - 1) // 2), gen.integer(0, (k - 1) // 2)) for k in kernel)
    dilations = tuple(1 if any(p) else gen.integer(1, 2) for p in pads)
    if any(
        d + a + b < (k - 1) * dl + 1
        for d, (a, b), k, dl in zip(static_shape(x)[2:], pads, kernel, dilations, strict=True)
    ):
        return None
    y = g.pool(
        gen.choose((PoolKind.MAX, PoolKind.AVG)),
        x,
        kernel=kernel,
        strides=tuple(gen.integer(1, 2) for _ in range(spatial)),
        pads=pads,
        dilations=dilations,
        ceil_mode=gen.boolean(0.3),
        count_include_pad=gen.boolean(0.3),
    )
    return gen.add(y)


def attention_op(gen: GraphGen) -> Value | None:
    """The Attention op on inputs, with a mask bias that blocks some keys."""
    g = gen.builder
    lead = gen.shape(gen.integer(0, 2))
    s, t, d, e = (gen.integer(1, 4) for _ in range(4))
    q, k, v = gen.input((*lead, s, d)), gen.input((*lead, t, d)), gen.input((*lead, t, e))
    blocked = gen.rng.random((*lead, s, t)) < 0.3
    blocked[..., 0] = False  # every query attends to at least one key
    bias = g.constant(
        gen.rng.uniform(-1, 1, blocked.shape).astype(gen.main.numpy)
        - 1e4 * blocked.astype(gen.main.numpy)
    )
    return gen.add(g.apply(Attention(1 / math.sqrt(d)), [q, k, v, bias]))
