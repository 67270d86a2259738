"""The `knopt` command line: `info` and `run`, called through `knopt.cli.main`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import knopt
from knopt.cli import main
from tests.models import fixtures

MLP = next(f for f in fixtures() if f.file == "mlp_ts14.onnx")
GPT2 = next(f for f in fixtures() if f.file == "gpt2_ts14.onnx")


def _model_with_unsupported_ops(path: Path) -> Path:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("NoSuchOp", ["a"], ["b"], name="first"),
        helper.make_node("NoSuchOp", ["a"], ["c"], name="second"),
        helper.make_node("Frobnicate", ["b", "c"], ["y"], name="custom", domain="com.example"),
    ]
    graph = helper.make_graph(
        nodes,
        "unsupported",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])],
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.example", 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets), path)
    return path


def test_info_describes_inputs_outputs_and_op_counts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(GPT2.path)]) == 0
    out = capsys.readouterr().out
    assert "input_ids: int64 [batch, seq]" in out
    assert "last_hidden_state: float [batch, seq," in out
    assert "ONNX ops (" in out
    assert "IR ops (" in out
    graph = knopt.load(GPT2.path)
    views = graph.op_histogram()["View"]
    assert f"{views:6d}  View" in out


def test_info_lists_every_unsupported_node_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _model_with_unsupported_ops(tmp_path / "bad.onnx")
    assert main(["info", str(path)]) == 1
    out = capsys.readouterr().out
    assert "unsupported ops (3 nodes)" in out
    assert "NoSuchOp: 'first', 'second'" in out
    assert "com.example.Frobnicate: 'custom'" in out
    assert "IR ops" not in out


def test_info_of_a_missing_file_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["info", str(tmp_path / "nope.onnx")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_run_writes_outputs_named_after_the_model_outputs(tmp_path: Path) -> None:
    feeds: dict[str, Any] = MLP.feeds()
    np.savez(tmp_path / "in.npz", **feeds)
    out = tmp_path / "out.npz"
    assert (
        main(["run", str(MLP.path), "--inputs", str(tmp_path / "in.npz"), "--output", str(out)])
        == 0
    )
    expected = knopt.compile(MLP.path).run(None, feeds)
    with np.load(out) as saved:
        assert saved.files == knopt.compile(MLP.path).output_names
        for name, array in zip(saved.files, expected, strict=True):
            np.testing.assert_array_equal(saved[name], array)


def test_run_without_output_prints_a_summary_per_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    feeds: dict[str, Any] = MLP.feeds()
    np.savez(tmp_path / "in.npz", **feeds)
    assert main(["run", str(MLP.path), "--inputs", str(tmp_path / "in.npz")]) == 0
    (result,) = knopt.compile(MLP.path).run(None, feeds)
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"logits: shape {list(result.shape)}, dtype float32")
    assert f"min {float(result.min()):.6g}" in line
    assert f"mean {float(result.astype(np.float64).mean()):.6g}" in line


def test_run_with_dims_fixes_symbolic_sizes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    feeds: dict[str, Any] = GPT2.feeds()
    batch, seq = feeds["input_ids"].shape
    np.savez(tmp_path / "in.npz", **feeds)
    args = [
        "run",
        str(GPT2.path),
        "--inputs",
        str(tmp_path / "in.npz"),
        "--dims",
        f"batch={batch}",
        "--dims",
        f"seq={seq}",
    ]
    assert main(args) == 0
    assert f"shape [{batch}, {seq}," in capsys.readouterr().out


def test_run_names_missing_inputs_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    np.savez(tmp_path / "in.npz", wrong=np.ones(3, np.float32))
    out = tmp_path / "out.npz"
    args = ["run", str(MLP.path), "--inputs", str(tmp_path / "in.npz"), "--output", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "no array for model input(s) ['input']" in err
    assert "['wrong']" in err
    assert not out.exists()


@pytest.mark.parametrize("content", [b"not a zip", None])
def test_run_rejects_unreadable_inputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None
) -> None:
    path = tmp_path / "in.npz"
    if content is not None:
        path.write_bytes(content)
    assert main(["run", str(MLP.path), "--inputs", str(path)]) == 2
    assert str(path) in capsys.readouterr().err


def test_run_takes_size_ranges(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    feeds: dict[str, Any] = GPT2.feeds()
    batch, seq = feeds["input_ids"].shape
    np.savez(tmp_path / "in.npz", **feeds)
    args = ["run", str(GPT2.path), "--inputs", str(tmp_path / "in.npz"), "--dims"]
    assert main([*args, f"seq=1:{seq}:{seq + 4}"]) == 0
    assert f"shape [{batch}, {seq}," in capsys.readouterr().out
    assert main([*args, f"seq=1:{seq - 1}:{seq - 1}"]) == 2
    assert f"size 'seq' is {seq}, outside" in capsys.readouterr().err


@pytest.mark.parametrize("dims", ["batch", "batch=0", "=2", "batch=two"])
def test_run_rejects_malformed_dims(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dims: str
) -> None:
    feeds: dict[str, Any] = MLP.feeds()
    np.savez(tmp_path / "in.npz", **feeds)
    args = ["run", str(MLP.path), "--inputs", str(tmp_path / "in.npz"), "--dims", dims]
    assert main(args) == 2
    assert "NAME=SIZE" in capsys.readouterr().err


def test_info_looks_inside_model_local_functions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = [
        helper.make_node("Relu", ["a"], ["b"], name="inner_relu"),
        helper.make_node("NoSuchOp", ["b"], ["c"], name="inner_strange"),
    ]
    function = helper.make_function(
        "local", "Block", ["a"], ["c"], body, [helper.make_opsetid("", 18)]
    )
    graph = helper.make_graph(
        [helper.make_node("Block", ["x"], ["y"], name="call", domain="local")],
        "functions",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("local", 1)]
    path = tmp_path / "functions.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets, functions=[function]), path)
    assert main(["info", str(path)]) == 1
    out = capsys.readouterr().out
    assert "NoSuchOp: 'inner_strange'" in out
    assert "Block" not in out.split("unsupported ops")[1]
