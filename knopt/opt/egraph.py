"""The egglog bridge: load rules and a graph, saturate under limits, read the result back.

The schedule (rules/schedule.egg) runs in slices of one egglog iteration (`knopt.opt.schedule`):
between slices the bridge checks the clock and the e-graph's size, so a limit stops saturation
with the best e-graph so far, never a hang; an e-graph that one iteration blew far past the node
limit is rebuilt as it was before that iteration, and its size is known before it is read back.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from egglog import bindings as eb

from knopt.errors import OptimizeError, RuleFileError
from knopt.ir.graph import Graph
from knopt.opt.rules import RuleFile, load_rules, schedule_file, shipped_rule_files
from knopt.opt.schedule import (
    DEFAULT_LIMITS,
    Limits,
    Phase,
    ScheduleRunner,
    run_commands,
    schedule_steps,
)
from knopt.opt.serialized import EGraphData, ENode, locate_terms, parse_egraph
from knopt.opt.terms import TermTables, graph_commands

__all__ = ["DEFAULT_LIMITS", "Limits", "Phase", "Saturation", "check_rule_files", "saturate"]


@dataclass
class Saturation:
    """A saturated e-graph and how it got there."""

    data: EGraphData
    tables: TermTables
    ir_nodes: list[tuple[int, ENode]] = field(default_factory=list)  # per IR node: class, node
    rules_fired: Counter[str] = field(default_factory=Counter)
    phases: list[Phase] = field(default_factory=list)
    stopped_by: str | None = None
    egraph_nodes: int = 0


def _load(graph: Graph, files: Sequence[RuleFile]) -> tuple[eb.EGraph, Any, TermTables]:
    """A fresh e-graph with the rule files and the graph loaded, and the graph's terms."""
    egraph = eb.EGraph()
    load_rules(egraph, files)
    tables = TermTables()
    loaded = graph_commands(graph, tables)
    run_commands(egraph, loaded.commands, "loading the graph")
    return egraph, loaded, tables


def saturate(
    graph: Graph,
    extra_rules: Sequence[RuleFile] = (),
    limits: Limits = DEFAULT_LIMITS,
    schedule: RuleFile | None = None,
    phase: int = 0,
) -> Saturation:
    """Run one phase of the schedule over `graph` and return the serialized e-graph.

    Raises:
        RuleFileError: If a rule file or the schedule is malformed.
        OptimizeError: If egglog fails while running, or the e-graph is too big to read back.
    """
    files = [*shipped_rule_files(), *extra_rules]
    egraph, loaded, tables = _load(graph, files)
    phases = schedule_steps(egraph, schedule or schedule_file())
    if not 0 <= phase < len(phases):
        raise RuleFileError(f"the schedule has {len(phases)} phases, not a phase {phase + 1}")
    runner = ScheduleRunner(egraph, limits)
    runner.run(phases[phase])
    if runner.overshot():
        # One iteration blew the e-graph far past the limit: reading it back could take more
        # memory than there is. Rebuild it as it was before that iteration (egglog is
        # deterministic).
        egraph, loaded, tables = _load(graph, files)
        runner = runner.replay(egraph)
    result = Saturation(EGraphData(), tables, stopped_by=runner.stopped_by)
    result.rules_fired, result.phases = runner.rules_fired, runner.phases
    result.egraph_nodes = runner.size()
    result.data = _read_back(egraph, result.egraph_nodes)
    result.ir_nodes = locate_terms(loaded.terms, result.data)
    return result


def _read_back(egraph: eb.EGraph, size: int) -> EGraphData:
    """The serialized e-graph.

    Raises:
        OptimizeError: If there is not memory enough to read it back.
    """
    try:
        serialized = egraph.serialize([], max_functions=None, max_calls_per_function=None)
        return parse_egraph(serialized.to_json())
    except MemoryError as err:
        raise OptimizeError(
            f"the e-graph of {size} e-nodes is too big to read back; lower the node limit"
        ) from err


def check_rule_files(files: Sequence[RuleFile]) -> None:
    """Load rule files after the shipped ones as `saturate` does, without running anything.

    Raises:
        RuleFileError: If `optimize` would refuse one of them.
    """
    load_rules(eb.EGraph(), [*shipped_rule_files(), *files])
