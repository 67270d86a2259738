"""What the rule files declare, read back: signatures, enums, base facts, named rules."""

from __future__ import annotations

import pytest

from knopt.errors import RuleFileError
from knopt.opt.rules import RuleFile, shipped_rule_files
from knopt.testing.rulecheck.rulebook import LHS, read_rulebook
from knopt.testing.rulecheck.sexpr import Sym, head


def test_every_shipped_rule_is_read_with_its_ruleset() -> None:
    book = read_rulebook(shipped_rule_files())
    names = [r.name for r in book.rules]
    assert len(names) == len(set(names)) > 250
    assert {r.ruleset for r in book.rules} >= {"analysis", "fold", "algebra", "fusion"}
    assert book.rule("clamp-of-clamp").file == "clamp.egg"


def test_a_rewrite_becomes_a_query_on_its_left_side_and_a_union() -> None:
    rule = read_rulebook(shipped_rule_files()).rule("clamp-of-clamp")
    assert rule.query[0][:2] == (Sym("="), LHS)  # type: ignore[index]
    assert [head(atom) for atom in rule.query[1:]] == ["is-float", "<="]
    assert head(rule.actions[0]) == "union"


def test_signatures_enums_and_base_facts() -> None:
    book = read_rulebook(shipped_rule_files())
    assert book.signatures["Clamp"].args == ("T", "f64", "f64")
    assert book.signatures["shape"].kind == "function"
    assert book.signatures["folds"].kind == "relation"
    assert "REDUCE_SUM" in book.enums["Reduction"]
    assert book.enum_of("EXP") == "UnaryKind"
    assert book.containers == {"IVec": "i64", "TVec": "T"}
    assert len(book.base_facts["is-float"]) >= 4


def test_an_unknown_rule_name_is_an_error() -> None:
    with pytest.raises(RuleFileError, match="no-such-rule"):
        read_rulebook(shipped_rule_files()).rule("no-such-rule")


def test_an_unnamed_rule_is_refused_not_skipped() -> None:
    extra = RuleFile("user.egg", "(rewrite (UnaryOp (NEG) (UnaryOp (NEG) x)) x)")
    with pytest.raises(RuleFileError, match=r"user\.egg: the rule at offset 0 has no :name"):
        read_rulebook([*shipped_rule_files(), extra])


def test_a_birewrite_is_two_rules_named_as_egglog_names_them() -> None:
    extra = RuleFile(
        "user.egg", '(birewrite (UnaryOp (NEG) (UnaryOp (NEG) x)) x :ruleset algebra :name "nn")'
    )
    rules = [r for r in read_rulebook([*shipped_rule_files(), extra]).rules if r.file == "user.egg"]
    assert [r.name for r in rules] == ["nn=>", "nn<="]
    forward, backward = rules[0].query[0], rules[1].actions[0]
    assert isinstance(forward, tuple) and isinstance(backward, tuple)
    assert forward[2] == backward[2]  # the left side of one is the right side of the other
