"""Drawing instances of a rule's left side, and the batch graph that holds them.

An instance is the query unfolded by the rules that make its derived atoms (`unfold`), flattened
into a pattern (`flatten`) and built as an IR graph (`instantiate`); a query over no tensor
(`numel-step` reads only shape facts) gets random graphs, whose analyses make the facts it reads.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

from knopt.errors import InvalidGraphError
from knopt.ir.bind import bind_symbols
from knopt.ir.builder import GraphBuilder
from knopt.ir.graph import Graph, Value
from knopt.ir.op import Input
from knopt.testing.choices import SeededChoices
from knopt.testing.rulecheck.instance import instantiate
from knopt.testing.rulecheck.pattern import flatten
from knopt.testing.rulecheck.rulebook import Rule, Rulebook
from knopt.testing.rulecheck.sexpr import Lit, head
from knopt.testing.rulecheck.unfold import unfold
from knopt.testing.strategies import graph_from_seed


def _seed(name: str, seed: int, k: int) -> int:
    return zlib.crc32(f"{name}:{seed}:{k}".encode())


def draw_instances(
    book: Rulebook, index: Any, rule: Rule, count: int, seed: int
) -> tuple[list[Graph], set[str]]:
    """Up to `count` graphs matching the rule's left side, and the rules they need first.

    A query over no tensor (`numel-step` reads only shape facts) gets random graphs, whose
    analyses make the facts it reads.
    """
    graphs: list[Graph] = []
    deps: set[str] = set()
    depth = _threshold(rule)
    for k in range(count * 4):
        if len(graphs) >= count:
            break
        s = _seed(rule.name, seed, k)
        unfolded = unfold(
            book, index, rule.query, SeededChoices(s), exclude=rule.name, recursion=depth
        )
        if unfolded is None:
            continue
        pattern = flatten(book, *unfolded)
        if pattern is not None and "T" not in pattern.sorts.values():
            # A query over no tensor: explain its facts by the rules that make them (or fall
            # back to random graphs, whose analyses make them).
            unfolded = (
                unfold(book, index, rule.query, SeededChoices(s), exclude=rule.name, deep=True)
                or unfolded
            )
            pattern = flatten(book, *unfolded) or pattern
        if pattern is None:
            continue
        if "T" not in pattern.sorts.values():
            graph: Graph | None = graph_from_seed(s, max_steps=4).graph
        else:
            graph = instantiate(book, pattern, s)
        if graph is not None and _binds_at_two(graph):
            graphs.append(graph)
            deps |= pattern.deps
    return graphs, deps


def _binds_at_two(graph: Graph) -> bool:
    """Whether the graph is still valid with its symbolic sizes at 2, as the judge runs it.

    A slice to 3 of a size that a repair made symbolic is not.
    """
    sizes = {name: 2 for name in graph.symbols()}
    if not sizes:  # the judge binds nothing then
        return True
    try:
        bind_symbols(graph, sizes)
    except InvalidGraphError:
        return False
    return True


def _threshold(rule: Rule) -> int:
    """The largest literal N in a query guard `(>= (f ...) N)` or `(> (f ...) N)`, plus one."""
    found = 0
    for atom in rule.query:
        if (
            head(atom) in (">=", ">")
            and isinstance(atom, tuple)
            and isinstance(atom[2], Lit)
            and isinstance(atom[1], tuple)
            and isinstance(atom[2].value, int)
        ):
            found = max(found, atom[2].value + 1)
    return found


def batch(graphs: Sequence[Graph]) -> Graph:
    """One graph holding every instance, with inputs and outputs renamed apart."""
    builder = GraphBuilder("batch")
    for k, graph in enumerate(graphs):
        mapping: dict[int, Value] = {}
        for node in graph.nodes:
            op = node.op
            if isinstance(op, Input):
                t = op.tensor_type
                value = builder.input(f"i{k}_{op.input_name}", t.shape, t.dtype)
            else:
                value = builder.apply(op, [mapping[id(v)] for v in node.inputs])
            mapping[id(node.output)] = value
        for name, value in zip(graph.output_names, graph.outputs, strict=True):
            builder.output(mapping[id(value)], f"i{k}_{name}")
    return builder.build()


def pruned(graph: Graph) -> Graph:
    """The graph without the inputs it does not read (for showing a counterexample)."""
    used = {id(v) for node in graph.nodes for v in node.inputs}
    builder = GraphBuilder(graph.name)
    mapping: dict[int, Value] = {}
    for node in graph.nodes:
        op = node.op
        if isinstance(op, Input):
            if id(node.output) in used or any(node.output is o for o in graph.outputs):
                t = op.tensor_type
                mapping[id(node.output)] = builder.input(op.input_name, t.shape, t.dtype)
            continue
        mapping[id(node.output)] = builder.apply(op, [mapping[id(v)] for v in node.inputs])
    for name, value in zip(graph.output_names, graph.outputs, strict=True):
        builder.output(mapping[id(value)], name)
    return builder.build()
