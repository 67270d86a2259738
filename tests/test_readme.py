"""The README's examples stay true: its rule file is sound and takes part in `knopt optimize`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from knopt.cli import main
from tests.oracle import assert_same, run_onnxruntime

README = Path(__file__).parents[1] / "README.md"


def _readme_rule_file(folder: Path) -> Path:
    (text,) = re.findall(r"```lisp\n(.*?)```", README.read_text(), re.DOTALL)
    path = folder / "abs.egg"
    path.write_text(text)
    return path


def _neg_abs_exp_model(path: Path) -> Path:
    nodes = [
        helper.make_node("Neg", ["x"], ["a"], name="neg"),
        helper.make_node("Abs", ["a"], ["b"], name="abs"),
        helper.make_node("Exp", ["b"], ["y"], name="exp"),
    ]
    graph = helper.make_graph(
        nodes,
        "neg_abs_exp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return path


def test_readme_rule_file_is_sound(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-rules", str(_readme_rule_file(tmp_path)), "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"sound\s+abs-of-neg", out)
    assert re.search(r"sound\s+abs-of-abs", out)


def test_readme_rule_file_fires_in_optimize(
    tmp_path: Path, rng: np.random.Generator, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _neg_abs_exp_model(tmp_path / "m.onnx")
    out, report = tmp_path / "out.onnx", tmp_path / "report.json"
    rules = _readme_rule_file(tmp_path)
    argv = ["optimize", str(model), "-o", str(out), "--rules", str(rules), "--explain"]
    assert main([*argv, "--report-json", str(report)]) == 0
    assert "abs.egg" in capsys.readouterr().out
    assert json.loads(report.read_text())["rules_fired"]["abs-of-neg"] >= 1
    feeds = {"x": rng.uniform(-2, 2, (3, 4)).astype(np.float32)}
    assert_same(run_onnxruntime(onnx.load(out), feeds), run_onnxruntime(onnx.load(model), feeds))
