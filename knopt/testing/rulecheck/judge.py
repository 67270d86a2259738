"""Judging what a checked rule did: both sides of each union, and each fact, on the CPU.

Unions are compared on two sets of random non-zero inputs, and on a third whose integers sit
near their types' limits (where the left side is undefined there, that set is skipped); facts
are checked by the oracle of their relation. The smallest failure is kept as the
counterexample.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from knopt.cpu.executor import run_graph
from knopt.errors import InvalidGraphError, KnoptError, OptimizeError, RunError
from knopt.ir.bind import bind_symbols
from knopt.ir.graph import Graph
from knopt.ir.shape import static_dims
from knopt.ir.text import format_graph
from knopt.opt.serialized import Ref
from knopt.testing.arrays import describe_inputs, limit_inputs, random_inputs
from knopt.testing.compare import compare_outputs
from knopt.testing.rulecheck.checkrun import CheckRun
from knopt.testing.rulecheck.draw import pruned
from knopt.testing.rulecheck.facts import Fact
from knopt.testing.rulecheck.oracle import check_fact, context
from knopt.testing.rulecheck.values import ClassValues, Uncomputable

MAX_APPLICATIONS = 60  # unions or facts compared per rule: enough to find a wrong law


@dataclass
class _Failure:
    size: tuple[int, int]  # nodes, then input elements: the smallest is shown
    text: str
    error: float
    reason: str


def _size(graph: Graph) -> tuple[int, int]:
    shapes = [static_dims(v.shape) for v in graph.inputs]
    elements = sum(int(np.prod(shape)) for shape in shapes if shape is not None)
    return len(pruned(graph).nodes), elements


def _feeds_of(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: feeds[name] for name in graph.input_names}


def _compare_pair(
    values: Sequence[ClassValues], lhs: int, rhs: int, limits: ClassValues | None = None
) -> _Failure | None:
    """Compare the two sides of one union on every input set.

    `limits` is one more input set, with integers near their type's limits: where the left
    side is undefined there (an index out of range), that set is skipped, not the union.
    """
    left = values[0].graph_of(lhs)
    try:
        right = values[0].graph_of(rhs, values[0].type_of(lhs))
    except (OptimizeError, InvalidGraphError) as err:
        return _Failure(
            _size(left),
            _show(left, None, values[0].feeds),
            float("inf"),
            f"the right side does not type-check: {err}",
        )
    if left.symbols() or right.symbols():
        left, right = bind_symbols(left, values[0].sizes), bind_symbols(right, values[0].sizes)
    for source in values:
        expected = run_graph(left, source.feeds)  # a failure here is the instance's, not the rule's
        failure = _compare_sides(left, right, source.feeds, expected)
        if failure is not None:
            return failure
    if limits is not None:
        try:
            expected = run_graph(left, limits.feeds)
        except (*_UNDEFINED, KnoptError):
            return None
        return _compare_sides(left, right, limits.feeds, expected)
    return None


# What numpy raises where an op is undefined on its inputs (integer powers with negative
# exponents, indices out of range).
_UNDEFINED = (IndexError, ValueError, OverflowError, ZeroDivisionError)


def _compare_sides(
    left: Graph, right: Graph, feeds: Mapping[str, np.ndarray], expected: list[np.ndarray]
) -> _Failure | None:
    """Run the right side on `feeds` and compare it with the left side's outputs."""
    try:
        actual = run_graph(right, feeds)
    except (*_UNDEFINED, RunError) as err:
        return _Failure(
            _size(left),
            _show(left, right, feeds),
            float("inf"),
            f"the right side fails to run: {err}",
        )
    comparison = compare_outputs(actual, expected)
    if comparison.ok:
        return None
    return _Failure(
        _size(left),
        _show(left, right, feeds),
        comparison.max_error,
        f"the sides differ: {comparison.message}",
    )


