"""`optimize`: graph in, cheaper equivalent graph out, with a report of what happened."""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from knopt.errors import UnsupportedOpError
from knopt.ir.graph import Graph, Node
from knopt.ir.kernel import KernelKind
from knopt.ir.op import Opaque
from knopt.ir.program import Program, program_from_graph
from knopt.ir.shape import evaluate
from knopt.ir.validate import validate
from knopt.opt.cost import CostModel, DeviceProfile, find_profile
from knopt.opt.egraph import DEFAULT_LIMITS, Limits, Phase, Saturation, saturate
from knopt.opt.extract import Extraction, extract
from knopt.opt.rebuild import Rebuilt, rebuild_graph
from knopt.opt.report import OptimizeReport, Pattern, attribute
from knopt.opt.rules import RuleFile, read_rule_file, rulesets_of, shipped_rule_files
from knopt.opt.serialized import ENode
from knopt.opt.terms import SENTINEL_BASE, TermTables


@dataclass
class OptimizeResult:
    """The optimized graph, its kernel program, and the report (`knopt.save` writes it as ONNX).

    Attributes:
        graph: The optimized IR graph (fused kernels written out as their ops).
        program: The same computation as kernels, as extraction grouped them.
        report: What optimization did.
        original: The graph that was optimized (for reports that show it beside the program).
    """

    graph: Graph
    program: Program
    report: OptimizeReport
    groups: dict[Node, int] = field(default_factory=dict)  # fused graph node -> kernel key
    group_kinds: dict[int, str] = field(default_factory=dict)  # kernel key -> kernel kind
    original: Graph | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        # The dataclass's own repr would print every weight of the graph.
        r = self.report
        kernels = f"{r.kernels} kernel{'' if r.kernels == 1 else 's'}"
        return (
            f"<OptimizeResult {r.nodes_before} -> {r.nodes_after} IR nodes, {kernels}, "
            f"estimated {r.cost_before * 1e6:.1f} -> {r.cost_after * 1e6:.1f} us "
            f"({r.profile})>"
        )


@dataclass
class _Phase:
    """One schedule phase run and extracted."""

    saturation: Saturation
    extraction: Extraction
    rebuilt: Rebuilt
    model: CostModel
    roots: list[int]
    seconds: float


def _run_phase(
    graph: Graph,
    phase: int,
    extra: Sequence[RuleFile],
    device: DeviceProfile,
    limits: Limits,
    ilp: bool,
    sizes: Mapping[str, int],
    progress: Callable[[str], None],
) -> _Phase:
    began = time.perf_counter()
    name = ("algebra", "kernels")[phase]
    progress(f"{name}: saturating {len(graph.nodes)} nodes")
    saturation = saturate(graph, extra, limits, phase=phase)
    data = saturation.data
    roots = [saturation.ir_nodes[graph.nodes.index(v.producer)][0] for v in graph.outputs]
    model = CostModel(data, device, symbols=symbol_values(saturation.tables, sizes, device))
    extracted = time.perf_counter()
    progress(f"{name}: extracting from {saturation.egraph_nodes} e-nodes")
    extraction = extract(
        data, roots, model.node_cost, saturation.ir_nodes, ilp_max_nodes=4000 if ilp else 0
    )
    saturation.phases.append(Phase("extraction", time.perf_counter() - extracted, 0))
    rebuilt = rebuild_graph(data, saturation.tables, extraction.choice, roots, graph)
    validate(rebuilt.graph)
    return _Phase(saturation, extraction, rebuilt, model, roots, time.perf_counter() - began)


def _silent(line: str) -> None:
    """A progress callback that shows nothing."""


