"""Finding, checking and loading rule files.

The shipped rule files live in `rules/` (package data `knopt/rules`), read in the order of
`RULE_FILES`, `schema.egg` first; `schedule.egg` is the only file that runs anything. User rule
files (`--rules extra.egg`) are loaded after the shipped ones; their rules run in `algebra` or
`fusion` (or egglog's default ruleset, which each algebra round runs), never in a ruleset the
schedule saturates, and they hold no top-level actions. Every rule has a `:name`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from egglog import bindings as eb

from knopt.errors import RuleFileError
from knopt.opt.laws import expand_laws, generated_sections, read_constructors

RULE_FILES = (
    "schema.egg",
    "typing.egg",
    "fold.egg",
    "strength.egg",
    "clamp.egg",
    "affine.egg",
    "layernorm.egg",
    "activations.egg",
    "attention.egg",
    "rope.egg",
    "merge.egg",
    "fusion.egg",
    "quantize.egg",
)
SCHEDULE_FILE = "schedule.egg"
# Rulesets whose rules add facts (types, folded values) rather than rewrite: reports count
# their matches apart from the rewrites.
FACT_RULESETS = frozenset({"analysis", "fold"})

# Commands a rule file may not contain: rule files declare, the schedule runs.
_FORBIDDEN = {
    "RunSchedule": "run-schedule",
    "Check": "check",
    "Extract": "extract",
    "Push": "push",
    "Pop": "pop",
    "Include": "include",
    "Fail": "fail",
    "PrintFunction": "print-function",
    "PrintSize": "print-size",
    "Input": "input",
    "Output": "output",
}


@dataclass(frozen=True)
class RuleFile:
    """One rule file's name and text; `shipped` files are knopt's own (base facts allowed)."""

    name: str
    text: str
    shipped: bool = False


def rules_dir() -> Any:
    """The folder of the shipped rule files (a Traversable)."""
    return resources.files("knopt") / "rules"


def shipped_rule_files() -> list[RuleFile]:
    """The shipped rule files, in load order, with their generated rules (`knopt.opt.laws`)."""
    return list(_shipped())


@functools.cache
def shipped_sources() -> dict[str, str]:
    """The text of each shipped rule file as written (before its rules are generated)."""
    return {name: (rules_dir() / name).read_text() for name in RULE_FILES}


@functools.cache
def _shipped() -> tuple[RuleFile, ...]:
    texts = shipped_sources()
    constructors = read_constructors(texts[RULE_FILES[0]])
    return tuple(
        RuleFile(name, expand_laws(text, constructors, name), shipped=True)
        for name, text in texts.items()
    )


def generated_rules() -> dict[str, list[str]]:
    """Per shipped rule file, the text of the rules generated into it (for rule authors)."""
    texts = shipped_sources()
    constructors = read_constructors(texts[RULE_FILES[0]])
    found = {name: generated_sections(text, constructors) for name, text in texts.items()}
    return {name: sections for name, sections in found.items() if sections}


def read_rule_file(path: str | Path) -> RuleFile:
    """A user's rule file.

    Raises:
        RuleFileError: If the file does not exist or is not readable text.
    """
    path = Path(path)
    try:
        return RuleFile(path.name, path.read_text())
    except (OSError, UnicodeDecodeError) as err:
        raise RuleFileError(f"{path}: cannot read rule file ({err})") from err


def schedule_file() -> RuleFile:
    """The shipped schedule."""
    return RuleFile(SCHEDULE_FILE, (rules_dir() / SCHEDULE_FILE).read_text(), shipped=True)


@dataclass(frozen=True)
class ParsedRules:
    """A rule file's commands, and the names of the rules they add, as egglog reports them."""

    commands: list[Any]
    rule_names: list[str]


def parse_rules(egraph: eb.EGraph, rule_file: RuleFile) -> ParsedRules:
    """Parse one rule file into commands, rejecting anything but declarations and named rules.

    A user's file (not shipped) may also not hold top-level actions, nor put rules in a
    ruleset the schedule saturates.

    Raises:
        RuleFileError: If the file does not parse, runs, checks or extracts something, has a
            rule without a `:name`, or (a user's file) breaks one of the two rules above.
    """
    try:
        commands = egraph.parse_program(rule_file.text, filename=rule_file.name)
    except eb.EggSmolError as err:
        raise RuleFileError(f"{rule_file.name}: {err}") from err
    names: list[str] = []
    for command in commands:
        _refuse_command(rule_file, command)
        if isinstance(command, eb.RuleCommand):
            rule = command.rule  # one conversion each: they copy the whole rule into Python
            names.append(_check_rule(rule_file, rule, str(rule.ruleset)))
        elif isinstance(command, eb.RewriteCommand | eb.BiRewriteCommand):
            name = _check_rule(rule_file, command.rewrite, str(command.name))
            # egglog names a birewrite's two directions `name=>` and `name<=`.
            bidirectional = isinstance(command, eb.BiRewriteCommand)
            names += [f"{name}=>", f"{name}<="] if bidirectional else [name]
    return ParsedRules(commands, names)


