"""knopt/opt/laws.py: per-op laws generated from schema.egg, with uniform guards and old names."""

from __future__ import annotations

import re

import pytest

from knopt.cli import main
from knopt.errors import RuleFileError
from knopt.opt.laws import (
    CONSTANT_LEAVES,
    ELEMENTWISE,
    GROWING,
    IR_CONSTRUCTORS,
    LAWS,
    ROLES,
    Constructor,
    expand_laws,
    read_constructors,
)
from knopt.opt.rules import RULE_FILES, generated_rules, rules_dir, shipped_rule_files
from knopt.testing.rulecheck.rulebook import Rule, read_rulebook
from knopt.testing.rulecheck.sexpr import to_text


@pytest.fixture(scope="module")
def constructors() -> list[Constructor]:
    return read_constructors((rules_dir() / "schema.egg").read_text())


@pytest.fixture(scope="module")
def rules() -> dict[str, Rule]:
    return {rule.name: rule for rule in read_rulebook(shipped_rule_files()).rules}


def _query(rule: Rule) -> str:
    return " ".join(to_text(atom) for atom in rule.query)


def _computing(constructors: list[Constructor]) -> list[Constructor]:
    return [op for op in constructors if op.tensors and "TVec" not in op.sorts]


def test_every_ir_constructor_of_the_schema_is_read(constructors: list[Constructor]) -> None:
    assert {op.name for op in constructors} == IR_CONSTRUCTORS


def test_op_groups_name_schema_constructors(constructors: list[Constructor]) -> None:
    names = {op.name for op in constructors}
    for group in (CONSTANT_LEAVES, ELEMENTWISE, GROWING, set(ROLES)):
        assert group <= names


def test_every_op_with_several_tensor_arguments_names_them(
    constructors: list[Constructor],
) -> None:
    several = {op.name for op in _computing(constructors) if len(op.tensors) > 1}
    assert several == set(ROLES)
    for op in constructors:
        assert len(op.roles()) == len(op.tensors)


def test_every_computing_op_folds_under_a_static_or_small_guard(
    constructors: list[Constructor], rules: dict[str, Rule]
) -> None:
    for op in _computing(constructors):
        rule = rules[f"fold-{op.stem}"]
        guard = "small" if op.name in GROWING else "static"
        assert f"({guard} e)" in _query(rule), rule.name
        assert _query(rule).count("(folds ") == len(op.tensors), rule.name


def test_every_tensor_argument_of_every_op_can_make_it_vary(
    constructors: list[Constructor], rules: dict[str, Rule]
) -> None:
    for op in _computing(constructors):
        roles = op.roles()
        for role in roles:
            name = f"varies-{op.stem}" + (f"-{role}" if len(roles) > 1 else "")
            assert f"(varies {role})" in _query(rules[name])


def test_every_tensor_argument_of_every_op_can_make_it_run_at_run_time(
    constructors: list[Constructor], rules: dict[str, Rule]
) -> None:
    for op in _computing(constructors):
        roles = op.roles()
        for role in roles:
            name = f"runtime-{op.stem}" + (f"-{role}" if len(roles) > 1 else "")
            assert f"(runtime {role})" in _query(rules[name])
            assert rules[name].file == "fusion.egg"


def test_every_op_but_elementwise_ones_and_constants_is_a_leaf(
    constructors: list[Constructor], rules: dict[str, Rule]
) -> None:
    leaves = {name for name in rules if name.startswith("leaf-")} - {"leaf-constant"}
    expected = {
        f"leaf-{op.stem}" for op in constructors if op.name not in ELEMENTWISE | CONSTANT_LEAVES
    }
    assert leaves == expected


def test_generated_rules_are_in_the_files_that_ask_for_them() -> None:
    shown = generated_rules()
    assert set(shown) == {"fold.egg", "fusion.egg"}
    texts = {f.name: f.text for f in shipped_rule_files()}
    for name, sections in shown.items():
        assert "@generate" not in texts[name]
        for section in sections:
            assert section in texts[name]
    assert len(LAWS) == sum(len(sections) for sections in shown.values())


def test_shipped_files_are_read_in_load_order() -> None:
    assert [f.name for f in shipped_rule_files()] == list(RULE_FILES)


def test_a_marker_naming_no_law_is_an_error(constructors: list[Constructor]) -> None:
    with pytest.raises(RuleFileError, match=r"mine\.egg: `@generate nonsense` names no law"):
        expand_laws(";; @generate nonsense\n", constructors, "mine.egg")


def test_an_op_with_unnamed_tensor_arguments_is_an_error() -> None:
    with pytest.raises(RuleFileError, match="Pair has 2 tensor arguments"):
        Constructor("Pair", ("T", "T")).roles()


def test_show_generated_prints_every_generated_rule(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-rules", "--show-generated"]) == 0
    out = capsys.readouterr().out
    names = re.findall(r':name "([^"]+)"', out)
    assert {"fold-softmax", "varies-where-else", "leaf-attention"} <= set(names)
    assert len(names) == sum(
        section.count("(rule ") for sections in generated_rules().values() for section in sections
    )
