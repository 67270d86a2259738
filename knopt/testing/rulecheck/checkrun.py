"""One egglog run that applies a single rule to a batch of instances and records what it did.

The checked rule is taken out of its ruleset and re-declared in ruleset `knopt-check` with
every `union` replaced by a `knopt-check-pair` fact and every fact it sets written to a shadow
table (`knopt-shadow-shape`...): nothing is merged, so both sides of each application stay
apart in the e-graph and can be extracted and compared, and each fact it derives is known. The
rules it needs to fire (found by `unfold.unfold`) are copied into `knopt-deps` and run first;
the saturated analyses (`analysis`, `fold` and, for fusion rules, `fusion-facts`) run as usual.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from egglog import bindings as eb

from knopt.errors import OptimizeError, RuleFileError
from knopt.ir.graph import Graph
from knopt.opt.rules import RuleFile, load_rules
from knopt.opt.serialized import EGraphData, ENode, Ref, SRef, locate_terms, parse_egraph
from knopt.opt.terms import TermTables, graph_commands
from knopt.testing.rulecheck.facts import Fact, read_facts
from knopt.testing.rulecheck.pattern import flatten
from knopt.testing.rulecheck.rulebook import Rule, Rulebook
from knopt.testing.rulecheck.sexpr import Expr, Lit, Sym, head, to_text

CHECK = "knopt-check"
DEPS = "knopt-deps"
PAIR = "knopt-check-pair"
SCALAR_PAIR = "knopt-check-pair-s"
SHADOW = "knopt-shadow-"
FUSION = frozenset({"fusion", "fusion-facts"})


@dataclass
class CheckRun:
    """What the checked rule did to the batch.

    Attributes:
        fired: How often its query matched.
        pairs: Tensor classes (left side, right side) of each union it would have made.
        scalar_pairs: The same for scalar-body classes.
        facts: The facts it derived (kept in shadow tables, so even facts that other rules
            had derived already are counted and checked).
    """

    data: EGraphData
    tables: TermTables
    ir_nodes: list[tuple[int, ENode]]
    fired: int = 0
    pairs: list[tuple[int, int]] = field(default_factory=list)
    scalar_pairs: list[tuple[int, int]] = field(default_factory=list)
    facts: list[Fact] = field(default_factory=list)


def _sort_of(book: Rulebook, sorts: dict[str, str], expr: Expr) -> str:
    if isinstance(expr, Sym):
        return sorts.get(expr.name, "T")
    signature = book.signatures.get(head(expr) or "")
    return signature.out if signature is not None else "T"


def _checked_actions(book: Rulebook, rule: Rule) -> tuple[list[Expr], list[str]]:
    """The rule's actions, recording instead of changing, and the names of the shadowed facts.

    Unions become pair facts, and the facts it sets go to shadow tables.
    """
    pattern = flatten(book, list(rule.query), set())
    sorts = pattern.sorts if pattern is not None else {}
    actions: list[Expr] = []
    shadowed: list[str] = []
    for action in rule.actions:
        name = head(action)
        assert isinstance(action, tuple)
        signature = book.signatures.get(name or "")
        if name == "union":
            relation = SCALAR_PAIR if _sort_of(book, sorts, action[1]) == "S" else PAIR
            actions.append((Sym(relation), action[1], action[2]))
        elif name == "set" and isinstance(action[1], tuple):
            target = str(action[1][0])
            shadowed.append(target)
            actions.append((action[0], (Sym(SHADOW + target), *action[1][1:]), action[2]))
        elif signature is not None and signature.kind == "relation":
            shadowed.append(str(name))
            actions.append((Sym(SHADOW + str(name)), *action[1:]))
        else:
            actions.append(action)
    return actions, shadowed


def _shadow(book: Rulebook, name: str) -> str:
    signature = book.signatures[name]
    args = " ".join(signature.args)
    if signature.kind == "relation":
        return f"(relation {SHADOW}{name} ({args}))"
    return f"(function {SHADOW}{name} ({args}) {signature.out} :merge old)"


def _declare(rule: Rule, actions: Sequence[Expr], ruleset: str, name: str) -> str:
    query = " ".join(to_text(q) for q in rule.query)
    body = " ".join(to_text(a) for a in actions)
    return f"(rule ({query}) ({body}) :ruleset {ruleset} :name {to_text(Lit(name))})"


def check_files(
    files: Sequence[RuleFile], book: Rulebook, target: Rule, deps: Sequence[str]
) -> list[RuleFile]:
    """The rule files for checking `target`: it moves to `knopt-check`, deps are copied."""
    changed = []
    for rule_file in files:
        text = rule_file.text
        if rule_file.name == target.file:
            text = text[: target.form.start] + text[target.form.end :]
        changed.append(replace(rule_file, text=text))
    lines = [
        f"(ruleset {CHECK})",
        f"(ruleset {DEPS})",
        f"(relation {PAIR} (T T))",
        f"(relation {SCALAR_PAIR} (S S))",
    ]
    actions, shadowed = _checked_actions(book, target)
    lines += [_shadow(book, name) for name in sorted(set(shadowed))]
    lines.append(_declare(target, actions, CHECK, target.name))
    for name in sorted(deps):
        dep = book.rule(name)
        lines.append(_declare(dep, dep.actions, DEPS, f"dep {name}"))
    changed.append(RuleFile("knopt-check.egg", "\n".join(lines) + "\n"))
    return changed


def _run(egraph: eb.EGraph, text: str, target: str) -> int:
    """Run schedule text; returns how often the rule `target` matched."""
    try:
        outputs = egraph.run_program(*egraph.parse_program(text))
    except eb.EggSmolError as err:
        raise RuleFileError(f"checking schedule `{text}`: {err}") from err
    except BaseException as err:
        if type(err).__name__ == "PanicException":
            raise OptimizeError(f"egglog panicked while checking: {err}") from err
        raise
    return sum(
        int(o.report.num_matches_per_rule.get(target, 0)) for o in outputs if hasattr(o, "report")
    )


def _snapshot(egraph: eb.EGraph) -> str:
    return str(egraph.serialize([], max_functions=None, max_calls_per_function=None).to_json())


def run_check(
    files: Sequence[RuleFile],
    book: Rulebook,
    target: Rule,
    deps: Sequence[str],
    graph: Graph,
    rounds: int = 3,
) -> CheckRun:
    """Load `graph`, run the deps `rounds` times, then the checked rule once; read what it did.

    Raises:
        RuleFileError: If the files or the check schedule do not load.
        OptimizeError: If egglog panics.
    """
    pattern = flatten(book, list(target.query), set())
    reads_bodies = pattern is not None and "S" in pattern.sorts.values()
    uses_fusion = (
        reads_bodies
        or target.ruleset in FUSION
        or any(book.rule(d).ruleset in FUSION for d in deps)
    )
    facts_rulesets = "analysis fold" + (" fusion-facts" if uses_fusion else "")
    saturate = f"(run-schedule (saturate {facts_rulesets}))"
    egraph = eb.EGraph()
    load_rules(egraph, check_files(files, book, target, deps))
    tables = TermTables()
    loaded = graph_commands(graph, tables)
    egraph.run_program(*loaded.commands)
    _run(egraph, saturate, target.name)
    if deps:
        repeat = f"(run-schedule (repeat {rounds} (seq (run {DEPS}) (saturate {facts_rulesets}))))"
        _run(egraph, repeat, target.name)
    fired = _run(egraph, f"(run-schedule (run {CHECK}))", target.name)
    _run(egraph, saturate, target.name)  # types the classes the right sides made
    text = _snapshot(egraph)
    data = parse_egraph(text)
    result = CheckRun(data, tables, locate_terms(loaded.terms, data), fired)
    shadows = {SHADOW + s.name for s in book.signatures.values() if s.kind != "constructor"}
    for name, args, value in sorted(read_facts(text, shadows | {PAIR, SCALAR_PAIR}), key=repr):
        if name == PAIR and isinstance(args[0], Ref) and isinstance(args[1], Ref):
            result.pairs.append((args[0].id, args[1].id))
        elif name == SCALAR_PAIR and isinstance(args[0], SRef) and isinstance(args[1], SRef):
            result.scalar_pairs.append((args[0].id, args[1].id))
        elif name.startswith(SHADOW):
            result.facts.append((name.removeprefix(SHADOW), args, value))
    return result
