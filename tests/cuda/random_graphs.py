"""A small generator of random well-typed f32 graphs, for comparing the GPU with the CPU."""

from __future__ import annotations

import numpy as np

from knopt.ir import GraphBuilder, Value
from knopt.ir.dtype import DType
from knopt.ir.op import Binary, Reduction, Unary
from knopt.ir.shape import static_dims

_UNARY = [
    Unary.NEG,
    Unary.ABS,
    Unary.TANH,
    Unary.SIGMOID,
    Unary.RELU,
    Unary.SIN,
    Unary.GELU,
    Unary.SILU,
    Unary.ERF,
    Unary.SOFTPLUS,
]
_BINARY = [Binary.ADD, Binary.SUB, Binary.MUL, Binary.MAX, Binary.MIN]


class RandomGraphs:
    """Adds independent random subgraphs to one builder (one compile for many graphs)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.builder = GraphBuilder("random")
        self.feeds: dict[str, np.ndarray] = {}

    def _input(self, shape: tuple[int, ...]) -> Value:
        name = f"in{len(self.feeds)}"
        self.feeds[name] = self.rng.uniform(-2, 2, shape).astype(np.float32)
        return self.builder.input(name, shape, DType.F32)

    def _shape(self) -> tuple[int, ...]:
        rank = int(self.rng.integers(1, 5))
        return tuple(int(d) for d in self.rng.integers(1, 10, rank))

    def _broadcastable(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        keep = int(self.rng.integers(0, len(shape) + 1))
        tail = shape[len(shape) - keep :]
        return tuple(d if self.rng.random() < 0.6 else 1 for d in tail) or (1,)

    def add_graph(self, index: int, steps: int = 8) -> None:
        """One random subgraph with outputs named after `index`."""
        g, rng = self.builder, self.rng
        values = [self._input(self._shape())]
        for _ in range(steps):
            x = values[int(rng.integers(len(values)))]
            choice = int(rng.integers(12))
            shape = static_dims(x.shape)
            assert shape is not None
            if choice == 0:
                y = g.unary(_UNARY[int(rng.integers(len(_UNARY)))], x)
            elif choice in (1, 2):
                other = self._input(self._broadcastable(shape))
                kind = _BINARY[int(rng.integers(len(_BINARY)))]
                y = g.binary(kind, x, other) if rng.random() < 0.5 else g.binary(kind, other, x)
            elif choice == 3:
                axes = sorted({int(a) for a in rng.integers(0, len(shape), 2)})
                reduction = [Reduction.SUM, Reduction.MAX, Reduction.MIN][int(rng.integers(3))]
                y = g.reduce(reduction, x, axes=axes)
            elif choice == 4:
                y = g.softmax(x, axis=int(rng.integers(len(shape))))
            elif choice == 5:
                y = g.layer_norm(x, axis=len(shape) - 1, eps=1e-5)
            elif choice == 6:
                y = g.permute(x, [int(p) for p in rng.permutation(len(shape))])
            elif choice == 7 and shape[-1] > 1:
                stop = int(rng.integers(1, shape[-1] + 1))
                step = int(rng.integers(1, 3))
                y = g.slice(x, axis=len(shape) - 1, start=0, stop=stop, step=step)
            elif choice == 8 and len(shape) >= 2:
                n = int(rng.integers(1, 9))
                weight = self._input((shape[-1], n))
                w = (
                    g.broadcast(weight, (*shape[:-1][:-1], shape[-1], n))
                    if len(shape) > 2
                    else weight
                )
                y = g.matmul(x, w)
            elif choice == 9:
                y = g.concat([x, g.unary(Unary.TANH, x)], axis=int(rng.integers(len(shape))))
            elif choice == 10:
                zero = g.scalar(0.0, DType.F32)
                y = g.where(g.binary(Binary.GREATER, x, zero), x, g.unary(Unary.SIN, x))
            else:
                y = g.cast(g.cast(x, DType.F64), DType.F32)
            values.append(g.clamp(y, lo=-50.0, hi=50.0) if rng.random() < 0.2 else y)
        g.output(values[-1], f"g{index}_last")
        if len(values) > 3:
            g.output(values[len(values) // 2], f"g{index}_mid")
