"""User rule files: `--rules extra.egg` joins the shipped rules; malformed files are refused."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import knopt
from knopt.cli import main
from knopt.errors import RuleFileError
from knopt.ir import Unary
from knopt.opt.explain import format_report
from knopt.opt.rules import shipped_rule_files
from tests.oracle import assert_same, run_onnxruntime
from tests.rules.helpers import F32, graph_of, optimize_and_compare

ABS_OF_ABS = """\
;; A user's rule file: abs is idempotent.
(rewrite (UnaryOp (ABS) (UnaryOp (ABS) x)) (UnaryOp (ABS) x) :ruleset algebra :name "abs-of-abs")
"""


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def _abs_of_abs_model(path: Path) -> Path:
    """exp(|(|x|)|), as a tiny ONNX model."""
    nodes = [
        helper.make_node("Abs", ["x"], ["a"], name="inner"),
        helper.make_node("Abs", ["a"], ["b"], name="outer"),
        helper.make_node("Exp", ["b"], ["y"], name="exp"),
    ]
    graph = helper.make_graph(
        nodes,
        "abs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return path


def _abs_of_abs_graph(g: knopt.ir.GraphBuilder) -> knopt.ir.Value:
    return g.unary(Unary.ABS, g.unary(Unary.ABS, g.input("x", (3, 4), F32)))


def test_user_rule_file_takes_part_and_is_explained(tmp_path: Path) -> None:
    model = _abs_of_abs_model(tmp_path / "abs.onnx")
    rules = _write(tmp_path, "idempotent.egg", ABS_OF_ABS)
    out, report = tmp_path / "out.onnx", tmp_path / "report.json"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(io.StringIO()):
        status = main(
            [
                "optimize",
                str(model),
                "-o",
                str(out),
                "--rules",
                str(rules),
                "--explain",
                "--report-json",
                str(report),
            ]
        )
    assert status == 0
    assert "abs-of-abs" in stdout.getvalue()
    assert "idempotent.egg" in stdout.getvalue()
    data = json.loads(report.read_text())
    assert data["rules_fired"]["abs-of-abs"] > 0
    assert data["user_rules"] == ["idempotent.egg"]
    saved = onnx.load(out)
    feeds = {"x": np.random.default_rng(0).uniform(-3, 3, (3, 4)).astype(np.float32)}
    assert_same(run_onnxruntime(saved, feeds), run_onnxruntime(onnx.load(model), feeds))


def test_user_rule_rewrites_through_the_library(tmp_path: Path, rng: np.random.Generator) -> None:
    rules = _write(tmp_path, "idempotent.egg", ABS_OF_ABS)
    result = knopt.optimize(graph_of(_abs_of_abs_graph), rules=[rules])
    assert result.graph.op_histogram()["ABS"] == 1
    assert result.report.rulesets["abs-of-abs"] == "algebra"
    assert "abs-of-abs" in format_report(result.report)
    # Without the file, nothing makes the two into one.
    plain = optimize_and_compare(_abs_of_abs_graph, rng)
    assert plain.count("ABS") == 2


def test_user_rule_without_a_ruleset_joins_algebra(tmp_path: Path) -> None:
    text = ABS_OF_ABS.replace(" :ruleset algebra", "")
    result = knopt.optimize(graph_of(_abs_of_abs_graph), rules=[_write(tmp_path, "a.egg", text)])
    assert result.report.rules_fired.get("abs-of-abs", 0) > 0


@pytest.mark.parametrize(
    "text",
    [
        '(rewrite (UnaryOp (ABS) (UnaryOp (ABS) x) :name "unclosed"\n',
        '(rewrite (NoSuchOp x) x :ruleset algebra :name "unknown-constructor")\n',
        '(rewrite (UnaryOp (ABS) x) x :ruleset no-such-ruleset :name "unknown-ruleset")\n',
    ],
    ids=["parse-error", "unknown-constructor", "unknown-ruleset"],
)
def test_malformed_rule_file_is_an_error_naming_the_file(tmp_path: Path, text: str) -> None:
    rules = _write(tmp_path, "broken_rules.egg", text)
    with pytest.raises(RuleFileError, match=r"broken_rules\.egg"):
        knopt.optimize(graph_of(_abs_of_abs_graph), rules=[rules])


def test_cli_reports_a_malformed_rule_file_and_fails(tmp_path: Path) -> None:
    model = _abs_of_abs_model(tmp_path / "abs.onnx")
    rules = _write(tmp_path, "broken_rules.egg", "(rewrite (UnaryOp (ABS) x)\n")
    stderr = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
        status = main(["optimize", str(model), "--rules", str(rules)])
    assert status == 2
    assert "broken_rules.egg" in stderr.getvalue()


def test_missing_rule_file_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(RuleFileError, match=r"absent\.egg"):
        knopt.optimize(graph_of(_abs_of_abs_graph), rules=[tmp_path / "absent.egg"])


@pytest.mark.parametrize(
    ("text", "command"),
    [
        ("(run-schedule (run algebra))", "run-schedule"),
        ("(run 3)", "run-schedule"),
        ("(check (= 1 1))", "check"),
        ("(push)", "push"),
        ('(include "other.egg")', "include"),
    ],
    ids=["run-schedule", "run", "check", "push", "include"],
)
def test_rule_file_that_runs_or_checks_something_is_refused(
    tmp_path: Path, text: str, command: str
) -> None:
    rules = _write(tmp_path, "runs.egg", ABS_OF_ABS + text + "\n")
    with pytest.raises(RuleFileError, match=rf"runs\.egg: `{command}` is not allowed"):
        knopt.optimize(graph_of(_abs_of_abs_graph), rules=[rules])


def test_rule_file_with_a_let_is_refused(tmp_path: Path) -> None:
    rules = _write(tmp_path, "lets.egg", "(let one (Splat 1.0 (vec-empty) (F32)))\n")
    with pytest.raises(RuleFileError, match=r"lets\.egg"):
        knopt.optimize(graph_of(_abs_of_abs_graph), rules=[rules])


def test_every_file_a_shipped_rule_file_names_exists() -> None:
    root = Path(knopt.__file__).resolve().parent.parent
    path = re.compile(r"\b(?:rules|knopt|tests|benchmarks)/[\w./-]+\.\w+")
    for rule_file in shipped_rule_files():
        for named in path.findall(rule_file.text):
            assert (root / named).exists(), f"{rule_file.name} names {named}, which is missing"
