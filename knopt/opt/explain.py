"""`--explain`: which original nodes each chosen node covers, and the report as text or HTML.

`to_html` (from `knopt.opt.report_html`) renders the report as one self-contained page.
"""

from __future__ import annotations

from knopt.opt.report import OptimizeReport
from knopt.opt.report_html import to_html as to_html
from knopt.opt.rules import FACT_RULESETS


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
    facts = {k: v for k, v in report.rules_fired.items() if report.rulesets.get(k) in FACT_RULESETS}
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
