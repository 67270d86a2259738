"""Unfolding derived atoms through their producers, and flattening queries."""

from __future__ import annotations

from knopt.opt.rules import shipped_rule_files
from knopt.testing.choices import SeededChoices
from knopt.testing.rulecheck.pattern import flatten
from knopt.testing.rulecheck.rulebook import Rulebook, read_rulebook
from knopt.testing.rulecheck.sexpr import Expr, Sym, head, read_forms
from knopt.testing.rulecheck.unfold import producers, unfold

BOOK: Rulebook = read_rulebook(shipped_rule_files())
INDEX = producers(BOOK)


def _unfolded(name: str, seed: int = 0, deep: bool = False) -> tuple[list[Expr], set[str]]:
    rule = BOOK.rule(name)
    found = unfold(BOOK, INDEX, rule.query, SeededChoices(seed), exclude=name, deep=deep)
    assert found is not None, f"{name} did not unfold"
    return found


def test_a_derived_relation_is_explained_by_the_rule_that_makes_it() -> None:
    atoms, deps = _unfolded("gelu")
    assert deps & {"gelu-erf-core", "gelu-tanh-core"}
    assert not any(head(a) == "gelu-core" for a in atoms)
    pattern = flatten(BOOK, atoms, deps)
    assert pattern is not None
    assert {c.name for c in pattern.bindings.values()} >= {"BinaryOp", "UnaryOp", "Splat"}


def test_a_kernel_term_is_explained_by_the_op_it_fuses() -> None:
    for seed in range(10):
        found = _unfolded("reduce-prologue", seed)
        if found is None:
            continue
        pattern = flatten(BOOK, *found)
        if pattern is None:
            continue
        ops = {c.name for c in pattern.bindings.values()}
        assert "Reduce" in ops
        assert not any(n.startswith("K") for n in ops)
        assert found[1] & {"fuse-unary", "fuse-binary", "fuse-clamp", "fuse-cast", "fuse-where"}
        return
    raise AssertionError("no seed explained KElem by a fused op")


def test_a_query_over_no_tensor_is_explained_deeply() -> None:
    atoms, _ = _unfolded("compose-step", deep=True)
    pattern = flatten(BOOK, atoms, set())
    assert pattern is not None
    assert [c.name for c in pattern.bindings.values()].count("Permute") == 2


def test_flattening_splits_bindings_facts_and_guards() -> None:
    rule = BOOK.rule("div-by-constant")
    pattern = flatten(BOOK, list(rule.query), set())
    assert pattern is not None
    (call,) = [c for c in pattern.bindings.values()]
    assert call.name == "BinaryOp" and call.args[0] == "DIV"
    assert ("coef", (Sym("c"),)) in pattern.facts
    assert any(head(g) == "is-float" for g in pattern.guards) or any(
        name == "is-float" for name, _ in pattern.facts
    )
    assert pattern.sorts["x"] == "T"


def test_a_variable_bound_to_two_different_ops_does_not_flatten() -> None:
    (form,) = read_forms("((= y (UnaryOp (NEG) x)) (= y (Softmax x 0)))")
    assert isinstance(form.expr, tuple)
    assert flatten(BOOK, list(form.expr), set()) is None
