"""`knopt optimize -o`: the written file's target, the kernel-grouping option, the node counts."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import onnx
import pytest

from knopt.cli import main
from tests.models import fixtures
from tests.oracle import assert_same, run_onnxruntime

MLP = next(f for f in fixtures() if f.file == "mlp_ts14.onnx")


def _optimize(*argv: str) -> tuple[int, str]:
    stderr = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
        status = main(["optimize", str(MLP.path), *argv])
    return status, stderr.getvalue()


@pytest.mark.parametrize("target", ["onnx", "onnxruntime"])
def test_output_is_plain_onnx_that_runs_like_the_original(tmp_path: Path, target: str) -> None:
    out = tmp_path / "out.onnx"
    status, summary = _optimize("-o", str(out), "--target", target)
    assert status == 0
    model = onnx.load(out)
    assert not model.functions
    assert {o.domain for o in model.opset_import} <= {"", "com.microsoft"}
    written = len(model.graph.node)
    assert f"{len(onnx.load(MLP.path).graph.node)} -> {written} ONNX nodes" in summary
    feeds = MLP.feeds(seed=2)
    assert_same(run_onnxruntime(model, feeds), run_onnxruntime(onnx.load(MLP.path), feeds))


def test_kernels_option_writes_the_kernel_grouping(tmp_path: Path) -> None:
    out = tmp_path / "out.onnx"
    assert _optimize("-o", str(out), "--kernels")[0] == 0
    model = onnx.load(out)
    assert model.functions
    assert all(f.domain == "knopt" for f in model.functions)
    feeds = MLP.feeds(seed=2)
    assert_same(run_onnxruntime(model, feeds), run_onnxruntime(onnx.load(MLP.path), feeds))


def test_report_counts_onnx_nodes_in_and_out(tmp_path: Path) -> None:
    out, report = tmp_path / "out.onnx", tmp_path / "report.json"
    assert _optimize("-o", str(out), "--report-json", str(report))[0] == 0
    data = json.loads(report.read_text())
    assert data["onnx_nodes_before"] == len(onnx.load(MLP.path).graph.node)
    assert data["onnx_nodes_after"] == len(onnx.load(out).graph.node)


def test_without_an_output_the_summary_counts_the_input_nodes_only() -> None:
    status, summary = _optimize()
    assert status == 0
    assert f"{len(onnx.load(MLP.path).graph.node)} ONNX nodes (" in summary
