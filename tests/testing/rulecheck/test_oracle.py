"""The egglog side of a check (one rule, unions recorded as pairs, facts in shadow tables),
the class values and the fact oracles."""

from __future__ import annotations

import numpy as np

from knopt.ir import DType, Graph, GraphBuilder
from knopt.opt.rules import shipped_rule_files
from knopt.testing.arrays import random_inputs
from knopt.testing.rulecheck.checkrun import CHECK, PAIR, check_files, run_check
from knopt.testing.rulecheck.oracle import ORACLES, check_fact, context
from knopt.testing.rulecheck.rulebook import Rulebook, read_rulebook
from knopt.testing.rulecheck.sexpr import head
from knopt.testing.rulecheck.values import ClassValues

FILES = shipped_rule_files()
BOOK = read_rulebook(FILES)


def _graph() -> Graph:
    g = GraphBuilder("clamps")
    x = g.input("x", (2, 3), DType.F32)
    g.output(g.clamp(g.clamp(x, lo=-1.0, hi=2.0), lo=0.0, hi=5.0), "y")
    g.output(g.add(x, x), "z")
    return g.build()


def test_the_checked_rule_moves_to_its_own_ruleset_and_records_instead_of_merging() -> None:
    files = check_files(FILES, BOOK, BOOK.rule("clamp-of-clamp"), [])
    clamp = next(f for f in files if f.name == "clamp.egg")
    assert '"clamp-of-clamp"' not in clamp.text
    extra = files[-1].text
    assert f":ruleset {CHECK}" in extra
    assert f"({PAIR} knopt-lhs (Clamp x" in extra


def test_a_union_becomes_a_pair_of_classes_whose_values_agree() -> None:
    graph = _graph()
    run = run_check(FILES, BOOK, BOOK.rule("clamp-of-clamp"), [], graph)
    assert run.fired == 1
    ((lhs, rhs),) = run.pairs
    assert lhs != rhs
    values = ClassValues(
        run.data, run.tables, run.ir_nodes, graph, random_inputs(graph, np.random.default_rng(0))
    )
    np.testing.assert_array_equal(values.value(lhs), values.value(rhs))


def test_facts_go_to_shadow_tables_and_oracles_judge_them() -> None:
    graph = _graph()
    run = run_check(FILES, BOOK, BOOK.rule("type-binary"), [], graph)
    shapes = [f for f in run.facts if f[0] == "shape"]
    assert shapes and all(value == (2, 3) for _, _, value in shapes)
    rng = np.random.default_rng(0)
    values = [
        ClassValues(run.data, run.tables, run.ir_nodes, graph, random_inputs(graph, rng))
        for _ in range(2)
    ]
    ctx = context(values[0], values[1], graph, run.ir_nodes)
    name, args, _ = shapes[0]
    assert check_fact(ctx, (name, args, (2, 3))) is None
    assert "shape (3, 2)" in str(check_fact(ctx, (name, args, (3, 2))))


def test_the_constant_oracle_tells_inputs_from_constants() -> None:
    graph = _graph()
    run = run_check(FILES, BOOK, BOOK.rule("varies-binary-left"), [], graph)
    rng = np.random.default_rng(0)
    values = [
        ClassValues(run.data, run.tables, run.ir_nodes, graph, random_inputs(graph, rng))
        for _ in range(2)
    ]
    ctx = context(values[0], values[1], graph, run.ir_nodes)
    (varying,) = {args[0] for name, args, _ in run.facts if name == "varies"}
    assert check_fact(ctx, ("varies", (varying,), None)) is None
    assert "changes with the inputs" in str(check_fact(ctx, ("folds", (varying,), None)))


def _derived(book: Rulebook) -> set[str]:
    """The functions and relations that some rule adds rows to."""
    found = set()
    for rule in book.rules:
        for action in rule.actions:
            name = head(action)
            if name == "set" and isinstance(action, tuple):
                name = head(action[1])
            if name in book.signatures and book.signatures[name].kind != "constructor":
                found.add(name)
    return found


def test_every_relation_a_shipped_rule_derives_has_an_oracle() -> None:
    missing = _derived(BOOK) - set(ORACLES)
    assert not missing, f"add oracles to knopt/testing/rulecheck/oracle.py for {sorted(missing)}"


def test_every_declared_relation_has_an_oracle_or_holds_base_facts_only() -> None:
    declared = {n for n, s in BOOK.signatures.items() if s.kind != "constructor"}
    data = {n for n in declared - _derived(BOOK) if n in BOOK.base_facts}
    assert declared == set(ORACLES) | data, sorted(declared ^ (set(ORACLES) | data))
    assert data == {
        "code-range",
        "compares",
        "conv-activation",
        "eight-bit",
        "four-bit",
        "int4-block",
        "is-float",
        "is-integer",
        "tests",
        "widens",
    }
