"""Building IR graphs whose terms match a `Pattern`: random instances of a rule's left side.

One attempt proposes types top-down and builds the graph bottom-up (`build`), then checks
the rule's conditions on the terms egglog will see (`conditions`). Conditions that fail but
name a variable are repaired (`repair`), and the attempt is made again, a few rounds at most.
"""

from __future__ import annotations

from knopt.errors import InvalidGraphError
from knopt.ir.graph import Graph
from knopt.testing.choices import SeededChoices
from knopt.testing.rulecheck.build import Builder, Proposer
from knopt.testing.rulecheck.conditions import Checker
from knopt.testing.rulecheck.draft import Draft
from knopt.testing.rulecheck.dtypes import forced_dtypes
from knopt.testing.rulecheck.pattern import Pattern
from knopt.testing.rulecheck.repair import base_facts
from knopt.testing.rulecheck.rulebook import Rulebook
from knopt.testing.rulecheck.sampler import Sampling


def instantiate(book: Rulebook, pattern: Pattern, seed: int, rounds: int = 8) -> Graph | None:
    """A graph whose outputs match the pattern's roots, or None if no attempt fitted."""
    forced = forced_dtypes(book, pattern, base_facts(book), Sampling(SeededChoices(seed)))
    draw = seed * 101
    for _ in range(rounds):
        # The same draw after a repair (only the repaired values change), a new one after a
        # proposal that did not type-check.
        draft = Draft(book, pattern, draw, forced)
        try:
            Proposer(draft).sample()
            graph = Builder(draft).graph()
        except (InvalidGraphError, KeyError, IndexError, ValueError, TypeError):
            draw += 1
            continue
        repairs = Checker(draft).check(graph)
        if repairs is None:
            return None
        if not (repairs.values or repairs.shapes or repairs.dtypes):
            return graph
        forced.update(repairs)
    return None
