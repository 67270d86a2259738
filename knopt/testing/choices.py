"""Where random decisions come from: hypothesis draws (which shrink) or a seeded generator.

Generators in `knopt.testing` make every decision through a `Choices`, so the same code draws
graphs for hypothesis (`knopt.testing.strategies.DrawnChoices`: failures shrink to small graphs)
and rebuilds one from an integer seed (`SeededChoices`: a failure reproduces from its seed).
Options are listed simplest first: hypothesis shrinks a draw toward the first option and toward
`False`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol, TypeVar

T = TypeVar("T")


class Choices(Protocol):
    """A source of random decisions."""

    def integer(self, lo: int, hi: int) -> int:
        """An integer in `[lo, hi]` (both included); shrinks toward `lo`."""
        ...

    def boolean(self, p: float = 0.5) -> bool:
        """True with probability `p`; shrinks toward False."""
        ...

    def seed(self) -> int:
        """A seed for a numpy generator (array contents are not worth shrinking)."""
        ...


def choose(choices: Choices, options: Sequence[T]) -> T:
    """One of `options`, uniformly; shrinks toward the first."""
    return options[choices.integer(0, len(options) - 1)]


def choose_weighted(choices: Choices, options: Sequence[tuple[T, int]]) -> T:
    """One of `options`, each `(option, weight)` with an integer weight; shrinks to the first."""
    total = sum(weight for _, weight in options)
    ticket = choices.integer(0, total - 1)
    for option, weight in options:
        if ticket < weight:
            return option
        ticket -= weight
    raise AssertionError("weights are positive integers")


class SeededChoices:
    """Decisions from `random.Random(seed)`: the same seed gives the same decisions."""

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed)

    def integer(self, lo: int, hi: int) -> int:
        """An integer in `[lo, hi]`."""
        return self._random.randint(lo, hi)

    def boolean(self, p: float = 0.5) -> bool:
        """True with probability `p`."""
        return self._random.random() < p

    def seed(self) -> int:
        """A 32-bit seed."""
        return self._random.getrandbits(32)