def _refuse_command(rule_file: RuleFile, command: Any) -> None:
    """Raise if a command is one that no rule file (or no user's rule file) may hold."""
    what = _FORBIDDEN.get(type(command).__name__)
    if isinstance(command, eb.UserDefined):
        what = command.name  # run-schedule, extract and the other experimental commands
    elif isinstance(command, eb.ActionCommand) and isinstance(command.action, eb.Let):
        what = "let"  # a global term would be added to every e-graph
    if what is not None:
        raise RuleFileError(
            f"{rule_file.name}: `{what}` is not allowed in a rule file; rule files hold "
            f"declarations and rules, and {SCHEDULE_FILE} runs them"
        )
    if isinstance(command, eb.ActionCommand) and not rule_file.shipped:
        span = command.action.span
        raise RuleFileError(
            f"{rule_file.name}, line {_line(rule_file, span)}: the top-level action "
            f"`{_snippet(rule_file, span)}` is not allowed in a user's rule file: it would "
            "change every e-graph, unchecked; state it as a named rule that check-rules can check"
        )


def _check_rule(rule_file: RuleFile, rule: Any, ruleset: str) -> str:
    """A rule's name, after checking that it has one and (a user's rule) where it runs."""
    if not rule.name:
        raise RuleFileError(
            f"{rule_file.name}, line {_line(rule_file, rule.span)}: the rule "
            f"`{_snippet(rule_file, rule.span)}` has no :name; give every rule a unique "
            ':name "..." so that reports, --explain and check-rules can name it'
        )
    if not rule_file.shipped and ruleset in saturated_rulesets():
        raise RuleFileError(
            f"{rule_file.name}: rule {rule.name!r} joins ruleset `{ruleset}`, which the schedule "
            f"saturates ({', '.join(sorted(saturated_rulesets()))}): a user's rule there could "
            "run forever, and the rule checker trusts those facts; put it in `algebra` (or "
            "no ruleset), or in `fusion`"
        )
    return str(rule.name)


def _line(rule_file: RuleFile, span: Any) -> int:
    return rule_file.text.count("\n", 0, int(getattr(span, "i", 0))) + 1


def _snippet(rule_file: RuleFile, span: Any, width: int = 60) -> str:
    """The source text of a span, on one line, clipped to `width`."""
    text = " ".join(rule_file.text[int(span.i) : int(span.j)].split())
    return text if len(text) <= width else text[: width - 3] + "..."


@functools.cache
def saturated_rulesets() -> frozenset[str]:
    """The rulesets that schedule.egg saturates (run until nothing changes)."""
    found: set[str] = set()

    def walk(expr: Any, inside: bool) -> None:
        if isinstance(expr, eb.Var) and inside:
            found.add(expr.name)
        for arg in getattr(expr, "args", ()):
            walk(arg, inside or getattr(expr, "name", "") == "saturate")

    schedule = schedule_file()
    for command in eb.EGraph().parse_program(schedule.text, filename=schedule.name):
        walk(command, False)
    return frozenset(found)


_RULE_NAME = re.compile(
    r':ruleset\s+([\w-]+)\s+:name\s+"([^"]+)"|:name\s+"([^"]+)"\s+:ruleset\s+([\w-]+)'
)


def rulesets_of(files: Sequence[RuleFile]) -> dict[str, str]:
    """Each named rule's ruleset, as written in the files."""
    found: dict[str, str] = {}
    for rule_file in files:
        for match in _RULE_NAME.finditer(rule_file.text):
            if match[1]:
                found[match[2]] = match[1]
            else:
                found[match[3]] = match[4]
    return found


def load_rules(egraph: eb.EGraph, files: Sequence[RuleFile]) -> None:
    """Parse and register rule files in order.

    Raises:
        RuleFileError: If a file fails to parse or type-check, naming it and the place.
    """
    defined: dict[str, str] = {}  # rule name -> file; egglog panics on a second definition
    for rule_file in files:
        parsed = parse_rules(egraph, rule_file)
        for name in parsed.rule_names:
            if name in defined:
                raise RuleFileError(
                    f"{rule_file.name}: rule {name!r} is already defined in {defined[name]}; "
                    "give it another :name (shipped rule files load without being passed)"
                )
            defined[name] = rule_file.name
        try:
            egraph.run_program(*parsed.commands)
        except eb.EggSmolError as err:
            raise RuleFileError(f"{rule_file.name}: {err}") from err