def optimize(
    graph: Graph,
    *,
    rules: Sequence[str | Path | RuleFile] = (),
    profile: str | os.PathLike[str] | DeviceProfile = "cpu",
    limits: Limits = DEFAULT_LIMITS,
    ilp: bool = True,
    sizes: Mapping[str, int] | None = None,
    progress: Callable[[str], None] | None = None,
    strict: bool = False,
) -> OptimizeResult:
    """Optimize `graph` by equality saturation and cost-based extraction.

    Phase 1 rewrites the graph with the algebra rules and extracts the cheapest program of ops;
    phase 2 groups that program's ops into fused kernels (rules/schedule.egg). Symbolic sizes
    stay symbolic: the result serves every size, and is bound to the actual sizes when it runs.

    Args:
        graph: The graph to optimize (it is not changed).
        rules: Extra rule files, run with the shipped ones (their rules go in `algebra`).
        profile: The device whose costs guide extraction: "cpu", "h200", "h200-graph", a
            profile file written by `knopt calibrate`, or a `DeviceProfile`.
        limits: Saturation bounds per phase; hitting one keeps the best e-graph so far.
        ilp: Whether to refine extraction with an ILP when the e-graph is small enough.
        sizes: The representative value of named symbolic sizes, at which kernels are costed
            (such as the "opt" sizes of a profile); a size not given counts the device
            profile's `symbol_size`.
        progress: Called with a short line as each phase starts (saturation, extraction),
            for a status display.
        strict: Refuse a graph that holds opaque ops (ONNX nodes of ops knopt lacks, kept as
            they are); without it, they are values no rule looks inside.

    Raises:
        RuleFileError: If a rule file is malformed.
        OptimizeError: If the rules or extraction produce something unusable.
        UnsupportedOpError: With `strict`, if the graph holds an opaque op.
    """
    if strict:
        _refuse_opaque_ops(graph)
    start = time.perf_counter()
    device = find_profile(profile)
    extra = [r if isinstance(r, RuleFile) else read_rule_file(r) for r in rules]
    sizes = dict(sizes or {})
    with _collector_paused():
        algebra = _run_phase(graph, 0, extra, device, limits, ilp, sizes, progress or _silent)
        first = algebra.rebuilt.graph
        kernels = _run_phase(first, 1, extra, device, limits, ilp, sizes, progress or _silent)
    optimized = kernels.rebuilt.graph
    # Original node names: through phase 1's classes to its graph, then through phase 2's.
    origin = _origins(graph, algebra)
    names = {
        cls: sorted({name for i in nodes for name in origin.get(first.nodes[i], [])})
        for cls, nodes in attribute(
            first, kernels.saturation.ir_nodes, kernels.extraction.choice
        ).items()
    }
    unfolded = CostModel(
        algebra.saturation.data,
        device,
        folding=False,
        symbols=symbol_values(algebra.saturation.tables, sizes, device),
    )
    fired = algebra.saturation.rules_fired + kernels.saturation.rules_fired
    report = OptimizeReport(
        rules_fired={k: v for k, v in sorted(fired.items()) if v},
        rulesets=rulesets_of([*shipped_rule_files(), *extra]),
        nodes_before=len(graph.nodes),
        nodes_after=len(optimized.nodes),
        cost_before=sum(unfolded.node_cost(c, n) for c, n in algebra.saturation.ir_nodes),
        cost_after=kernels.extraction.cost,
        stopped_by=algebra.saturation.stopped_by or kernels.saturation.stopped_by,
        phases=[
            {"name": f"algebra: {p.name}", "seconds": p.seconds, "matches": p.matches}
            for p in algebra.saturation.phases
        ]
        + [
            {"name": f"kernels: {p.name}", "seconds": p.seconds, "matches": p.matches}
            for p in kernels.saturation.phases
        ],
        egraph_nodes=algebra.saturation.egraph_nodes + kernels.saturation.egraph_nodes,
        extraction=f"{algebra.extraction.method}, then {kernels.extraction.method}",
        ilp_status=f"{algebra.extraction.ilp_status}; {kernels.extraction.ilp_status}",
        profile=device.name,
        user_rules=[r.name for r in extra],
        costs_before=_costs_before(graph, algebra.saturation.ir_nodes, unfolded),
    )
    choice, rebuilt, model = kernels.extraction.choice, kernels.rebuilt, kernels.model
    program = _program(rebuilt, choice, model, names)
    report.patterns = _patterns(algebra, origin)
    report.kernels = len(program.launches())
    report.program = [
        {"kind": k.kind, "op": k.op.name if k.op else "", "seconds": k.cost, "names": list(k.names)}
        for k in program.launches()
    ]
    report.seconds = time.perf_counter() - start
    kinds = {key: _kernel_kind(choice[key]) for key in set(rebuilt.kernel_of.values())}
    return OptimizeResult(optimized, program, report, dict(rebuilt.kernel_of), kinds, graph)


def _refuse_opaque_ops(graph: Graph) -> None:
    """Raise for the graph's opaque ops (what `strict` asks), naming them all.

    Raises:
        UnsupportedOpError: If there is one.
    """
    calls = list(dict.fromkeys(n.op.call for n in graph.nodes if isinstance(n.op, Opaque)))
    if not calls:
        return
    named = ", ".join(f"'{c.node_name}' ({c})" if c.node_name else str(c) for c in calls[:5])
    more = f" and {len(calls) - 5} more" if len(calls) > 5 else ""
    first = calls[0]
    raise UnsupportedOpError(
        f"graph '{graph.name}' holds {len(calls)} node(s) of ops knopt lacks, kept as they are: "
        f"{named}{more}; without strict, the optimizer works around them",
        first.op_type,
        first.domain,
        first.node_name,
    )


