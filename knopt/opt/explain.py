"""`--explain`: which original nodes each chosen node covers, and the report as text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from knopt.ir.graph import Graph
from knopt.ir.op import Input
from knopt.opt.serialized import ENode

if TYPE_CHECKING:
    from knopt.opt.optimize import OptimizeReport


def attribute(
    graph: Graph, ir_nodes: Sequence[tuple[int, ENode]], choice: dict[int, ENode]
) -> dict[int, list[int]]:
    """For each class the new program computes, the original nodes (indices) it stands for.

    An original node belongs to its own class when the program computes that class; otherwise
    to the class of the first reader downstream (in the original graph) that it computes.
    """
    index = {id(node): i for i, node in enumerate(graph.nodes)}
    owner: dict[int, int] = {}  # original node index -> class that accounts for it
    for i in range(len(graph.nodes) - 1, -1, -1):
        cls, _ = ir_nodes[i]
        if isinstance(graph.nodes[i].op, Input):
            continue
        if cls in choice:
            owner[i] = cls
            continue
        readers = [
            owner[index[id(u)]] for u in graph.nodes[i].output.users() if index[id(u)] in owner
        ]
        if readers:
            owner[i] = readers[0]
    found: dict[int, list[int]] = {}
    for i, cls in sorted(owner.items()):
        found.setdefault(cls, []).append(i)
    return found


def _count(nodes: int | None) -> str:
    return "-" if nodes is None else str(nodes)


def format_report(report: OptimizeReport) -> str:
    """The report as text for a person."""
    lines = [
        f"optimized with the {report.profile} cost model in {report.seconds:.2f} s",
        f"  ONNX nodes: {_count(report.onnx_nodes_before)} -> {_count(report.onnx_nodes_after)}"
        f"    IR nodes: {report.nodes_before} -> {report.nodes_after}    "
        f"estimated time: {_us(report.cost_before)} -> {_us(report.cost_after)}"
        f"{_ratio(report.cost_before, report.cost_after)}",
        f"  saturation: {report.egraph_nodes} e-nodes, "
        + (f"stopped by the {report.stopped_by}" if report.stopped_by else "ran to the end"),
        f"  extraction: {report.extraction} (ILP: {report.ilp_status})",
    ]
    if report.user_rules:
        lines.append(f"  user rule files: {', '.join(report.user_rules)}")
    facts = {
        k: v
        for k, v in report.rules_fired.items()
        if report.rulesets.get(k) in ("analysis", "fold")
    }
    rewrites = {k: v for k, v in report.rules_fired.items() if k not in facts}
    lines.append(
        f"rewrite rules that fired (matches; {sum(facts.values())} more matches of "
        f"{len(facts)} typing and folding rules):"
    )
    for name, count in sorted(rewrites.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"  {count:6d}  {name}")
    if report.program:
        total = sum(k["seconds"] for k in report.program)
        lines.append(f"kernels ({report.kernels} launches, estimated {_us(total)}):")
        for kernel in report.program:
            what = kernel["kind"] + (
                f"[{kernel['op']}]" if kernel["op"] and kernel["op"] != kernel["kind"] else ""
            )
            covered = ", ".join(kernel["names"][:4])
            more = f" +{len(kernel['names']) - 4}" if len(kernel["names"]) > 4 else ""
            lines.append(f"  {_us(kernel['seconds']):>10}  {what:24s} {covered}{more}")
    shown = report.patterns
    if shown:
        lines.append("recognised patterns (what replaced which original nodes):")
        for pattern in sorted(shown, key=lambda p: (p.op, p.replaced)):
            replaced = ", ".join(pattern.replaced[:6])
            more = f" and {len(pattern.replaced) - 6} more" if len(pattern.replaced) > 6 else ""
            lines.append(f"  {pattern.op} [{_us(pattern.cost)}] replaces {replaced}{more}")
    lines.append("time per phase:")
    for phase in report.phases:
        lines.append(f"  {phase['seconds'] * 1e3:8.1f} ms  {phase['name']}")
    return "\n".join(lines)


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us"


def _ratio(before: float, after: float) -> str:
    return f" ({before / after:.2f}x)" if after > 0 else ""
