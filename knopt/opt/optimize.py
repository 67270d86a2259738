"""`optimize`: graph in, cheaper equivalent graph out, with a report of what happened."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from knopt.errors import KnoptError
from knopt.ir.graph import Graph
from knopt.ir.validate import validate
from knopt.opt.cost import PROFILES, CostModel, DeviceProfile
from knopt.opt.egraph import Limits, saturate
from knopt.opt.explain import covered_nodes
from knopt.opt.extract import extract
from knopt.opt.program import Program, program_from_graph
from knopt.opt.rebuild import Rebuilt, rebuild_graph
from knopt.opt.serialized import ENode
from knopt.opt.rules import RuleFile, read_rule_file, rulesets_of, shipped_rule_files


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


@dataclass
class OptimizeResult:
    """The optimized graph, its kernel program, and the report.

    Attributes:
        graph: The optimized IR graph (fused kernels written out as their ops).
        program: The same computation as kernels, as extraction grouped them.
        report: What optimization did.
    """

    graph: Graph
    program: Program
    report: OptimizeReport
    groups: dict[int, int] = field(default_factory=dict)  # fused graph node id -> kernel key
    group_kinds: dict[int, str] = field(default_factory=dict)  # kernel key -> kernel kind

    def save(self, path: str | Path | None = None, *, kernels: bool = True,
             opset: int = 18) -> Any:
        """Save as ONNX: with fused kernels as `knopt` functions, or (kernels=False) flat.

        Raises:
            KnoptError: If the model cannot be written.
        """
        if not kernels:
            from knopt.onnx.export import save_onnx

            return save_onnx(self.graph, path, opset=opset)
        from knopt.onnx.export_kernels import save_kernels

        return save_kernels(self.graph, self.groups, self.group_kinds, path, opset=opset)


def _profile(profile: str | DeviceProfile) -> DeviceProfile:
    if isinstance(profile, DeviceProfile):
        return profile
    if profile not in PROFILES:
        raise KnoptError(f"unknown device profile '{profile}' (known: {', '.join(PROFILES)})")
    return PROFILES[profile]


def optimize(
    graph: Graph,
    *,
    rules: Sequence[str | Path | RuleFile] = (),
    profile: str | DeviceProfile = "cpu",
    limits: Limits = Limits(),
    ilp: bool = True,
) -> OptimizeResult:
    """Optimize `graph` by equality saturation and cost-based extraction.

    Args:
        graph: The graph to optimize (it is not changed).
        rules: Extra rule files, run with the shipped ones (their rules go in `algebra`).
        profile: The device whose costs guide extraction ("cpu", "h200", "h200-graph").
        limits: Saturation bounds; hitting one keeps the best e-graph so far.
        ilp: Whether to refine extraction with an ILP when the e-graph is small enough.

    Raises:
        RuleFileError: If a rule file is malformed.
        OptimizeError: If the rules or extraction produce something unusable.
    """
    start = time.perf_counter()
    device = _profile(profile)
    extra = [r if isinstance(r, RuleFile) else read_rule_file(r) for r in rules]
    saturation = saturate(graph, extra, limits)
    data = saturation.data
    roots = [saturation.ir_nodes[graph.nodes.index(v.producer)][0] for v in graph.outputs]
    model = CostModel(data, device)
    began = time.perf_counter()
    extraction = extract(
        data, roots, model.node_cost, saturation.ir_nodes, ilp_max_nodes=4000 if ilp else 0
    )
    extract_seconds = time.perf_counter() - began
    rebuilt = rebuild_graph(data, saturation.tables, extraction.choice, roots, graph)
    optimized = rebuilt.graph
    validate(optimized)
    unfolded = CostModel(data, device, folding=False)
    report = OptimizeReport(
        rules_fired={k: v for k, v in sorted(saturation.rules_fired.items()) if v},
        rulesets=rulesets_of([*shipped_rule_files(), *extra]),
        nodes_before=len(graph.nodes),
        nodes_after=len(optimized.nodes),
        cost_before=sum(unfolded.node_cost(cls, node) for cls, node in saturation.ir_nodes),
        cost_after=extraction.cost,
        stopped_by=saturation.stopped_by,
        phases=[vars(p) for p in saturation.phases]
        + [{"name": "extraction", "seconds": extract_seconds, "matches": 0}],
        egraph_nodes=saturation.egraph_nodes,
        extraction=extraction.method,
        ilp_status=extraction.ilp_status,
        profile=device.name,
        user_rules=[r.name for r in extra],
    )
    covered = covered_nodes(graph, saturation.ir_nodes, extraction.choice, roots)
    names = {c: n for c, _, n in covered}
    program = _program(rebuilt, extraction.choice, model, names)
    report.patterns = _patterns(rebuilt, extraction.choice, model, names)
    report.kernels = len(program.launches())
    report.program = [
        {"kind": k.kind, "op": k.op.name if k.op else "", "seconds": k.cost, "names": list(k.names)}
        for k in program.launches()
    ]
    report.seconds = time.perf_counter() - start
    kinds = {}
    for node in optimized.nodes:
        key = rebuilt.kernel_of.get(id(node))
        if key is not None:
            kinds[key] = _kernel_kind(choice_node=extraction.choice[key])
    return OptimizeResult(optimized, program, report, dict(rebuilt.kernel_of), kinds)


_KERNEL_KINDS = {"KElem": "elementwise", "KReduce": "reduce", "KSoftmax": "softmax",
                 "KLayerNorm": "layer_norm", "KRmsNorm": "rms_norm", "KMatMul": "matmul",
                 "KConv": "conv"}


def _kernel_kind(choice_node: ENode) -> str:
    return _KERNEL_KINDS.get(choice_node.op, choice_node.op)


RECOGNISED = frozenset({"LayerNorm", "RmsNorm", "Softmax", "Attention", "GELU", "GELU_TANH",
                        "SILU", "SIGMOID", "HARD_SIGMOID", "HARD_SWISH"})


def _patterns(
    rebuilt: Rebuilt, choice: dict[int, ENode], model: CostModel, names: dict[int, list[str]]
) -> list[Pattern]:
    """The recognised ops of the optimized graph, with the original nodes they replace."""
    found = []
    for node in rebuilt.graph.nodes:
        if node.op.name not in RECOGNISED:
            continue
        cls = rebuilt.kernel_of.get(id(node), rebuilt.class_of.get(id(node)))
        if cls is None:
            continue
        replaced = names.get(cls) or ([node.name] if node.name else [])
        found.append(Pattern(node.op.name, replaced, model.node_cost(cls, choice[cls])))
    return found


def _program(
    rebuilt: Rebuilt, choice: dict[int, ENode], model: CostModel, names: dict[int, list[str]]
) -> Program:
    """The kernel program of an extraction, with each kernel's cost and original names."""
    costs: dict[int, float] = {}
    kernel_names: dict[int, list[str]] = {}
    for cls in set(rebuilt.kernel_of.values()):
        costs[cls] = model.node_cost(cls, choice[cls])
        kernel_names[cls] = names.get(cls, [])
    for node_id, cls in rebuilt.class_of.items():
        if node_id not in rebuilt.kernel_of:
            costs[node_id] = model.node_cost(cls, choice[cls])
            if cls in names:
                kernel_names[node_id] = names[cls]
    return program_from_graph(rebuilt.graph, rebuilt.kernel_of, costs, kernel_names)
