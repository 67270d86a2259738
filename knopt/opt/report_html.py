"""The HTML report: the original graph beside the kernel program, in one self-contained file.

`report_data` gathers what the page shows (both graphs, which original nodes each kernel
covers, the rules that fired, the recognised patterns, costs and phase timings) as JSON-ready
data; `html_page` inlines that data, the page's script and style, and the graph layout library
(dagre, vendored in `knopt/web/` with its license) into one HTML file that needs no network;
`to_html` does both. The browser lays the graphs out in a worker thread, slice by slice, so a
large graph never freezes the page.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable, Sequence
from importlib import resources
from typing import TYPE_CHECKING, Any

from knopt.errors import KnoptError
from knopt.ir import op as ops
from knopt.ir.graph import Graph, Node
from knopt.ir.kernel import KernelKind
from knopt.ir.program import OPAQUE, Kernel, Program, format_expr
from knopt.opt.rules import FACT_RULESETS

if TYPE_CHECKING:
    from knopt.opt.optimize import OptimizeResult
    from knopt.opt.report import OptimizeReport

DAGRE = "dagre-3.1.3.min.js"

# The colour of each kind of kernel, and of the original nodes it covers (Tableau 10).
KIND_COLOURS: dict[str, str] = {
    "matmul": "#4e79a7",
    "conv": "#76b7b2",
    "elementwise": "#59a14f",
    "reduce": "#f28e2b",
    "softmax": "#e15759",
    "layer_norm": "#b07aa1",
    "rms_norm": "#ff9da7",
    "int_matmul": "#edc948",
    "int_conv": "#8cd17d",
    "int4_matmul": "#d4a6c8",
    "op": "#9c755f",  # a single op run as its own kernel (a gather, a concat, ...)
    OPAQUE: "#79706e",  # an ONNX node knopt keeps as it is, without knowing what it computes
    "view": "#bab0ac",  # free: the backend reads the input through strides
    "removed": "#e6e6e6",  # folded into a constant or simplified away: no kernel computes it
}

# Import-time glue that says little about what an original node does.
_GLUE_OPS = (ops.View, ops.Broadcast, ops.Permute)


def colour_kind(kernel: Kernel) -> str:
    """The key of `KIND_COLOURS` for a kernel."""
    if kernel.is_view:
        return "view"
    if kernel.kind == OPAQUE:
        return OPAQUE
    return kernel.kind if KernelKind.of_name(kernel.kind) is not None else "op"


def to_html(result: OptimizeResult, *, title: str | None = None) -> str:
    """The report of an optimization as one self-contained HTML page.

    Args:
        result: What `knopt.optimize` returned.
        title: The page's heading (default: the graph's name).

    Raises:
        KnoptError: If `result` does not hold the graph it was optimized from.
    """
    return html_page(report_data(result, title=title))


def html_page(data: dict[str, Any]) -> str:
    """The page that shows `data` (as `report_data` makes it), with everything inlined."""
    web = resources.files("knopt") / "web"
    # No `<` inside a <script>: `</script>` or `<!--` in a node name would end it early.
    payload = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")
    return _fill(
        (web / "report.html").read_text(),
        TITLE=html.escape(data["title"]),
        STYLE=(web / "report.css").read_text(),
        DATA=payload,
        LAYOUT=(web / DAGRE).read_text(),
        GRAPH_VIEW=(web / "graph_view.js").read_text(),
        SCRIPT=(web / "report.js").read_text(),
    )


def report_data(result: OptimizeResult, *, title: str | None = None) -> dict[str, Any]:
    """What the HTML report shows, as JSON-ready data.

    Original nodes are the imported graph's nodes grouped by the ONNX node they came from;
    kernels are the program's launches (views are free and left out; edges pass through them).
    Each kernel lists the original nodes it covers (`covers`, indices into `original.nodes`)
    and its estimated time before (`before`: the covered nodes' share of the unoptimized
    estimate) and after (`cost`).

    Raises:
        KnoptError: If `result` does not hold the graph it was optimized from.
    """
    if result.original is None:
        raise KnoptError(
            "the optimize result has no original graph to show; report on a result that "
            "knopt.optimize returned"
        )
    report = result.report
    original = _OriginalGraph(result.original)
    launches = result.program.launches()
    covers = [original.covered_by(k.names) for k in launches]
    viewed = {i for k in result.program.kernels if k.is_view for i in original.covered_by(k.names)}
    node_kernels = _invert(covers, len(original.names))
    node_costs = original.costs(report.costs_before)
    return {
        "title": title or result.original.name or "model",
        "summary": _summary(report),
        "colours": KIND_COLOURS,
        "original": {
            "nodes": original.nodes_json(
                node_kernels, [colour_kind(k) for k in launches], viewed, node_costs
            ),
            "edges": original.edges,
        },
        "program": _kernel_graph(result.program, covers, node_kernels, node_costs),
        "rules": _rules(report),
        "patterns": [
            {"op": p.op, "cost": p.cost, "covers": original.covered_by(p.replaced)}
            for p in sorted(report.patterns, key=lambda p: (p.op, p.replaced))
        ],
        "phases": report.phases,
    }


class _OriginalGraph:
    """The graph that was optimized, one node per ONNX node (its IR nodes share its name).

    Constants, and what is computed from constants alone, are left out: they are the optimizer's
    to fold.
    """

    def __init__(self, graph: Graph) -> None:
        dynamic = _dynamic_nodes(graph)
        self.members: list[list[Node]] = []
        self.io: list[str] = []
        self.names: list[str] = []
        self.edges: list[list[int]] = []
        self._by_link: dict[str, list[int]] = {}
        index: dict[int, int] = {}  # id(IR node) -> original node
        keys: dict[str, int] = {}
        for position, node in enumerate(graph.nodes):
            if id(node) not in dynamic:
                continue
            # Unnamed nodes (graphs built in code) stand alone; the report calls them by op.
            key = node.name or f"#{position}"
            if key not in keys:
                link = node.name or node.op.name
                keys[key] = self._add(link, "input" if isinstance(node.op, ops.Input) else "")
                self._by_link.setdefault(link, []).append(keys[key])
            index[id(node)] = keys[key]
            self.members[keys[key]].append(node)
        seen: set[tuple[int, int]] = set()
        for node in graph.nodes:
            if id(node) in index:
                sources = [index.get(id(v.producer)) for v in node.inputs]
                self._connect(sources, index[id(node)], seen)
        for name, value in zip(graph.output_names, graph.outputs, strict=True):
            self._connect([index.get(id(value.producer))], self._add(name, "output"), seen)

    def _add(self, name: str, io: str) -> int:
        self.names.append(name)
        self.io.append(io)
        self.members.append([])
        return len(self.names) - 1

    def _connect(
        self, sources: Iterable[int | None], target: int, seen: set[tuple[int, int]]
    ) -> None:
        for source in sources:
            if source is not None and source != target and (source, target) not in seen:
                seen.add((source, target))
                self.edges.append([source, target])

    def covered_by(self, names: Iterable[str]) -> list[int]:
        """The original nodes that `names` (as the report spells them) stand for."""
        return sorted({i for name in names for i in self._by_link.get(name, ())})

    def costs(self, costs_before: dict[str, float]) -> list[float]:
        """Each node's estimated seconds before optimization."""
        share = [0.0] * len(self.names)
        for name, nodes in self._by_link.items():
            for i in nodes:
                share[i] = costs_before.get(name, 0.0) / len(nodes)
        return share

    def nodes_json(
        self,
        kernels: list[list[int]],
        kinds: Sequence[str],
        viewed: set[int],
        costs: Sequence[float],
    ) -> list[dict[str, Any]]:
        """The nodes as the page shows them: name, ops, kind (colour) and covering kernels."""
        found = []
        for i, name in enumerate(self.names):
            if self.io[i]:
                kind = self.io[i]
            elif kernels[i]:
                kind = kinds[kernels[i][0]]
            else:
                kind = "view" if i in viewed else "removed"
            found.append(
                {
                    "name": name,
                    "ops": _ops_label(self.members[i]),
                    "kind": kind,
                    "cost": costs[i],
                    "kernels": kernels[i],
                    **({"type": str(self.members[i][-1].output.type)} if self.members[i] else {}),
                }
            )
        return found


