"""Planted bad rule files: `knopt check-rules` reports each one UNSOUND or refuses it (exit 1),
and `optimize --rules` refuses what check-rules refuses, with the same error."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

import knopt
from knopt.cli import main
from knopt.errors import RuleFileError
from knopt.ir import DType, Unary
from tests.rules.helpers import graph_of


@dataclass(frozen=True)
class Planted:
    """A rule file and what check-rules must say: `REFUSED` (with `why`) or `UNSOUND`."""

    text: str
    verdict: str
    why: str = ""


PLANTED = {
    # The example: a clamp dropped by a rule without a name, which was never checked.
    "unnamed-rule": Planted("(rewrite (Clamp x lo hi) x)\n", "REFUSED", "no :name"),
    "top-level-union": Planted(
        "(union (Splat 1.0 (vec-of 3) (F32)) (Splat 2.0 (vec-of 3) (F32)))\n",
        "REFUSED",
        "top-level action `(union",
    ),
    "top-level-set": Planted(
        "(set (shape (Splat 1.0 (vec-of 3) (F32))) (vec-of 4))\n",
        "REFUSED",
        "top-level action `(set",
    ),
    "top-level-delete": Planted(
        "(delete (shape (Splat 1.0 (vec-of 3) (F32))))\n", "REFUSED", "top-level action `(delete"
    ),
    "top-level-fact": Planted("(is-float (I32))\n", "REFUSED", "top-level action `(is-float"),
    "rule-in-analysis": Planted(
        "(rule ((= e (UnaryOp (NEG) x)) (= s (shape x))) ((set (shape e) (vec-push s 1)))\n"
        '      :ruleset analysis :name "planted-wrong-shape")\n',
        "REFUSED",
        "joins ruleset `analysis`",
    ),
    "rule-in-fold": Planted(
        '(rule ((= e (Input n s d))) ((folds e)) :ruleset fold :name "planted-inputs-fold")\n',
        "REFUSED",
        "joins ruleset `fold`",
    ),
    "rule-in-fusion-facts": Planted(
        '(rule ((= e (UnaryOp k x))) ((leaf e)) :ruleset fusion-facts :name "planted-leaf")\n',
        "REFUSED",
        "joins ruleset `fusion-facts`",
    ),
    "run-schedule": Planted(
        '(rewrite (UnaryOp (NEG) (UnaryOp (NEG) x)) x :ruleset algebra :name "planted-nn")\n'
        "(run-schedule (run algebra))\n",
        "REFUSED",
        "`run-schedule` is not allowed",
    ),
    "push": Planted("(push)\n", "REFUSED", "`push` is not allowed"),
    "colliding-name": Planted(
        '(rewrite (UnaryOp (NEG) x) x :ruleset algebra :name "fold-softmax")\n',
        "REFUSED",
        "'fold-softmax' is already defined in fold.egg",
    ),
    "redeclared-constructor": Planted(
        "(constructor View (T IVec) T)\n", "REFUSED", "Function already bound View"
    ),
    # Wrong only when an integer sum or product wraps (the checker once drew integers in
    # [-5, 5] of int32 and int64 only, and called the first of these sound).
    "overflow-double-halve": Planted(
        "(rewrite (BinaryOp (DIV) (BinaryOp (MUL) x (Splat 2.0 s d)) (Splat 2.0 s d)) x\n"
        '         :when ((is-integer d)) :ruleset algebra :name "planted-double-halve")\n',
        "UNSOUND",
    ),
    "overflow-u8-successor": Planted(
        "(rewrite (BinaryOp (LESS) x (BinaryOp (ADD) x (Splat 1.0 s d))) (Splat 1.0 s (BOOL))\n"
        '         :when ((= d (U8))) :ruleset algebra :name "planted-u8-successor")\n',
        "UNSOUND",
    ),
    "overflow-i8-sum-cast": Planted(
        "(rewrite (Cast (BinaryOp (ADD) x y) (F32))\n"
        "         (BinaryOp (ADD) (Cast x (F32)) (Cast y (F32)))\n"
        '         :when ((= (dtype x) (I8))) :ruleset algebra :name "planted-i8-sum-cast")\n',
        "UNSOUND",
    ),
    "overflow-i16-square": Planted(
        "(rewrite (BinaryOp (LESS) (BinaryOp (MUL) x x) (Splat 0.0 s d)) (Splat 0.0 s (BOOL))\n"
        '         :when ((= d (I16))) :ruleset algebra :name "planted-i16-square")\n',
        "UNSOUND",
    ),
    # Both directions of a birewrite are rules; each is checked.
    "unsound-birewrite": Planted(
        "(birewrite (BinaryOp (SUB) x y) (BinaryOp (SUB) y x)\n"
        '           :ruleset algebra :name "planted-sub-commutes")\n',
        "UNSOUND",
    ),
}


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.egg"
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_check_rules_reports_a_planted_file_unsound_or_refuses_it(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    planted = PLANTED[name]
    path = _write(tmp_path, name, planted.text)
    assert main(["check-rules", str(path), "--jobs", "1", "--instances", "8"]) == 1
    err = capsys.readouterr().err
    if planted.verdict == "REFUSED":
        assert f"REFUSED   {name}.egg" in err
        assert planted.why in err
    else:
        assert "0 sound" in err
        assert "UNSOUND: " in err


@pytest.mark.parametrize("name", sorted(n for n, p in PLANTED.items() if p.verdict == "REFUSED"))
def test_optimize_refuses_what_check_rules_refuses(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, name, PLANTED[name].text)
    main(["check-rules", str(path), "--jobs", "1"])
    refused = capsys.readouterr().err.strip().removeprefix("REFUSED").strip()
    graph = graph_of(lambda g: g.unary(Unary.NEG, g.input("x", (3,), DType.F32)))
    with pytest.raises(RuleFileError) as caught:
        knopt.optimize(graph, rules=[path])
    assert str(caught.value) == refused
