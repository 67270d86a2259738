"""Seed instances: which rules get them, and the rules that run on them first."""

from __future__ import annotations

from knopt.opt.rules import shipped_rule_files
from knopt.testing.rulecheck.rulebook import read_rulebook
from knopt.testing.rulecheck.seeds import SEEDS, seed_deps, seed_graphs

BOOK = read_rulebook(shipped_rule_files())


def test_every_seed_relation_is_declared() -> None:
    assert {name for name in SEEDS if BOOK.signatures[name].kind == "relation"} == set(SEEDS)


def test_an_int4_rule_gets_both_int4_spellings_with_activations_of_each_rank() -> None:
    graphs = seed_graphs(BOOK, BOOK.rule("int4-matmul"), 0, 6)
    ops = [{type(node.op).__name__ for node in graph.nodes} for graph in graphs]
    assert sum("Concat" in found for found in ops) == 3  # MatMulNBits unpacks its nibbles
    assert sum("Cast" in found and "Concat" not in found for found in ops) == 3
    ranks = {graph.inputs[0].rank for graph in graphs}
    assert ranks == {2, 3}


def test_a_rule_that_reads_no_seed_relation_gets_no_seed() -> None:
    assert seed_graphs(BOOK, BOOK.rule("clamp-of-clamp"), 0, 6) == []


def test_the_rules_that_make_an_int4_weight_run_first_but_never_the_checked_rule() -> None:
    rule = BOOK.rule("int4-matmul")
    present = frozenset({"Input", "Constant", "MatMul", "View", "Cast", "BinaryOp"})
    deps = seed_deps(BOOK, rule, present)
    assert {"nbits-weight", "nbits-rows", "unpacked-nibbles", "pack-pairs"} <= deps
    assert "broadcast-of-code-cast" in deps  # a reordering rewrite of the same file
    assert "view-of-scalar-arithmetic" not in deps  # it adds ops
    assert "int4-matmul" not in deps