def _dynamic_nodes(graph: Graph) -> set[int]:
    """The ids of the nodes that compute something at run time.

    The rest are constants and what is computed from constants alone, which the importer shares
    between readers (one broadcast constant for every LayerNorm of a model): drawn, they would
    tie distant parts of the graph together with edges that carry no data flow.
    """
    static: set[int] = set()
    found: set[int] = set()
    for node in graph.nodes:
        if isinstance(node.op, ops.Constant) or (
            node.inputs and all(id(v.producer) in static for v in node.inputs)
        ):
            static.add(id(node))
        else:
            found.add(id(node))
    return found


def _ops_label(nodes: Sequence[Node]) -> str:
    """The IR ops of an original node, import glue (views) left out when there is more."""
    names = [n.op.name for n in nodes if not isinstance(n.op, ops.Input)]
    work = [n.op.name for n in nodes if not isinstance(n.op, (*_GLUE_OPS, ops.Input))]
    return " · ".join(dict.fromkeys(work or names))


def _invert(covers: Sequence[Sequence[int]], count: int) -> list[list[int]]:
    """For each original node, the kernels that cover it."""
    found: list[list[int]] = [[] for _ in range(count)]
    for kernel, nodes in enumerate(covers):
        for i in nodes:
            found[i].append(kernel)
    return found


