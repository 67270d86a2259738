"""The rule checker: is every named rule sound on random instances of its left side?

For each rule: draw instances of its query (`pattern.unfold`, `instance.instantiate`), put
them in one batch graph, let egglog apply only that rule (`checkrun.run_check`), and compare:
- for each union it would make, the values of both sides on the CPU executor, on random
  non-zero inputs (two sets), within the dtype's tolerance;
- for each fact it derives, what the fact claims, by the oracle of its relation.

A rule whose left side no instance matched is *unchecked*, never sound.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
import warnings
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from egglog import bindings as eb

from knopt.cpu.executor import run_graph
from knopt.errors import InvalidGraphError, KnoptError, OptimizeError, RuleFileError
from knopt.ir.bind import bind_symbols
from knopt.ir.builder import GraphBuilder
from knopt.ir.graph import Graph, Value
from knopt.ir.op import Input
from knopt.ir.shape import static_dims
from knopt.ir.text import format_graph
from knopt.opt.egraph import check_rule_files
from knopt.opt.rules import RuleFile, parse_rules, shipped_rule_files, shipped_sources
from knopt.opt.serialized import Ref
from knopt.testing.arrays import describe_inputs, limit_inputs, random_inputs
from knopt.testing.checkrun import CheckRun, run_check
from knopt.testing.choices import SeededChoices
from knopt.testing.compare import compare_outputs
from knopt.testing.facts import Fact
from knopt.testing.instance import instantiate
from knopt.testing.oracle import check_fact, context
from knopt.testing.pattern import flatten, producers, unfold
from knopt.testing.rulebook import Rule, Rulebook, read_rulebook
from knopt.testing.sexpr import Lit, head
from knopt.testing.strategies import graph_from_seed
from knopt.testing.values import ClassValues, Uncomputable

SOUND, UNSOUND, UNCHECKED = "sound", "UNSOUND", "unchecked"
MAX_APPLICATIONS = 60  # unions or facts compared per rule: enough to find a wrong law


@dataclass
class RuleReport:
    """The verdict on one rule.

    Attributes:
        instances: How many instances of its left side were built.
        fired: How often it matched them.
        checked: How many of its applications were compared.
        reason: Why it is unchecked, or what is wrong.
        counterexample: The smallest failing instance, as text.
    """

    name: str
    file: str
    verdict: str
    instances: int = 0
    fired: int = 0
    checked: int = 0
    reason: str = ""
    counterexample: str = ""
    max_error: float = 0.0
    seconds: float = 0.0

    def line(self) -> str:
        """One line: verdict, name, counts (and why, when unchecked or unsound)."""
        counts = f"{self.instances} instances, {self.checked} applications checked"
        text = f"{self.verdict:<9} {self.name:<32} {self.file:<16} {counts}"
        return text + (f": {self.reason}" if self.reason else "")


# ---- instances --------------------------------------------------------------------------------


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
        if graph is not None:
            graphs.append(graph)
            deps |= pattern.deps
    return graphs, deps


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


# ---- comparing --------------------------------------------------------------------------------


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
    except _UNDEFINED as err:
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


def _judge(graph: Graph, run: CheckRun, seed: int) -> tuple[int, list[_Failure], list[str]]:
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
        except (ValueError, TypeError, IndexError, OverflowError, OptimizeError) as err:
            # The left side itself does not evaluate: a CPU kernel or an analysis at fault,
            # not this rule (see the reason, which names it).
            skipped.append(f"the left side does not evaluate: {type(err).__name__}: {err}")
            continue
        checked += 1
        if failure is not None:
            failures.append(failure)
    return checked, failures, skipped


def check_rule(
    book: Rulebook, files: Sequence[RuleFile], rule: Rule, *, instances: int = 16, seed: int = 0
) -> RuleReport:
    """Check one rule of `book` (whose files, in load order, are `files`).

    Numpy's warnings (an integer cast out of range, an overflow) are silenced: on random and
    limit inputs they are expected, and the comparison says what matters.
    """
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return _check_rule(book, files, rule, instances, seed)


def _check_rule(
    book: Rulebook, files: Sequence[RuleFile], rule: Rule, instances: int, seed: int
) -> RuleReport:
    began = time.perf_counter()
    report = RuleReport(rule.name, rule.file, UNCHECKED)
    graphs, deps = draw_instances(book, producers(book), rule, instances, seed)
    report.instances = len(graphs)
    if not graphs:
        report.reason = "no instance of its left side could be built"
    else:
        run = run_check(files, book, rule, sorted(deps), batch(graphs))
        report.fired = run.fired
        if run.fired == 0:
            report.reason = f"its left side never matched in {len(graphs)} instances"
        else:
            checked, failures, skipped = _judge(batch(graphs), run, seed)
            report.checked = checked
            if failures:
                worst = min(failures, key=lambda f: f.size)
                report.verdict = UNSOUND
                report.reason = worst.reason
                report.counterexample = worst.text
                report.max_error = max(f.error for f in failures)
            elif checked:
                report.verdict = SOUND
            else:
                report.reason = skipped[0] if skipped else "it matched but changed nothing"
    report.seconds = time.perf_counter() - began
    return report


# ---- every rule -------------------------------------------------------------------------------


def _check_every_rule_is_read(book: Rulebook, files: Sequence[RuleFile]) -> None:
    """Refuse a file if egglog would add a rule that the rule book does not hold.

    Raises:
        RuleFileError: Naming the rules that could not be read.
    """
    for rule_file in files:
        added = parse_rules(eb.EGraph(), rule_file).rule_names
        read = {r.name for r in book.rules if r.file == rule_file.name}
        missing = [name for name in added if name not in read]
        if missing:
            raise RuleFileError(
                f"{rule_file.name}: check-rules cannot read rules {missing}, so it refuses the "
                "file rather than leave them unchecked"
            )


_WORKER: dict[str, Any] = {}


def _start_worker(files: list[RuleFile], instances: int, seed: int) -> None:
    _WORKER.update(files=files, book=read_rulebook(files), instances=instances, seed=seed)


def _check_named(name: str) -> RuleReport:
    book: Rulebook = _WORKER["book"]
    try:
        return check_rule(
            book,
            _WORKER["files"],
            book.rule(name),
            instances=_WORKER["instances"],
            seed=_WORKER["seed"],
        )
    except KnoptError as err:
        return RuleReport(name, book.rule(name).file, UNCHECKED, reason=f"check failed: {err}")


def check_rules(
    extra: Sequence[RuleFile] = (),
    *,
    only_extra: bool = False,
    names: Sequence[str] = (),
    instances: int = 16,
    seed: int = 0,
    jobs: int = 1,
    progress: Callable[[int, int, RuleReport], None] | None = None,
) -> list[RuleReport]:
    """Check the named rules of the shipped rule files and of `extra` files.

    Args:
        extra: User rule files, loaded after the shipped ones.
        only_extra: Check only the rules of `extra` (the shipped ones still load).
        names: Check only these rules (all if empty).
        instances: Instances drawn per rule.
        seed: Seed of every random choice (the same seed gives the same verdicts).
        jobs: Worker processes.
        progress: Called with (done, total, report) as each rule finishes.

    Raises:
        RuleFileError: If `optimize --rules` would refuse one of the `extra` files (the same
            error), or if a rule in one of them cannot be read for checking.
    """
    shipped = shipped_rule_files()
    # A shipped file passed as `extra` (`knopt check-rules rules/affine.egg`) selects its rules;
    # it is not loaded a second time.
    sources = shipped_sources()
    same = {f.name: name for f in extra for name, text in sources.items() if f.text == text}
    user = [f for f in extra if f.name not in same]
    check_rule_files(user)
    files = [*shipped, *user]
    book = read_rulebook(files)
    _check_every_rule_is_read(book, user)
    extra_names = {same.get(f.name, f.name) for f in extra}
    chosen = [
        r.name
        for r in book.rules
        if (not only_extra or r.file in extra_names) and (not names or r.name in names)
    ]
    reports: dict[str, RuleReport] = {}
    if jobs <= 1:
        _start_worker(files, instances, seed)
        results: Any = map(_check_named, chosen)
    else:
        # Spawned, not forked: a fork of a process that has run egglog can deadlock.
        pool = ProcessPoolExecutor(
            jobs,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start_worker,
            initargs=(files, instances, seed),
        )
        results = pool.map(_check_named, chosen)
    for report in results:
        reports[report.name] = report
        if progress is not None:
            progress(len(reports), len(chosen), report)
    if jobs > 1:
        pool.shutdown()
    return [reports[name] for name in chosen]
