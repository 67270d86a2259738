"""The egglog bridge: load rules and a graph, saturate under limits, read the result back.

The schedule (rules/schedule.egg) is run one step at a time: each item of its `run-schedule`,
and each round of a top-level `repeat`, is a step. Between steps the bridge checks the clock and
the e-graph's size, so a limit stops saturation with the best e-graph so far, never a hang.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from egglog import bindings as eb

from knopt.errors import OptimizeError, RuleFileError
from knopt.ir.graph import Graph
from knopt.opt.rules import RuleFile, load_rules, schedule_file, shipped_rule_files
from knopt.opt.serialized import EGraphData, ENode, locate_terms, parse_egraph
from knopt.opt.terms import SPAN, TermTables, graph_commands


@dataclass(frozen=True)
class Limits:
    """Bounds on saturation, checked between schedule steps."""

    seconds: float = 60.0
    nodes: int = 500_000


DEFAULT_LIMITS = Limits()


@dataclass
class Phase:
    """One schedule step: what ran, how long, how many matches."""

    name: str
    seconds: float
    matches: int


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


def _is_panic(err: BaseException) -> bool:
    # Rust panics arrive as pyo3's PanicException, a BaseException that egglog does not export.
    return type(err).__name__ == "PanicException"


def _run(egraph: eb.EGraph, commands: Sequence[Any], what: str) -> list[Any]:
    try:
        return list(egraph.run_program(*commands))
    except eb.EggSmolError as err:
        raise RuleFileError(f"{what}: {err}") from err
    except BaseException as err:
        if _is_panic(err):
            raise OptimizeError(f"egglog panicked during {what}: {err}") from err
        raise


def schedule_steps(egraph: eb.EGraph, schedule: RuleFile) -> list[list[tuple[str, Any]]]:
    """Per `run-schedule` (phase), its steps as (description, command), repeats unrolled.

    Raises:
        RuleFileError: If the schedule holds anything but `run-schedule` commands.
    """
    try:
        commands = egraph.parse_program(schedule.text, filename=schedule.name)
    except eb.EggSmolError as err:
        raise RuleFileError(f"{schedule.name}: {err}") from err
    phases = []
    for command in commands:
        if not isinstance(command, eb.UserDefined) or command.name != "run-schedule":
            raise RuleFileError(f"{schedule.name}: holds `{command}`; it may only run schedules")
        steps: list[tuple[str, Any]] = []
        phases.append(steps)
        item: Any
        for item in command.args:
            if getattr(item, "name", None) == "repeat":
                count, *body = item.args
                rounds = int(count.value.value)
                for round_ in range(rounds):
                    for part in body:
                        label = f"round {round_ + 1}/{rounds}: {part}"
                        steps.append((label, eb.UserDefined(SPAN, "run-schedule", [part])))
            else:
                steps.append((str(item), eb.UserDefined(SPAN, "run-schedule", [item])))
    return phases


def _size(egraph: eb.EGraph) -> int:
    (output,) = _run(egraph, [eb.PrintSize(SPAN, None)], "counting e-nodes")
    return sum(count for _, count in output.sizes)


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
        OptimizeError: If egglog fails while running.
    """
    egraph = eb.EGraph()
    load_rules(egraph, [*shipped_rule_files(), *extra_rules])
    tables = TermTables()
    loaded = graph_commands(graph, tables)
    _run(egraph, loaded.commands, "loading the graph")
    result = Saturation(EGraphData(), tables)
    start = time.perf_counter()
    phases = schedule_steps(egraph, schedule or schedule_file())
    if not 0 <= phase < len(phases):
        raise RuleFileError(f"the schedule has {len(phases)} phases, not a phase {phase + 1}")
    for step, (label, command) in enumerate(phases[phase]):
        # The first step always runs: it types every class, which extraction needs.
        if step and time.perf_counter() - start > limits.seconds:
            result.stopped_by = f"time limit ({limits.seconds:g} s)"
            break
        if step and (size := _size(egraph)) > limits.nodes:
            result.stopped_by = f"node limit ({limits.nodes} e-nodes, had {size})"
            break
        began = time.perf_counter()
        matches = 0
        for output in _run(egraph, [command], f"schedule step {label}"):
            counts = output.report.num_matches_per_rule
            result.rules_fired.update(counts)
            matches += sum(counts.values())
        result.phases.append(Phase(label, time.perf_counter() - began, matches))
    result.egraph_nodes = _size(egraph)
    serialized = egraph.serialize([], max_functions=None, max_calls_per_function=None)
    result.data = parse_egraph(serialized.to_json())
    result.ir_nodes = locate_terms(loaded.terms, result.data)
    return result


def check_rule_files(files: Sequence[RuleFile]) -> None:
    """Load rule files after the shipped ones as `saturate` does, without running anything.

    Raises:
        RuleFileError: If `optimize` would refuse one of them.
    """
    load_rules(eb.EGraph(), [*shipped_rule_files(), *files])