def _kernel_graph(
    program: Program,
    covers: Sequence[list[int]],
    node_kernels: Sequence[list[int]],
    node_costs: Sequence[float],
) -> dict[str, Any]:
    """The launches as a graph, graph inputs and outputs as extra nodes after the kernels.

    Views launch nothing: an edge from a view goes from the kernel that made its input.
    """
    launches = program.launches()
    nodes: list[dict[str, Any]] = []
    source: dict[int, int] = {}  # tensor id -> node that makes it
    for j, kernel in enumerate(launches):
        source[kernel.output] = j
        nodes.append(_kernel_json(kernel, program, covers[j], node_kernels, node_costs))
    for name, tensor in zip(program.input_names, program.inputs, strict=True):
        source[tensor] = len(nodes)
        nodes.append({"name": name, "kind": "input"})
    for kernel in program.kernels:
        if kernel.is_view and kernel.inputs[0] in source:
            source[kernel.output] = source[kernel.inputs[0]]
    edges: dict[tuple[int, int], None] = {}  # ordered, without repeats
    for target, kernel in enumerate(launches):
        for tensor in kernel.inputs:
            if tensor in source:
                edges[source[tensor], target] = None
    for name, tensor in zip(program.output_names, program.outputs, strict=True):
        nodes.append({"name": name, "kind": "output"})
        if tensor in source:
            edges[source[tensor], len(nodes) - 1] = None
    return {"nodes": nodes, "edges": [list(e) for e in edges], "kernels": len(launches)}


def _kernel_json(
    kernel: Kernel,
    program: Program,
    covers: list[int],
    node_kernels: Sequence[list[int]],
    node_costs: Sequence[float],
) -> dict[str, Any]:
    """One launch: what it computes, its estimated time before and after, what it covers."""
    # An original node split over several kernels counts a share in each.
    before = sum(node_costs[i] / len(node_kernels[i]) for i in covers)
    bodies = [
        f"{label}: {format_expr(expr)}"
        for label, expr in (
            ("body", kernel.body),
            ("prologue", kernel.prologue),
            ("epilogue", kernel.epilogue),
        )
        if expr is not None
    ]
    return {
        "name": kernel.op.name
        if kernel.op and (KernelKind.of_name(kernel.kind) is not None or kernel.kind == OPAQUE)
        else kernel.kind,
        "kind": colour_kind(kernel),
        "cost": kernel.cost,
        "before": before,
        "covers": covers,
        "type": str(program.tensors[kernel.output].type),
        "detail": bodies,
    }


def _rules(report: OptimizeReport) -> list[dict[str, Any]]:
    """The rules that fired, most matches first; typing and folding facts are marked."""
    found = []
    for name, count in sorted(report.rules_fired.items(), key=lambda kv: (-kv[1], kv[0])):
        ruleset = report.rulesets.get(name, "")
        found.append(
            {"name": name, "ruleset": ruleset, "count": count, "fact": ruleset in FACT_RULESETS}
        )
    return found


def _summary(report: OptimizeReport) -> dict[str, Any]:
    """The totals the page's header shows."""
    return {key: getattr(report, key) for key in _SUMMARY}


_SUMMARY = (
    "profile",
    "nodes_before",
    "nodes_after",
    "cost_before",
    "cost_after",
    "seconds",
    "stopped_by",
    "egraph_nodes",
    "user_rules",
)


_SLOT = re.compile(r"@([A-Z][A-Z0-9_]*)@")


def _fill(template: str, **values: str) -> str:
    """Fill every `@NAME@` slot of the page template in one pass (values are not searched)."""
    slots = set(_SLOT.findall(template))
    assert slots == values.keys(), f"report.html slots {sorted(slots)} != {sorted(values)}"
    return _SLOT.sub(lambda m: values[m[1]], template)
