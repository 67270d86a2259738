"""`GraphGen`: random well-typed IR graphs, built one move at a time from a pool of values.

Each move (`knopt.testing.moves`) takes values from the pool, adds a few nodes with the
`GraphBuilder` and puts its result back, so later moves reuse earlier results: intermediates
end up with several users, as in real models. Every decision goes through a `Choices`, so the
same code serves hypothesis (shrinking) and seeded reproduction.

Two habits keep the graphs well-conditioned, so that a mismatch between a graph and its
optimized form means a bug, not rounding:
- Ops with a restricted domain read a guarded operand (`positive`, `bounded`): log and sqrt of
  `|x| + 1/2`, exp of a clamp, division by a constant or by `|x| + 1/2`.
- Rounding-sensitive ops (floor, sign, comparisons, casts to integers or to f16, arg-max, mod)
  read only *exact* values: inputs, constants and what exact ops (views, negation, clamps...)
  make of them. Reassociating a sum changes its last bit, which would flip a floor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from knopt.ir.builder import GraphBuilder
from knopt.ir.dtype import DType
from knopt.ir.graph import Graph, Value
from knopt.ir.op import Input, Unary
from knopt.ir.shape import static_dims
from knopt.testing.arrays import random_array
from knopt.testing.choices import Choices, choose, choose_weighted

Shape = tuple[int, ...]
T = TypeVar("T")


def static_shape(value: Value) -> Shape:
    """The shape of a generated value, whose sizes are integers: moves make no symbolic ones."""
    shape = static_dims(value.shape)
    assert shape is not None, f"a move made the symbolic shape {value.shape}"
    return shape


@dataclass(frozen=True)
class Entry:
    """A value in the pool.

    Attributes:
        value: The IR value.
        exact: Whether it is computed without rounding, so that rounding-sensitive ops may
            read it.
    """

    value: Value
    exact: bool


class GraphGen:
    """Builds one random graph.

    Attributes:
        choices: Where decisions come from.
        builder: The graph being built.
        main: The graph's main float type (most float values have it).
        pool: Every value made so far, oldest first.
    """

    def __init__(self, choices: Choices, *, name: str = "fuzz", max_dim: int = 5) -> None:
        self.choices = choices
        self.builder = GraphBuilder(name)
        self.rng = np.random.default_rng(choices.seed())
        self.max_dim = max_dim
        self.main = DType.F64 if choices.boolean(0.1) else DType.F32
        self.pool: list[Entry] = []
        self._inputs = 0

    # ---- decisions -------------------------------------------------------------------

    def integer(self, lo: int, hi: int) -> int:
        """An integer in `[lo, hi]`."""
        return self.choices.integer(lo, hi)

    def boolean(self, p: float = 0.5) -> bool:
        """True with probability `p`."""
        return self.choices.boolean(p)

    def choose(self, options: Sequence[T]) -> T:
        """One of `options` (simplest first)."""
        return choose(self.choices, options)

    def weighted(self, options: Sequence[tuple[T, int]]) -> T:
        """One of `(option, weight)` pairs."""
        return choose_weighted(self.choices, options)

    def dim(self) -> int:
        """A size, often 1."""
        return 1 if self.boolean(0.2) else self.integer(2, self.max_dim)

    def shape(self, rank: int | None = None) -> Shape:
        """A random shape of rank 1 to 4 (or `rank`)."""
        rank = self.integer(1, 4) if rank is None else rank
        return tuple(self.dim() for _ in range(rank))

    def broadcastable(self, shape: Shape) -> Shape:
        """A shape that broadcasts to `shape`: a suffix of it with some sizes made 1."""
        keep = self.integer(0, len(shape))
        tail = shape[len(shape) - keep :]
        return tuple(1 if self.boolean(0.4) else d for d in tail)

    def per_channel(self, shape: Shape, axis: int) -> Shape:
        """The shape of a per-channel constant for `axis`: 1 everywhere else."""
        return tuple(d if i == axis else 1 for i, d in enumerate(shape))

    # ---- leaves ----------------------------------------------------------------------

    def input(self, shape: Shape, dtype: DType | None = None) -> Value:
        """A new graph input (exact)."""
        name = f"x{self._inputs}"
        self._inputs += 1
        value = self.builder.input(name, shape, dtype or self.main)
        self.pool.append(Entry(value, True))
        return value

    def constant(
        self, shape: Shape, dtype: DType | None = None, *, positive: bool = False
    ) -> Value:
        """A constant of random non-zero values (positive ones if asked)."""
        array = random_array(self.rng, shape, dtype or self.main)
        if positive:
            array = np.abs(array)
        return self.builder.constant(array)

    def splat(self, value: float, dtype: DType | None = None) -> Value:
        """A scalar constant, as exporters write one (the binary op that reads it broadcasts)."""
        return self.builder.constant(np.array(value, dtype=(dtype or self.main).numpy))

    # ---- the pool --------------------------------------------------------------------

    def add(self, value: Value, exact: bool = False) -> Value:
        """Put a move's result into the pool."""
        self.pool.append(Entry(value, exact))
        return value

    def entries(self, accept: Callable[[Entry], bool]) -> list[Entry]:
        """The pool entries `accept` takes."""
        return [e for e in self.pool if accept(e)]

    def pick(
        self,
        kind: str = "float",
        *,
        exact: bool = False,
        min_rank: int = 0,
        inputs_only: bool = False,
    ) -> Entry | None:
        """A random pool entry of a dtype kind ("float", "int", "bool" or "any")."""

        def accept(e: Entry) -> bool:
            dtype = e.value.dtype
            if kind == "float" and dtype is not self.main:
                return False
            if kind == "int" and not dtype.is_int:
                return False
            if kind == "bool" and dtype is not DType.BOOL:
                return False
            if inputs_only and not isinstance(e.value.producer.op, Input):
                return False
            return (e.exact or not exact) and e.value.rank >= min_rank

        found = self.entries(accept)
        return self.choose(found) if found else None

    def float_value(self, *, min_rank: int = 0, exact: bool = False) -> Value:
        """A float pool value of at least `min_rank`, or a new input if there is none."""
        entry = self.pick("float", min_rank=min_rank, exact=exact)
        if entry is None:
            return self.input(self.shape(self.integer(max(min_rank, 1), 4)))
        return entry.value

    def normalizable(self, min_rank: int = 1) -> Value:
        """An input (new or old) to normalize: its rows vary, so normalizing is well-conditioned.

        (Normalizing a computed row that is constant would divide its rounding noise by
        sqrt(eps), and compare noise with noise.)
        """
        entry = self.pick("float", min_rank=min_rank, inputs_only=True)
        if entry is None or self.boolean(0.3):
            return self.input(self.shape(self.integer(min_rank, 3)))
        return entry.value

    # ---- guarded operands --------------------------------------------------------------

    def positive(self, x: Value) -> Value:
        """`|x| + 1/2`: at least a half, for logs, roots and denominators."""
        g = self.builder
        return g.add(g.unary(Unary.ABS, x), self.splat(0.5, x.dtype))

    def bounded(self, x: Value, radius: float) -> Value:
        """`x` clamped to `[-radius, radius]`."""
        return self.builder.clamp(x, lo=-radius, hi=radius)

    def operand_for(self, x: Value) -> Value:
        """A second operand that broadcasts to `x`: a pool value, a new input or a constant."""
        same = self.entries(lambda e: e.value.shape == x.shape and e.value.dtype is x.dtype)
        options = ["constant", "splat", "channel", "input"] + (["pool"] if same else [])
        what = self.choose(options)
        if what == "pool":
            return self.choose(same).value
        if what == "splat":
            return self.splat(float(random_array(self.rng, (), x.dtype)), x.dtype)
        if what == "channel" and x.rank:
            axis = self.integer(0, x.rank - 1)
            return self.constant(self.per_channel(static_shape(x), axis), x.dtype)
        shape = self.broadcastable(static_shape(x))
        return self.input(shape, x.dtype) if what == "input" else self.constant(shape, x.dtype)

    # ---- the graph -------------------------------------------------------------------

    def build(self, extra_outputs: int) -> Graph:
        """The graph whose outputs are the last value and up to `extra_outputs` others."""
        computed = [e.value for e in self.pool if not isinstance(e.value.producer.op, Input)]
        if not computed:
            computed = [self.builder.unary(Unary.NEG, self.float_value())]
        outputs = [computed[-1]]
        for _ in range(extra_outputs):
            value = self.choose(computed)
            if all(value is not o for o in outputs):
                outputs.append(value)
        for index, value in enumerate(outputs):
            self.builder.output(value, f"y{index}")
        return self.builder.build()
