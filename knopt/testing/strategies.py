"""Hypothesis strategies for random well-typed graphs and their inputs.

    from hypothesis import given
    from knopt.testing import graph_and_inputs

    @given(graph_and_inputs())
    def test_my_rules(case): ...

A failing graph shrinks to a small one. `graph_from_seed(seed)` rebuilds a graph from an
integer seed without hypothesis, which is how a long seeded run reproduces a failure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from knopt.ir.graph import Graph
from knopt.testing.arrays import random_inputs
from knopt.testing.choices import Choices, SeededChoices
from knopt.testing.generator import GraphGen
from knopt.testing.moves import moves


class DrawnChoices:
    """Decisions drawn by hypothesis inside a `@st.composite` strategy (so they shrink)."""

    def __init__(self, draw: Callable[[st.SearchStrategy[Any]], Any]) -> None:
        self._draw = draw

    def integer(self, lo: int, hi: int) -> int:
        """An integer in `[lo, hi]`."""
        return int(self._draw(st.integers(lo, hi)))

    def boolean(self, p: float = 0.5) -> bool:
        """True with probability about `p`; the shrunk draw 0 means False."""
        return int(self._draw(st.integers(0, 99))) >= 100 - round(p * 100)

    def seed(self) -> int:
        """A 32-bit seed."""
        return int(self._draw(st.integers(0, 2**32 - 1)))


@dataclass
class Case:
    """A random graph and random non-zero inputs for it."""

    graph: Graph
    inputs: dict[str, np.ndarray]


def random_graph(
    choices: Choices, *, max_steps: int = 8, max_outputs: int = 3, opaque: bool = True
) -> Graph:
    """A random graph of 1 to `max_steps` moves with up to `max_outputs` outputs.

    Args:
        choices: Where decisions come from.
        max_steps: The most moves.
        max_outputs: The most graph outputs.
        opaque: Whether graphs may hold opaque ops (ONNX nodes kept as they are), which only
            the CPU runs.
    """
    gen = GraphGen(choices)
    gen.input(gen.shape())
    usable = moves(opaque=opaque)
    for _ in range(gen.integer(1, max_steps)):
        for _attempt in range(4):  # a move may find nothing to use in the pool
            if gen.weighted(usable)(gen) is not None:
                break
    return gen.build(extra_outputs=gen.integer(0, max_outputs - 1))


def graph_from_seed(seed: int, *, max_steps: int = 8, max_outputs: int = 3) -> Case:
    """The graph and inputs that `seed` stands for (the same on every machine and run)."""
    graph = random_graph(SeededChoices(seed), max_steps=max_steps, max_outputs=max_outputs)
    return Case(graph, random_inputs(graph, np.random.default_rng(seed)))


@st.composite
def graphs(
    draw: Callable[[st.SearchStrategy[Any]], Any],
    max_steps: int = 8,
    max_outputs: int = 3,
    opaque: bool = True,
) -> Graph:
    """Random well-typed graphs (a hypothesis strategy); `opaque=False` for the GPU."""
    return random_graph(
        DrawnChoices(draw), max_steps=max_steps, max_outputs=max_outputs, opaque=opaque
    )


@st.composite
def graph_and_inputs(
    draw: Callable[[st.SearchStrategy[Any]], Any],
    max_steps: int = 8,
    max_outputs: int = 3,
    opaque: bool = True,
) -> Case:
    """Random graphs with random non-zero inputs (a hypothesis strategy)."""
    graph = draw(graphs(max_steps=max_steps, max_outputs=max_outputs, opaque=opaque))
    seed = draw(st.integers(0, 2**32 - 1))
    return Case(graph, random_inputs(graph, np.random.default_rng(seed)))


def fuzz_settings(max_examples: int) -> settings:
    """Hypothesis settings for whole-pipeline fuzzing: no deadline, slow draws allowed.

    Optimizing a drawn graph takes from milliseconds to about a second, and the graphs are
    large draws; neither is a problem of the test.
    """
    return settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.function_scoped_fixture,
        ],
    )
