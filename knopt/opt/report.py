"""What optimization did (`--report-json`), and which original nodes each chosen node covers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from knopt.ir.graph import Graph
from knopt.ir.op import Input
from knopt.opt.serialized import ENode


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
    onnx_nodes_before: int | None = None  # of the model loaded, when optimizing a file
    onnx_nodes_after: int | None = None  # of the model saved, once saved
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
    costs_before: dict[str, float] = field(default_factory=dict)  # original node name -> seconds

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return {
            "rules_fired": self.rules_fired,
            "rulesets": self.rulesets,
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "onnx_nodes_before": self.onnx_nodes_before,
            "onnx_nodes_after": self.onnx_nodes_after,
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
            "costs_before": self.costs_before,
        }


def attribute(
    graph: Graph, ir_nodes: Sequence[tuple[int, ENode]], choice: dict[int, ENode]
) -> dict[int, list[int]]:
    """For each class the new program computes, the original nodes (indices) it stands for.

    An original node belongs to its own class when the program computes that class; otherwise
    to the class of the first reader downstream (in the original graph) that it computes.
    """
    index = {node: i for i, node in enumerate(graph.nodes)}
    owner: dict[int, int] = {}  # original node index -> class that accounts for it
    for i in range(len(graph.nodes) - 1, -1, -1):
        cls, _ = ir_nodes[i]
        if isinstance(graph.nodes[i].op, Input):
            continue
        if cls in choice:
            owner[i] = cls
            continue
        readers = [owner[index[u]] for u in graph.nodes[i].output.users() if index[u] in owner]
        if readers:
            owner[i] = readers[0]
    found: dict[int, list[int]] = {}
    for i, cls in sorted(owner.items()):
        found.setdefault(cls, []).append(i)
    return found
