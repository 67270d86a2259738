"""Running rules/schedule.egg under limits that hold inside a step.

The schedule is read into steps: each item of a `run-schedule`, and each round of a top-level
`repeat`. A step runs as slices of one egglog iteration each: `(saturate a b)` becomes
`(run-schedule a b)` again and again until an iteration changes nothing (egglog's own test),
and `repeat`, `seq` and `run` are walked the same way. Between slices the runner checks the
clock and the e-graph's size, so no ruleset can run past a limit, however it was written.

The first step always runs whole: it types every class, which extraction needs. A stop inside a
later step is followed by saturating `analysis` (types only, no new e-nodes), so the classes the
last slices made have types too. Every slice run is recorded, so that an e-graph that one slice
blew far past the node limit can be rebuilt as it was before that slice (`replay`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from egglog import bindings as eb

from knopt.errors import OptimizeError, RuleFileError
from knopt.opt.rules import RuleFile
from knopt.opt.terms import SPAN

SETTLE = "analysis"  # typing.egg's ruleset: run after a stop so that every class has a type
OVERSHOOT = 2  # an e-graph above this many times the node limit is rebuilt one slice back


@dataclass(frozen=True)
class Limits:
    """Bounds on saturation, checked between slices of one egglog iteration."""

    seconds: float = 60.0
    nodes: int = 500_000


DEFAULT_LIMITS = Limits()


@dataclass
class Phase:
    """One schedule step: what ran, how long, how many matches."""

    name: str
    seconds: float
    matches: int


Step = tuple[str, Any]  # a description and the schedule expression


class _Stop(Exception):
    """A limit was hit; the message says which."""


def is_panic(err: BaseException) -> bool:
    """Whether `err` is a Rust panic (pyo3's PanicException, a BaseException egglog hides)."""
    return type(err).__name__ == "PanicException"


def run_commands(egraph: eb.EGraph, commands: Sequence[Any], what: str) -> list[Any]:
    """Run egglog commands, turning egglog's errors into knopt's.

    Raises:
        RuleFileError: If egglog refuses a command.
        OptimizeError: If egglog panics.
    """
    try:
        return list(egraph.run_program(*commands))
    except eb.EggSmolError as err:
        raise RuleFileError(f"{what}: {err}") from err
    except BaseException as err:
        if is_panic(err):
            raise OptimizeError(f"egglog panicked during {what}: {err}") from err
        raise


def egraph_size(egraph: eb.EGraph) -> int:
    """The rows of every function and relation of the e-graph (e-nodes and facts)."""
    (output,) = run_commands(egraph, [eb.PrintSize(SPAN, None)], "counting e-nodes")
    return sum(count for _, count in output.sizes)


def schedule_steps(egraph: eb.EGraph, schedule: RuleFile) -> list[list[Step]]:
    """Per `run-schedule` (phase), its steps as (description, expression), repeats unrolled.

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
        steps: list[Step] = []
        phases.append(steps)
        for item in command.args:
            if isinstance(item, eb.Call) and item.name == "repeat":
                rounds = _count(item.args[0])
                for round_ in range(rounds):
                    for part in item.args[1:]:
                        steps.append((f"round {round_ + 1}/{rounds}: {part}", part))
            else:
                steps.append((str(item), item))
    return phases


def _count(expr: Any) -> int:
    return int(expr.value.value)


def _is_run(expr: Any) -> bool:
    """Whether a schedule expression runs one iteration of rulesets (no loop inside)."""
    return not isinstance(expr, eb.Call) or expr.name not in ("saturate", "repeat", "seq")


@dataclass
class ScheduleRunner:
    """Runs schedule steps on one e-graph in slices, under limits.

    Attributes:
        slices: Every slice run so far, in order (what `replay` runs again).
        checked_from: The first slice that ran under the limits (after the first step).
        stopped_by: Which limit stopped the run, if one did.
    """

    egraph: eb.EGraph
    limits: Limits
    began: float = field(default_factory=time.perf_counter)
    rules_fired: Counter[str] = field(default_factory=Counter)
    phases: list[Phase] = field(default_factory=list)
    slices: list[Any] = field(default_factory=list)
    checked_from: int | None = None
    stopped_by: str | None = None
    _matches: int = 0
    _stopped_at: int = 0  # how many slices had run when a limit stopped the run
    _grown: bool = True  # whether a slice changed the e-graph since its size was last counted

    def run(self, steps: Sequence[Step]) -> None:
        """Run the steps until they end or a limit stops them (then settle the types)."""
        for index, (label, expr) in enumerate(steps):
            if index == 1:
                self.checked_from = len(self.slices)
            began, self._matches = time.perf_counter(), 0
            try:
                self._execute(expr)
                if index == len(steps) - 1:
                    self._check()  # the last slice, as every other, is followed by a check
            except _Stop as stop:
                self.stopped_by = str(stop)
                self._stopped_at = len(self.slices)
            self.phases.append(Phase(label, time.perf_counter() - began, self._matches))
            if self.stopped_by is not None:
                if not self.overshot():  # else it is rebuilt one slice back (`replay`) anyway
                    self._settle()
                return

    def overshot(self) -> bool:
        """Whether the slice that hit the node limit left the e-graph far above it."""
        last = self._stopped_at - 1
        checked = self.checked_from is not None and last >= self.checked_from
        return checked and self.size() > OVERSHOOT * self.limits.nodes

    def replay(self, egraph: eb.EGraph) -> ScheduleRunner:
        """A runner that has run, on `egraph` (freshly loaded), every slice before that one."""
        again = ScheduleRunner(egraph, self.limits, phases=list(self.phases))
        began = time.perf_counter()
        last = self._stopped_at - 1
        for expr in self.slices[:last]:
            again._slice(expr)
        again.stopped_by = (
            f"{self._node_limit(self.size())}: the iteration that made them, "
            f"{self.slices[last]}, was undone"
        )
        again._settle()
        again.phases.append(Phase("undo the last iteration", time.perf_counter() - began, 0))
        return again

    def size(self) -> int:
        """The e-graph's size now."""
        return egraph_size(self.egraph)

    def _execute(self, expr: Any) -> bool:
        """Run one schedule expression in slices; whether it changed the e-graph."""
        name = getattr(expr, "name", None) if isinstance(expr, eb.Call) else None
        if name == "saturate":
            changed = False
            while self._sequence(expr.args):
                changed = True
            return changed
        if name == "repeat":
            changed = False
            for _ in range(_count(expr.args[0])):
                if not self._sequence(expr.args[1:]):
                    break  # an iteration that changes nothing changes nothing the next time
                changed = True
            return changed
        if name == "seq":
            return self._sequence(expr.args)
        self._check()
        return self._slice(expr)

    def _sequence(self, exprs: Sequence[Any]) -> bool:
        if all(_is_run(expr) for expr in exprs):
            # One iteration of each ruleset in turn is one slice: a call to egglog costs about
            # 0.3 ms, and the sequence is bounded by its rulesets' single iterations.
            self._check()
            return self._slice(eb.Call(SPAN, "seq", list(exprs)))
        changed = False
        for expr in exprs:
            changed |= self._execute(expr)
        return changed

    def _slice(self, expr: Any) -> bool:
        command = eb.UserDefined(SPAN, "run-schedule", [expr])
        changed = False
        for output in run_commands(self.egraph, [command], f"schedule step {expr}"):
            report = output.report  # each access converts the whole report
            counts = report.num_matches_per_rule
            self.rules_fired.update(counts)
            self._matches += sum(counts.values())
            changed |= bool(report.updated)
        self.slices.append(expr)
        self._grown |= changed
        return changed

    def _check(self) -> None:
        if self.checked_from is None:
            return
        if time.perf_counter() - self.began > self.limits.seconds:
            raise _Stop(f"time limit ({self.limits.seconds:g} s)")
        if not self._grown:
            return  # counting takes about a millisecond; a slice that changed nothing grew nothing
        self._grown = False
        if (size := self.size()) > self.limits.nodes:
            raise _Stop(self._node_limit(size))

    def _node_limit(self, size: int) -> str:
        return f"node limit ({self.limits.nodes} e-nodes, had {size})"

    def _settle(self) -> None:
        checked_from, self.checked_from = self.checked_from, None
        self._execute(eb.Call(SPAN, "saturate", [eb.Var(SPAN, SETTLE)]))
        self.checked_from = checked_from
