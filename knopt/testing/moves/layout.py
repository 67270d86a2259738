"""Data-movement moves, and the index makers `Iota` and `Sizes`.

The moves make views, broadcasts, permutes, slices, flips, pads, concats, gathers and scatters.
They copy elements without arithmetic, so they keep a value exact. Some moves also write the
no-op forms that the builder would skip (a permute by the identity, a slice of everything, a
broadcast to the same shape), because exporters write those and rules remove them.
"""

from __future__ import annotations

import numpy as np

from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.graph import Value
from knopt.ir.op import PadMode, Reduction, ScatterReduction
from knopt.testing.generator import GraphGen, Shape, static_shape


def _reshaped(gen: GraphGen, shape: Shape) -> Shape:
    """Another shape of the same element count: dims merged, split, or 1s added or removed."""
    dims = list(shape)
    what = gen.choose(("merge", "split", "unsqueeze", "squeeze"))
    if what == "merge" and len(dims) >= 2:
        i = gen.integer(0, len(dims) - 2)
        dims[i : i + 2] = [dims[i] * dims[i + 1]]
    elif what == "split" and any(d > 1 for d in dims):
        i = gen.choose([i for i, d in enumerate(dims) if d > 1])
        factors = [f for f in range(1, dims[i] + 1) if dims[i] % f == 0]
        f = gen.choose(factors)
        dims[i : i + 1] = [f, dims[i] // f]
    elif what == "squeeze" and 1 in dims and len(dims) > 1:
        dims.pop(dims.index(1))
    elif len(dims) < 5:
        dims.insert(gen.integer(0, len(dims)), 1)
    return tuple(dims)


def view(gen: GraphGen) -> Value | None:
    """A reshape, sometimes of a reshape."""
    entry = gen.pick("any")
    if entry is None:
        return None
    x = gen.builder.view(entry.value, _reshaped(gen, static_shape(entry.value)))
    if gen.boolean(0.3):
        x = gen.builder.view(x, _reshaped(gen, static_shape(x)))
    return gen.add(x, entry.exact)


def broadcast(gen: GraphGen) -> Value | None:
    """A broadcast of size-1 axes (a leading axis added first if there are none)."""
    g = gen.builder
    entry = gen.pick("any")
    if entry is None:
        return None
    x = entry.value
    if gen.boolean(0.1):
        return gen.add(g.apply(ops.Broadcast(x.shape), [x]), entry.exact)
    if 1 not in x.shape:
        x = g.view(x, (1, *x.shape))
    target = tuple(gen.integer(1, 3) if d == 1 else d for d in x.shape)
    if gen.boolean(0.3):
        middle = tuple(t if gen.boolean() else d for d, t in zip(x.shape, target, strict=True))
        x = g.broadcast(x, middle)
    return gen.add(g.broadcast(x, target), entry.exact)


def permute(gen: GraphGen) -> Value | None:
    """A permutation of the axes; sometimes two in a row, or the identity written out."""
    g = gen.builder
    entry = gen.pick("any", min_rank=1)
    if entry is None:
        return None
    x = entry.value
    if gen.boolean(0.1):
        return gen.add(g.apply(ops.Permute(tuple(range(x.rank))), [x]), entry.exact)
    for _ in range(gen.integer(1, 2)):
        perm = [int(p) for p in gen.rng.permutation(x.rank)]
        x = g.permute(x, perm)
    return gen.add(x, entry.exact)


def slice_(gen: GraphGen) -> Value | None:
    """A strided slice of one axis, or a slice of everything written out."""
    g = gen.builder
    entry = gen.pick("any", min_rank=1)
    if entry is None:
        return None
    x = entry.value
    axis = gen.integer(0, x.rank - 1)
    size = static_shape(x)[axis]
    if gen.boolean(0.15):
        return gen.add(g.apply(ops.Slice(axis, 0, size, 1), [x]), entry.exact)
    start = gen.integer(0, size - 1)
    stop = gen.integer(start + 1, size)
    return gen.add(
        g.slice(x, axis=axis, start=start, stop=stop, step=gen.integer(1, 2)), entry.exact
    )


def flip_or_pad(gen: GraphGen) -> Value | None:
    """A flip of one axis, or a pad in one of the four modes."""
    g = gen.builder
    entry = gen.pick("any", min_rank=1)
    if entry is None:
        return None
    x = entry.value
    if gen.boolean():
        return gen.add(g.flip(x, axis=gen.integer(0, x.rank - 1)), entry.exact)
    pads = tuple((gen.integer(0, 2), gen.integer(0, 2)) for _ in range(x.rank))
    mode = gen.choose(list(PadMode))
    value = gen.choose((0.0, 1.5, -2.0))
    return gen.add(g.pad(x, pads=pads, mode=mode, value=value), entry.exact)


def concat(gen: GraphGen) -> Value | None:
    """Two or three values joined along an axis on which only their sizes differ."""
    g = gen.builder
    entry = gen.pick("any", min_rank=1)
    if entry is None:
        return None
    x = entry.value
    axis = gen.integer(0, x.rank - 1)

    def fits(v: Value) -> bool:
        rest = [d for i, d in enumerate(v.shape) if i != axis]
        return (
            v.rank == x.rank
            and v.dtype is x.dtype
            and rest == [d for i, d in enumerate(x.shape) if i != axis]
        )

    parts = [x]
    exact = entry.exact
    for _ in range(gen.integer(1, 2)):
        found = gen.entries(lambda e: fits(e.value))
        other = gen.choose(found)
        parts.append(other.value)
        exact = exact and other.exact
    return gen.add(g.concat(parts, axis=axis), exact)


def gather(gen: GraphGen) -> Value | None:
    """A gather with constant indices (negative ones too) of rank 0 to 2."""
    g = gen.builder
    entry = gen.pick("any", min_rank=1)
    if entry is None:
        return None
    x = entry.value
    axis = gen.integer(0, x.rank - 1)
    size = static_shape(x)[axis]
    shape = tuple(gen.integer(1, 3) for _ in range(gen.integer(0, 2)))
    indices = gen.rng.integers(-size, size, shape).astype(np.int64)
    return gen.add(g.gather(x, g.constant(indices), axis=axis), entry.exact)


def scatter(gen: GraphGen) -> Value | None:
    """A scatter of updates at constant indices, with any reduction."""
    g = gen.builder
    entry = gen.pick("any", min_rank=1)
    if entry is None or entry.value.dtype is DType.BOOL:
        return None
    x = entry.value
    axis = gen.integer(0, x.rank - 1)
    shape = tuple(gen.integer(1, d) for d in static_shape(x))
    size = static_shape(x)[axis]
    indices = g.constant(gen.rng.integers(-size, size, shape).astype(np.int64))
    updates = gen.constant(shape, x.dtype)
    reduction = gen.choose(list(ScatterReduction))
    exact = entry.exact and reduction in (
        ScatterReduction.NONE,
        ScatterReduction.MAX,
        ScatterReduction.MIN,
    )
    return gen.add(g.scatter(x, indices, updates, axis=axis, reduction=reduction), exact)


def index_makers(gen: GraphGen) -> Value | None:
    """`Iota` along the last axis, or `Sizes` of a shape, mixed into a float value."""
    g = gen.builder
    x = gen.float_value(min_rank=1)
    if gen.boolean():
        dtype = gen.choose((DType.I64, DType.I32, gen.main))
        ramp = g.cast(g.iota(x.shape[-1], dtype), x.dtype)
        return gen.add(g.add(x, ramp))
    sizes = g.apply(ops.Sizes(tuple(x.shape)), [])
    total = g.reduce(Reduction.SUM, g.cast(sizes, x.dtype), axes=[0])
    return gen.add(g.mul(x, total))