def _show(left: Graph, right: Graph | None, feeds: Mapping[str, np.ndarray]) -> str:
    shown = pruned(left)
    text = "left side:\n" + format_graph(shown)
    if right is not None:
        text += "\nright side:\n" + format_graph(pruned(right))
    return text + "\ninputs:\n" + describe_inputs(_feeds_of(shown, feeds))


def _compare_scalars(
    values: Sequence[ClassValues], a: int, b: int, limits: ClassValues | None = None
) -> _Failure | None:
    """Compare two scalar bodies on every input set (at the limits, where the first is defined)."""
    for source in values:
        failure = _compare_bodies(source, a, b)
        if failure is not None:
            return failure
    if limits is not None:
        try:
            limits.body(a)
        except (*_UNDEFINED, KnoptError):
            return None
        return _compare_bodies(limits, a, b)
    return None


def _compare_bodies(values: ClassValues, a: int, b: int) -> _Failure | None:
    x, y = values.body(a), values.body(b)
    shape = np.broadcast_shapes(np.shape(x), np.shape(y))
    comparison = compare_outputs(
        [np.array(np.broadcast_to(y, shape).astype(np.asarray(x).dtype), order="C")],
        [np.array(np.broadcast_to(x, shape), order="C")],
    )
    if comparison.ok:
        return None
    return _Failure((0, 0), f"scalar bodies {a} and {b}", comparison.max_error, comparison.message)


def _check_fact(ctx: Any, fact: Fact) -> _Failure | None:
    message = check_fact(ctx, fact)
    if message is None:
        return None
    name, args, value = fact
    classes = [a.id for a in args if isinstance(a, Ref)]
    text = f"fact ({name} {' '.join(map(str, args))}) = {value}"
    for cls in classes[:1]:
        with contextlib.suppress(KnoptError):  # the fact's message says enough without it
            text += "\n" + format_graph(pruned(ctx.values.graph_of(cls)))
    return _Failure((len(text), 0), text, float("inf"), message)


def judge(graph: Graph, run: CheckRun, seed: int) -> tuple[int, list[_Failure], list[str]]:
    """Compare every application the run recorded: (checked, failures, reasons skipped)."""
    rng = np.random.default_rng(seed)
    sizes = {name: 2 for name in graph.symbols()}  # symbolic sizes run at 2
    static = bind_symbols(graph, sizes) if sizes else graph
    feeds = [random_inputs(static, rng), random_inputs(static, rng)]
    at_limits = limit_inputs(static, rng)
    failures: list[_Failure] = []
    skipped: list[str] = []
    checked = 0
    values = [ClassValues(run.data, run.tables, run.ir_nodes, graph, f, sizes) for f in feeds]
    limits = None
    if at_limits is not None:
        limits = ClassValues(run.data, run.tables, run.ir_nodes, graph, at_limits, sizes)
    jobs: list[Callable[[], _Failure | None]] = []
    pairs = [(lhs, rhs) for lhs, rhs in run.pairs if lhs != rhs]
    jobs += [partial(_compare_pair, values, lhs, rhs, limits) for lhs, rhs in pairs]
    jobs += [partial(_compare_scalars, values, a, b, limits) for a, b in run.scalar_pairs]
    checked += sum(1 for p in run.pairs if p[0] == p[1])  # the two sides are one term
    if run.facts:
        ctx = context(values[0], values[1], graph, run.ir_nodes)
        jobs += [partial(_check_fact, ctx, f) for f in run.facts]
    for job in jobs[:MAX_APPLICATIONS]:
        try:
            failure = job()
        except Uncomputable as err:
            skipped.append(str(err))
            continue
        except (ValueError, TypeError, IndexError, OverflowError, OptimizeError, RunError) as err:
            # The left side itself does not evaluate: a CPU kernel or an analysis at fault,
            # not this rule (see the reason, which names it).
            skipped.append(f"the left side does not evaluate: {type(err).__name__}: {err}")
            continue
        checked += 1
        if failure is not None:
            failures.append(failure)
    return checked, failures, skipped
