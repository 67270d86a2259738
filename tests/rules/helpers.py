"""Helpers for rule tests: build a small graph, optimize it, compare both on the CPU executor."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

import knopt
from knopt.cpu import run_graph
from knopt.ir import DType, Graph, GraphBuilder, Value, bind_symbols
from knopt.opt.egraph import Limits
from knopt.opt.optimize import OptimizeReport
from tests.oracle import assert_same, random_array

F32 = DType.F32
Build = Callable[[GraphBuilder], Value | Sequence[Value]]


def graph_of(build: Build) -> Graph:
    """The graph whose outputs are what `build` returns (it declares its own inputs)."""
    builder = GraphBuilder("test")
    outputs = build(builder)
    if isinstance(outputs, Value):
        outputs = [outputs]
    for i, value in enumerate(outputs):
        builder.output(value, f"y{i}")
    return builder.build()


def random_feeds(
    graph: Graph, rng: np.random.Generator, *, low: float = -3.0, high: float = 3.0
) -> dict[str, np.ndarray]:
    """Random non-zero values for every input of a graph with static shapes."""
    feeds = {}
    for name, value in zip(graph.input_names, graph.inputs, strict=True):
        shape = [d for d in value.shape if isinstance(d, int)]
        assert len(shape) == value.rank, f"bind the sizes of input {name} first"
        feeds[name] = random_array(rng, shape, value.dtype, low=low, high=high)
    return feeds


@dataclass
class Optimized:
    """A graph before and after optimization, and what the optimizer reported."""

    before: Graph
    after: Graph
    report: OptimizeReport

    def fired(self, rule: str) -> int:
        """How often a rule matched."""
        return self.report.rules_fired.get(rule, 0)

    def count(self, op: str) -> int:
        """How many nodes of an op (as `Graph.op_histogram` names it) the optimized graph has."""
        return self.after.op_histogram().get(op, 0)

    def count_before(self, op: str) -> int:
        """How many nodes of an op the original graph has."""
        return self.before.op_histogram().get(op, 0)


def optimize_and_compare(
    build: Build,
    rng: np.random.Generator,
    *,
    low: float = -3.0,
    high: float = 3.0,
    sizes: Mapping[str, int] | None = None,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    limits: Limits | None = None,
) -> Optimized:
    """Optimize the graph of `build`, and check both graphs agree on random non-zero inputs.

    Args:
        build: Declares the inputs and returns the outputs.
        rng: Where the inputs come from.
        low: The least input value (float inputs; use a positive one for sqrt or log).
        high: The input values' bound.
        sizes: Values of symbolic sizes, bound before running (both graphs keep them).
        rtol: Relative tolerance of the comparison.
        atol: Absolute tolerance of the comparison.
        limits: Saturation bounds (the defaults if None).
    """
    before = graph_of(build)
    result = knopt.optimize(before, limits=limits or Limits())
    after = result.graph
    ran_before, ran_after = before, after
    if sizes:
        ran_before, ran_after = bind_symbols(before, sizes), bind_symbols(after, sizes)
    feeds = random_feeds(ran_before, rng, low=low, high=high)
    assert_same(run_graph(ran_after, feeds), run_graph(ran_before, feeds), rtol=rtol, atol=atol)
    return Optimized(before, after, result.report)


@dataclass(frozen=True)
class Rewrite:
    """A rule instance: a graph the rule applies to and what the optimized graph looks like.

    Attributes:
        rules: Rules that must fire.
        build: Declares the inputs and returns the outputs.
        gone: Ops (as `Graph.op_histogram` names them) that must not be left.
        left: Op counts the optimized graph must have.
        low: The least input value (positive for sqrt, log and the like).
    """

    rules: tuple[str, ...]
    build: Build
    gone: tuple[str, ...] = ()
    left: Mapping[str, int] = field(default_factory=dict)
    low: float = -3.0

    @property
    def id(self) -> str:
        """The test id: the first rule's name."""
        return self.rules[0]


def check_rewrite(case: Rewrite, rng: np.random.Generator) -> Optimized:
    """Optimize the case's graph; check the rules fired, its ops and that both graphs agree."""
    result = optimize_and_compare(case.build, rng, low=case.low)
    for rule in case.rules:
        assert result.fired(rule) > 0, f"{rule} did not fire"
    for op in case.gone:
        assert result.count(op) == 0, f"{op} is left: {result.after.op_histogram()}"
    for op, count in case.left.items():
        assert result.count(op) == count, f"{op}: {result.after.op_histogram()}"
    return result


def const(builder: GraphBuilder, value: float, dtype: DType = F32) -> Value:
    """A scalar constant, as exporters write one (broadcast by the binary op that reads it)."""
    return builder.constant(np.array(value, dtype=dtype.numpy))
