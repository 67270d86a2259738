"""`knopt check-rules`: is every rule sound on random instances of its left side?"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from knopt.commands.common import positive_int
from knopt.errors import RuleFileError
from knopt.opt.rules import generated_rules, read_rule_file


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the `check-rules` subcommand."""
    parser = subparsers.add_parser(
        "check-rules",
        help="check that rules are sound on random instances (CPU executor as the oracle)",
        description="Instantiate the left side of every named rule with random shapes and "
        "values, apply the rule alone, and compare both sides on the CPU executor. With "
        "FILE.egg arguments, only the rules of those files are checked (after the shipped "
        "rules load). Exit status 1 if a rule is unsound (or, with --strict, unchecked), or if "
        "a file is refused as `optimize --rules` refuses it.",
    )
    parser.add_argument(
        "files",
        type=Path,
        nargs="*",
        metavar="FILE.egg",
        help="rule files to check (default: every shipped rule)",
    )
    parser.add_argument(
        "--instances",
        type=positive_int,
        default=16,
        metavar="N",
        help="instances drawn per rule (default: %(default)s)",
    )
    parser.add_argument(
        "--rule",
        action="append",
        default=[],
        metavar="NAME",
        help="check only this rule (repeatable)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of every random choice")
    parser.add_argument(
        "--jobs",
        type=positive_int,
        default=min(2, os.cpu_count() or 1),
        help="worker processes (default: %(default)s)",
    )
    parser.add_argument(
        "--strict", action="store_true", help="fail (exit 1) when a rule could not be checked, too"
    )
    parser.add_argument("--quiet", action="store_true", help="print only what is not sound")
    parser.add_argument(
        "--show-generated",
        action="store_true",
        help="print the rules generated at load time from schema.egg (the per-op laws of "
        "knopt/opt/laws.py) and exit",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Check the rules and print one line per rule, then a summary."""
    if args.show_generated:
        return _show_generated()
    from knopt.testing.rulecheck import SOUND, UNCHECKED, UNSOUND, RuleReport, check_rules

    extra = [read_rule_file(path) for path in args.files]
    began = time.perf_counter()

    def progress(done: int, total: int, report: RuleReport) -> None:
        if args.quiet and report.verdict == SOUND:
            return
        print(f"[{done:>3}/{total}] {report.line()}", flush=True)
        if report.counterexample:
            print("    " + report.counterexample.replace("\n", "\n    "), flush=True)

    try:
        reports = check_rules(
            extra,
            only_extra=bool(extra),
            names=args.rule,
            instances=args.instances,
            seed=args.seed,
            jobs=args.jobs,
            progress=progress,
        )
    except RuleFileError as err:
        print(f"REFUSED   {err}", file=sys.stderr)
        return 1
    verdicts = {v: [r.name for r in reports if r.verdict == v] for v in (SOUND, UNSOUND, UNCHECKED)}
    summary = (
        f"{len(reports)} rules in {time.perf_counter() - began:.0f} s: {len(verdicts[SOUND])} "
        f"sound, {len(verdicts[UNSOUND])} UNSOUND, {len(verdicts[UNCHECKED])} unchecked"
    )
    print(summary, file=sys.stderr)
    for verdict in (UNSOUND, UNCHECKED):
        if verdicts[verdict]:
            print(f"{verdict}: {', '.join(verdicts[verdict])}", file=sys.stderr)
    failed = bool(verdicts[UNSOUND]) or (args.strict and bool(verdicts[UNCHECKED]))
    return 1 if failed else 0


def _show_generated() -> int:
    """Print, per shipped rule file, the rules generated into it."""
    for name, sections in generated_rules().items():
        for text in sections:
            print(f";; ---- in {name} ----\n{text}\n")
    return 0
