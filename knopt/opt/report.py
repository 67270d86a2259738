"""What optimization did: rules fired, costs, kernels, recognised patterns (`--report-json`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Pattern:
    """One chosen node that replaced original nodes (a fused or recognised computation)."""

    op: str
    replaced: list[str]
    cost: float


@dataclass
class OptimizeReport:
    """What optimization did. `to_json()` gives the machine-readable form."""

    rules_fired: dict[str, int] = field(default_factory=dict)
    rulesets: dict[str, str] = field(default_factory=dict)  # rule name -> its ruleset
    nodes_before: int = 0
    nodes_after: int = 0
    cost_before: float = 0.0
    cost_after: float = 0.0
    seconds: float = 0.0
    stopped_by: str | None = None
    phases: list[dict[str, Any]] = field(default_factory=list)
    patterns: list[Pattern] = field(default_factory=list)
    egraph_nodes: int = 0
    kernels: int = 0
    program: list[dict[str, Any]] = field(default_factory=list)  # kernel, op, seconds, names
    extraction: str = ""
    ilp_status: str = ""
    profile: str = "cpu"
    user_rules: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return {
            "rules_fired": self.rules_fired,
            "rulesets": self.rulesets,
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "cost_before": self.cost_before,
            "cost_after": self.cost_after,
            "seconds": self.seconds,
            "stopped_by": self.stopped_by,
            "phases": self.phases,
            "patterns": [vars(p) for p in self.patterns],
            "egraph_nodes": self.egraph_nodes,
            "kernels": self.kernels,
            "program": self.program,
            "extraction": self.extraction,
            "ilp_status": self.ilp_status,
            "profile": self.profile,
            "user_rules": self.user_rules,
        }
