"""Checking rules: one rule alone (`check_rule`), or every rule of some files (`check_rules`).

For each rule: draw instances of its query (`draw.draw_instances`), put them in one batch
graph, let egglog apply only that rule (`checkrun.run_check`), and judge what it did
(`judge.judge`). A rule whose left side no instance matched is *unchecked*, never sound. The
files are loaded as `optimize --rules` loads them, and refused with the same error.
"""

from __future__ import annotations

import multiprocessing
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
from egglog import bindings as eb

from knopt.errors import KnoptError, RuleFileError
from knopt.ir.graph import Graph
from knopt.opt.egraph import check_rule_files
from knopt.opt.rules import RuleFile, parse_rules, shipped_rule_files, shipped_sources
from knopt.testing.rulecheck.checkrun import run_check
from knopt.testing.rulecheck.draw import batch, draw_instances
from knopt.testing.rulecheck.judge import judge
from knopt.testing.rulecheck.report import SOUND, UNCHECKED, UNSOUND, RuleReport
from knopt.testing.rulecheck.rulebook import Rule, Rulebook, read_rulebook
from knopt.testing.rulecheck.seeds import seed_deps, seed_graphs
from knopt.testing.rulecheck.unfold import producers

SEED_INSTANCES = 6  # seed graphs: each family with each shape of activations
SEED_ROUNDS = 8  # rounds of deps on seeds: an int4 weight is seven rules deep


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
    _judge_instances(report, files, book, rule, graphs, deps, 3, seed)
    graphs = seed_graphs(book, rule, seed, SEED_INSTANCES) if report.fired == 0 else []
    if graphs:
        # Random instances did not reach its left side: try the seeds' spellings.
        present = frozenset(type(n.op).__name__ for graph in graphs for n in graph.nodes)
        deps = seed_deps(book, rule, present)
        _judge_instances(report, files, book, rule, graphs, deps, SEED_ROUNDS, seed)
    report.seconds = time.perf_counter() - began
    return report


def _judge_instances(
    report: RuleReport,
    files: Sequence[RuleFile],
    book: Rulebook,
    rule: Rule,
    graphs: list[Graph],
    deps: set[str],
    rounds: int,
    seed: int,
) -> None:
    """Apply the rule to the instances (after `rounds` rounds of its deps) and judge it."""
    report.instances = len(graphs)
    if not graphs:
        report.reason = "no instance of its left side could be built"
        return
    run = run_check(files, book, rule, sorted(deps), batch(graphs), rounds)
    report.fired = run.fired
    if run.fired == 0:
        report.reason = f"its left side never matched in {len(graphs)} instances"
        return
    checked, failures, skipped = judge(batch(graphs), run, seed)
    report.checked = checked
    if failures:
        worst = min(failures, key=lambda f: f.size)
        report.verdict = UNSOUND
        report.reason = worst.reason
        report.counterexample = worst.text
        report.max_error = max(f.error for f in failures)
    elif checked:
        report.verdict = SOUND
        report.reason = ""
    else:
        report.reason = skipped[0] if skipped else "it matched but changed nothing"


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
    files, book = _load(extra)
    # A shipped file passed as `extra` (`knopt check-rules rules/affine.egg`) selects its rules.
    selected = {_shipped_name(f) or f.name for f in extra}
    chosen = [
        r.name
        for r in book.rules
        if (not only_extra or r.file in selected) and (not names or r.name in names)
    ]
    reports: dict[str, RuleReport] = {}
    for report in _reports(files, chosen, instances, seed, jobs):
        reports[report.name] = report
        if progress is not None:
            progress(len(reports), len(chosen), report)
    return [reports[name] for name in chosen]


def _shipped_name(rule_file: RuleFile) -> str | None:
    """The name of the shipped file that `rule_file` is a copy of, if it is one."""
    return next((n for n, text in shipped_sources().items() if rule_file.text == text), None)


def _load(extra: Sequence[RuleFile]) -> tuple[list[RuleFile], Rulebook]:
    """The files to load (shipped copies in `extra` are loaded once) and their rule book.

    Raises:
        RuleFileError: As `check_rules`.
    """
    user = [f for f in extra if _shipped_name(f) is None]
    check_rule_files(user)
    files = [*shipped_rule_files(), *user]
    book = read_rulebook(files)
    _check_every_rule_is_read(book, user)
    return files, book


def _reports(
    files: list[RuleFile], chosen: Sequence[str], instances: int, seed: int, jobs: int
) -> Iterator[RuleReport]:
    """The reports on the chosen rules, in order, from `jobs` worker processes."""
    if jobs <= 1:
        _start_worker(files, instances, seed)
        yield from map(_check_named, chosen)
        return
    # Spawned, not forked: a fork of a process that has run egglog can deadlock.
    with ProcessPoolExecutor(
        jobs,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_start_worker,
        initargs=(files, instances, seed),
    ) as pool:
        yield from pool.map(_check_named, chosen)
