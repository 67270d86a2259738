"""Importers of the ONNX recurrent layers RNN, GRU and LSTM, unrolled over the sequence.

The input projections of every time step are one batched matmul; the recurrence then unrolls
over the static sequence length, one small matmul and a few elementwise ops per step and
direction. Gate layouts follow the ONNX spec: GRU `zrh`, LSTM `iofc` with peepholes `iof`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx

from knopt.ir.graph import Value
from knopt.ir.op import Binary, Unary
from knopt.onnx.context import Attributes, ImportContext, OnnxValue, importer
from knopt.onnx.ops.common import matmul, scalar_like, static_dim

Activation = Callable[[Value], Value]

_DEFAULT_ALPHA = {
    "LeakyRelu": 0.01,
    "ThresholdedRelu": 1.0,
    "ScaledTanh": 1.0,
    "HardSigmoid": 0.2,
    "Elu": 1.0,
    "Affine": 1.0,
}
_DEFAULT_BETA = {"ScaledTanh": 1.0, "HardSigmoid": 0.5, "Affine": 0.0}


def _activation(
    ctx: ImportContext, name: str, alpha: float | None, beta: float | None
) -> Activation:
    """The ONNX recurrent activation `name` (case-insensitive) as a graph function."""
    b = ctx.builder
    canonical = {
        n.lower(): n for n in (*_DEFAULT_ALPHA, "Relu", "Tanh", "Sigmoid", "Softsign", "Softplus")
    }.get(name.lower())
    if canonical is None:
        raise ctx.fail(f"recurrent activation '{name}' is not supported")
    a = _DEFAULT_ALPHA.get(canonical, 0.0) if alpha is None else alpha
    c = _DEFAULT_BETA.get(canonical, 0.0) if beta is None else beta

    def k(x: Value, value: float) -> Value:
        return scalar_like(ctx, x, value)

    table: dict[str, Activation] = {
        "Relu": lambda x: b.unary(Unary.RELU, x),
        "Tanh": lambda x: b.unary(Unary.TANH, x),
        "Sigmoid": lambda x: b.unary(Unary.SIGMOID, x),
        "Softsign": lambda x: b.div(x, b.add(b.unary(Unary.ABS, x), k(x, 1))),
        "Softplus": lambda x: b.unary(Unary.SOFTPLUS, x),
        "Affine": lambda x: b.add(b.mul(x, k(x, a)), k(x, c)),
        "LeakyRelu": lambda x: b.where(b.binary(Binary.LESS, x, k(x, 0)), b.mul(x, k(x, a)), x),
        "ThresholdedRelu": lambda x: b.where(b.binary(Binary.GREATER, x, k(x, a)), x, k(x, 0)),
        "ScaledTanh": lambda x: b.mul(b.unary(Unary.TANH, b.mul(x, k(x, c))), k(x, a)),
        "HardSigmoid": lambda x: b.clamp(b.add(b.mul(x, k(x, a)), k(x, c)), lo=0.0, hi=1.0),
        "Elu": lambda x: b.where(
            b.binary(Binary.LESS, x, k(x, 0)),
            b.mul(b.sub(b.unary(Unary.EXP, x), k(x, 1)), k(x, a)),
            x,
        ),
    }
    return table[canonical]


@dataclass(frozen=True)
class _Layer:
    """What one recurrent node computes, per direction."""

    gates: int
    hidden: int
    activations: list[list[Activation]]  # per direction
    clip: float | None
    directions: list[bool]  # per direction: runs backwards in time


def _layer(
    ctx: ImportContext, attrs: Attributes, gates: int, defaults: list[str], w: Value
) -> _Layer:
    direction = attrs.string("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ctx.fail(f"direction '{direction}' is not forward, reverse or bidirectional")
    count = 2 if direction == "bidirectional" else 1
    if w.shape[0] != count:
        raise ctx.fail(f"direction '{direction}' needs W for {count} direction(s), got {w.type}")
    names = attrs.strings("activations", defaults * count)
    alphas = attrs.floats("activation_alpha", [])
    betas = attrs.floats("activation_beta", [])
    if len(names) != len(defaults) * count:
        raise ctx.fail(f"activations {names} need {len(defaults)} per direction")
    functions = [
        _activation(
            ctx, n, alphas[i] if i < len(alphas) else None, betas[i] if i < len(betas) else None
        )
        for i, n in enumerate(names)
    ]
    per = len(defaults)
    hidden = attrs.int("hidden_size", static_dim(ctx, w.shape[1], "W") // gates)
    clip = attrs.float("clip") if attrs.has("clip") else None
    backwards = [direction == "reverse"] if count == 1 else [False, True]
    return _Layer(
        gates, hidden, [functions[i * per : (i + 1) * per] for i in range(count)], clip, backwards
    )


def _pick(ctx: ImportContext, x: Value, index: int) -> Value:
    """Entry `index` of the leading axis, dropped."""
    b = ctx.builder
    return b.view(b.slice(x, axis=0, start=index, stop=index + 1), x.shape[1:])


def _part(ctx: ImportContext, x: Value, index: int, size: int) -> Value:
    """Chunk `index` of `size` along the last axis."""
    return ctx.builder.slice(x, axis=x.rank - 1, start=index * size, stop=(index + 1) * size)


def _clip(ctx: ImportContext, layer: _Layer, x: Value) -> Value:
    return x if layer.clip is None else ctx.builder.clamp(x, lo=-layer.clip, hi=layer.clip)


def _inputs(ctx: ImportContext, node: onnx.NodeProto, count: int) -> list[Value | None]:
    values: list[Value | None] = list(ctx.inputs(node, count=(3, count)))
    x = values[0]
    assert x is not None
    steps = x.shape[0] if not ctx.attributes(node).int("layout", 0) else x.shape[1]
    if values[4] is not None:
        lengths = ctx.known_input(node, 4, "sequence_lens")
        assert lengths is not None
        if np.any(lengths != steps):
            raise ctx.fail("sequence_lens shorter than the sequence are not supported")
    return values


def _time_major(
    ctx: ImportContext, attrs: Attributes, x: Value, h: Value | None
) -> tuple[Value, Value | None]:
    """Inputs in the `[seq, batch, ...]` and `[dirs, batch, hidden]` layout."""
    if not attrs.int("layout", 0):
        return x, h
    b = ctx.builder
    return b.permute(x, (1, 0, 2)), None if h is None else b.permute(h, (1, 0, 2))


def _outputs(
    ctx: ImportContext, attrs: Attributes, ys: list[list[Value]], finals: list[list[Value]]
) -> list[OnnxValue]:
    """Y `[seq, dirs, batch, hidden]` and the final states `[dirs, batch, hidden]`."""
    b = ctx.builder
    per_direction = []
    for steps in ys:
        stacked = b.concat([b.view(h, (1, 1, *h.shape)) for h in steps], axis=0)
        per_direction.append(stacked)
    y = b.concat(per_direction, axis=1)
    states = [b.concat([b.view(s, (1, *s.shape)) for s in kind], axis=0) for kind in finals]
    if attrs.int("layout", 0):
        y = b.permute(y, (2, 0, 1, 3))
        states = [b.permute(s, (1, 0, 2)) for s in states]
    return [y, *states]


def _projections(
    ctx: ImportContext, x: Value, w: Value, bias: Value | None, d: int, width: int
) -> tuple[Value, Value | None]:
    """`X @ W^T` for every step of direction `d`, and the recurrence bias `Rb`."""
    b = ctx.builder
    projected = matmul(ctx, x, b.permute(_pick(ctx, w, d), (1, 0)))
    if bias is None:
        return projected, None
    both = _pick(ctx, bias, d)
    return b.add(projected, _part(ctx, both, 0, width)), _part(ctx, both, 1, width)


def _initial(ctx: ImportContext, h: Value | None, d: int, x: Value, hidden: int) -> Value:
    if h is not None:
        return _pick(ctx, h, d)
    return ctx.builder.scalar(0.0, x.dtype, (x.shape[1], hidden))


@importer("RNN", since=7)
def _rnn(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x, w, r, bias, _, h0 = _inputs(ctx, node, 6)
    attrs = ctx.attributes(node)
    assert x is not None and w is not None and r is not None
    layer = _layer(ctx, attrs, 1, ["Tanh"], w)
    x, h0 = _time_major(ctx, attrs, x, h0)
    b = ctx.builder
    ys, finals = [], []
    for d, backwards in enumerate(layer.directions):
        projected, rb = _projections(ctx, x, w, bias, d, layer.hidden)
        recurrent = b.permute(_pick(ctx, r, d), (1, 0))
        (f,) = layer.activations[d]
        h = _initial(ctx, h0, d, x, layer.hidden)
        steps = []
        for t in _order(ctx, x, backwards):
            gates = b.add(_pick(ctx, projected, t), b.matmul(h, recurrent))
            gates = gates if rb is None else b.add(gates, rb)
            h = f(_clip(ctx, layer, gates))
            steps.append(h)
        ys.append(steps[::-1] if backwards else steps)
        finals.append(h)
    return _outputs(ctx, attrs, ys, [finals])


def _order(ctx: ImportContext, x: Value, backwards: bool) -> range:
    steps = x.shape[0]
    if not isinstance(steps, int):
        raise ctx.fail_symbolic(
            f"recurrent layers unroll over the sequence, whose length {steps} is symbolic"
        )
    return range(steps - 1, -1, -1) if backwards else range(steps)


@importer("GRU", since=7)
def _gru(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x, w, r, bias, _, h0 = _inputs(ctx, node, 6)
    attrs = ctx.attributes(node)
    assert x is not None and w is not None and r is not None
    layer = _layer(ctx, attrs, 3, ["Sigmoid", "Tanh"], w)
    before_reset = bool(attrs.int("linear_before_reset", 0))
    x, h0 = _time_major(ctx, attrs, x, h0)
    b = ctx.builder
    n = layer.hidden
    ys, finals = [], []
    for d, backwards in enumerate(layer.directions):
        projected, rb = _projections(ctx, x, w, bias, d, 3 * n)
        recurrent = b.permute(_pick(ctx, r, d), (1, 0))
        f, g = layer.activations[d]
        h = _initial(ctx, h0, d, x, n)
        steps = []
        for t in _order(ctx, x, backwards):
            xw = _pick(ctx, projected, t)
            hr = b.matmul(h, recurrent) if before_reset else None
            if hr is not None and rb is not None:
                hr = b.add(hr, rb)
            zr_h = (
                b.matmul(h, _part(ctx, recurrent, 0, 2 * n))
                if hr is None
                else _part(ctx, hr, 0, 2 * n)
            )
            zr = b.add(_part(ctx, xw, 0, 2 * n), zr_h)
            if not before_reset and rb is not None:
                zr = b.add(zr, _part(ctx, rb, 0, 2 * n))
            z = f(_clip(ctx, layer, _part(ctx, zr, 0, n)))
            reset = f(_clip(ctx, layer, _part(ctx, zr, 1, n)))
            if hr is not None:
                candidate = b.add(_part(ctx, xw, 2, n), b.mul(reset, _part(ctx, hr, 2, n)))
            else:
                candidate = b.add(
                    _part(ctx, xw, 2, n), b.matmul(b.mul(reset, h), _part(ctx, recurrent, 2, n))
                )
                if rb is not None:
                    candidate = b.add(candidate, _part(ctx, rb, 2, n))
            hidden = g(_clip(ctx, layer, candidate))
            h = b.add(b.mul(b.sub(scalar_like(ctx, z, 1), z), hidden), b.mul(z, h))
            steps.append(h)
        ys.append(steps[::-1] if backwards else steps)
        finals.append(h)
    return _outputs(ctx, attrs, ys, [finals])


@importer("LSTM", since=7)
def _lstm(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x, w, r, bias, _, h0, c0, peepholes = _inputs(ctx, node, 8)
    attrs = ctx.attributes(node)
    assert x is not None and w is not None and r is not None
    if attrs.int("input_forget", 0):
        raise ctx.fail("LSTM input_forget=1 is not supported")
    layer = _layer(ctx, attrs, 4, ["Sigmoid", "Tanh", "Tanh"], w)
    x, h0 = _time_major(ctx, attrs, x, h0)
    if c0 is not None and attrs.int("layout", 0):
        c0 = ctx.builder.permute(c0, (1, 0, 2))
    b = ctx.builder
    n = layer.hidden
    ys, hs, cs = [], [], []
    for d, backwards in enumerate(layer.directions):
        projected, rb = _projections(ctx, x, w, bias, d, 4 * n)
        recurrent = b.permute(_pick(ctx, r, d), (1, 0))
        f, g, act_h = layer.activations[d]
        p = None if peepholes is None else _pick(ctx, peepholes, d)
        h, c = _initial(ctx, h0, d, x, n), _initial(ctx, c0, d, x, n)
        steps = []
        for t in _order(ctx, x, backwards):
            gates = b.add(_pick(ctx, projected, t), b.matmul(h, recurrent))
            gates = gates if rb is None else b.add(gates, rb)
            i_in, o_in, f_in = (_part(ctx, gates, k, n) for k in range(3))
            if p is not None:
                i_in = b.add(i_in, b.mul(_part(ctx, p, 0, n), c))
                f_in = b.add(f_in, b.mul(_part(ctx, p, 2, n), c))
            i = f(_clip(ctx, layer, i_in))
            forget = f(_clip(ctx, layer, f_in))
            candidate = g(_clip(ctx, layer, _part(ctx, gates, 3, n)))
            c = b.add(b.mul(forget, c), b.mul(i, candidate))
            if p is not None:
                o_in = b.add(o_in, b.mul(_part(ctx, p, 1, n), c))
            h = b.mul(f(_clip(ctx, layer, o_in)), act_h(c))
            steps.append(h)
        ys.append(steps[::-1] if backwards else steps)
        hs.append(h)
        cs.append(c)
    return _outputs(ctx, attrs, ys, [hs, cs])