def symbol_values(
    tables: TermTables, sizes: Mapping[str, int], device: DeviceProfile
) -> dict[int, int]:
    """The representative value of each symbolic dimension of an e-graph, by its i64 code.

    A dimension is a polynomial of named sizes (`batch*seq`, `seq + 1`); it is evaluated with
    `sizes`, where each name missing counts `device.symbol_size`, and is at least 1.
    """
    values: dict[int, int] = {}
    for index, dim in enumerate(tables.symbols):
        named = {name: sizes.get(name, device.symbol_size) for name in dim.symbols()}
        values[SENTINEL_BASE - index] = max(1, evaluate(dim, named))
    return values


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector (restoring its state after).

    Saturation and extraction allocate millions of small objects that form no cycles (the
    serialized e-graph, its tables); the collector would rescan all of them again and again,
    which grows faster than the graph (measured: 19.8 s -> 16.9 s at 16k nodes).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _origins(graph: Graph, phase: _Phase) -> dict[Node, list[str]]:
    """For each node of phase 1's graph, the original node names it stands for."""
    per_class = {
        # One ONNX node often imports as several IR nodes of its name: each name once.
        cls: list(dict.fromkeys(graph.nodes[i].name or graph.nodes[i].op.name for i in nodes))
        for cls, nodes in attribute(
            graph, phase.saturation.ir_nodes, phase.extraction.choice
        ).items()
    }
    rebuilt = phase.rebuilt
    found: dict[Node, list[str]] = {}
    for node in rebuilt.graph.nodes:
        cls = rebuilt.kernel_of.get(node, rebuilt.class_of.get(node))
        if cls is not None:
            found[node] = per_class.get(cls, [])
    return found


def _costs_before(
    graph: Graph, ir_nodes: Sequence[tuple[int, ENode]], model: CostModel
) -> dict[str, float]:
    """The estimated seconds of each original node name (summed over its IR nodes)."""
    found: dict[str, float] = {}
    for node, (cls, enode) in zip(graph.nodes, ir_nodes, strict=True):
        name = node.name or node.op.name
        found[name] = found.get(name, 0.0) + model.node_cost(cls, enode)
    return found


def _kernel_kind(node: ENode) -> str:
    kind = KernelKind.of_constructor(node.op)
    return node.op if kind is None else kind


RECOGNISED = frozenset(
    {
        "LayerNorm",
        "RmsNorm",
        "Softmax",
        "Attention",
        "Rope",
        "GELU",
        "GELU_TANH",
        "SILU",
        "SIGMOID",
        "HARD_SIGMOID",
        "HARD_SWISH",
    }
)


def _patterns(algebra: _Phase, origin: dict[Node, list[str]]) -> list[Pattern]:
    """The ops phase 1 recognised, each with the original nodes it replaces.

    Phase 1, not the kernel phase: a fused kernel holds several recognised ops (a LayerNorm
    with a GELU epilogue), and each should name its own nodes, not the kernel's.
    """
    rebuilt, choice, model = algebra.rebuilt, algebra.extraction.choice, algebra.model
    found = []
    for node in rebuilt.graph.nodes:
        cls = rebuilt.class_of.get(node)
        if node.op.name not in RECOGNISED or cls is None:
            continue
        replaced = origin.get(node) or ([node.name] if node.name else [])
        found.append(Pattern(node.op.name, replaced, model.node_cost(cls, choice[cls])))
    return found


def _program(
    rebuilt: Rebuilt, choice: dict[int, ENode], model: CostModel, names: dict[int, list[str]]
) -> Program:
    """The kernel program of an extraction, with each kernel's cost and original names."""
    # Fused kernels by their class; single-op kernels by their node.
    costs: dict[Node | int, float] = {}
    kernel_names: dict[Node | int, list[str]] = {}
    for cls in set(rebuilt.kernel_of.values()):
        costs[cls] = model.node_cost(cls, choice[cls])
        kernel_names[cls] = names.get(cls, [])
    for node, cls in rebuilt.class_of.items():
        if node not in rebuilt.kernel_of:
            costs[node] = model.node_cost(cls, choice[cls])
            if cls in names:
                kernel_names[node] = names[cls]
    return program_from_graph(rebuilt.graph, rebuilt.kernel_of, costs, kernel_names)
