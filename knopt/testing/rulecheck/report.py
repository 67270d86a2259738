"""A rule's verdict: sound, UNSOUND (with the smallest counterexample) or unchecked."""

from __future__ import annotations

from dataclasses import dataclass

SOUND, UNSOUND, UNCHECKED = "sound", "UNSOUND", "unchecked"


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
