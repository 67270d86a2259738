"""Finding, checking and loading rule files.

The shipped rule files live in `rules/` (package data `knopt/rules`), read in the order of
`RULE_FILES`, `schema.egg` first; `schedule.egg` is the only file that runs anything. User rule
files (`--rules extra.egg`) are loaded after the shipped ones and run in the `algebra` ruleset
unless they declare and schedule their own.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from egglog import bindings as eb

from knopt.errors import RuleFileError

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
    """One rule file's name and text."""

    name: str
    text: str


def rules_dir() -> Any:
    """The folder of the shipped rule files (a Traversable)."""
    return resources.files("knopt") / "rules"


def shipped_rule_files() -> list[RuleFile]:
    """The shipped rule files, in load order."""
    folder = rules_dir()
    return [RuleFile(name, (folder / name).read_text()) for name in RULE_FILES]


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
    return RuleFile(SCHEDULE_FILE, (rules_dir() / SCHEDULE_FILE).read_text())


def parse_rules(egraph: eb.EGraph, rule_file: RuleFile) -> list[Any]:
    """Parse one rule file into commands, rejecting anything but declarations and rules.

    Raises:
        RuleFileError: If the file does not parse or runs, checks or extracts something.
    """
    try:
        commands = egraph.parse_program(rule_file.text, filename=rule_file.name)
    except eb.EggSmolError as err:
        raise RuleFileError(f"{rule_file.name}: {err}") from err
    for command in commands:
        kind = type(command).__name__
        what = _FORBIDDEN.get(kind)
        if isinstance(command, eb.UserDefined):
            what = command.name  # run-schedule, extract and the other experimental commands
        elif kind == "ActionCommand" and str(command).startswith("(let "):
            what = "let"  # a global term would be added to every e-graph
        if what is not None:
            raise RuleFileError(
                f"{rule_file.name}: `{what}` is not allowed in a rule file; rule files hold "
                f"declarations and rules, and {SCHEDULE_FILE} runs them"
            )
    return commands


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
        commands = parse_rules(egraph, rule_file)
        for command in commands:
            body = getattr(command, "rule", None) or getattr(command, "rewrite", None)
            if body is None:
                continue
            name = body.name or str(command)  # egglog names an unnamed rule by its text
            if name in defined:
                raise RuleFileError(
                    f"{rule_file.name}: rule {name!r} is already defined in {defined[name]}; "
                    "give it another :name (shipped rule files load without being passed)"
                )
            defined[name] = rule_file.name
        try:
            egraph.run_program(*commands)
        except eb.EggSmolError as err:
            raise RuleFileError(f"{rule_file.name}: {err}") from err
