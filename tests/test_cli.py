"""The `knopt` command line: called through `knopt.cli.main`, and as a process (`python -m knopt`).

As a process, a command ends with status 0 when it did its job, 1 when it could not (a model it
cannot read, inputs that do not fit), and 2 when the command line asks for something that cannot
be (checked before any work); errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import inspect
import io
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import knopt
from knopt.cli import main
from knopt.commands.common import Status
from knopt.commands.run import random_inputs
from knopt.opt.optimize import optimize as run_optimizer
from tests.models import fixtures
from tests.oracle import run_onnxruntime

MLP = next(f for f in fixtures() if f.file == "mlp_ts14.onnx")
GPT2 = next(f for f in fixtures() if f.file == "gpt2_ts14.onnx")
ROOT = Path(__file__).parents[1]


def knopt_process(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run `python -m knopt ARGS` with this checkout's knopt; stdout and stderr captured."""
    return subprocess.run(
        [sys.executable, "-m", "knopt", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
        check=False,
    )


def error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one line a failed command printed on stderr (it printed exactly one)."""
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    return line


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
    assert main(["info", str(tmp_path / "nope.onnx")]) == 1
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
    assert main(args) == 1
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
    assert main(["run", str(MLP.path), "--inputs", str(path)]) == 1
    assert str(path) in capsys.readouterr().err


def test_run_takes_size_ranges(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    feeds: dict[str, Any] = GPT2.feeds()
    batch, seq = feeds["input_ids"].shape
    np.savez(tmp_path / "in.npz", **feeds)
    args = ["run", str(GPT2.path), "--inputs", str(tmp_path / "in.npz"), "--dims"]
    assert main([*args, f"seq=1:{seq}:{seq + 4}"]) == 0
    assert f"shape [{batch}, {seq}," in capsys.readouterr().out
    assert main([*args, f"seq=1:{seq - 1}:{seq - 1}"]) == 1
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


# ---- exit statuses and one-line errors, as a process ---------------------------------------


def _usage_mistakes(tmp: Path) -> list[tuple[list[str | Path], str]]:
    """Command lines that must fail at once with status 2, and what their message names."""
    model = MLP.path
    return [
        (["optimize", model, "--time-limit", "-1"], "--time-limit: -1 must be a number above 0"),
        (["optimize", model, "--time-limit", "0"], "--time-limit: 0 must be a number above 0"),
        (["optimize", model, "--node-limit", "0"], "--node-limit: 0 must be at least 1"),
        (["check-rules", "--instances", "-3"], "--instances: -3 must be at least 1"),
        (["check-rules", "--jobs", "-1"], "--jobs: -1 must be at least 1"),
        (["optimize", model, "-o", tmp / "o.onnx", "--opset", "29"], "opsets 18 to "),
        (["optimize", model, "-o", tmp / "o.onnx", "--opset", "13"], "--opset 13: knopt writes"),
        (["optimize", model, "--opset", "20"], "--opset: only for the saved model; add -o"),
        (["optimize", model, "--dims", "bach=2"], "no size 'bach' (its sizes: batch)"),
        (["info", model, "--dims", "bach=2"], "no size 'bach' (its sizes: batch)"),
        (["run", model, "--inputs", tmp / "in.npz", "--dims", "bach=2"], "no size 'bach'"),
        (["run", model, "--inputs", tmp / "in.npz", "--precision", "fp16"], "computes in f32"),
        (["optimize", model, "--report-json", tmp / "no" / "r.json"], "does not exist"),
        (["optimize", model, "-o", tmp / "no" / "o.onnx"], f"-o {tmp}/no/o.onnx: folder"),
        (["optimize", model, "-o", tmp], "is a folder; give a file name"),
        (["run", model, "--inputs", tmp / "in.npz", "--output", tmp / "no" / "o.npz"], "folder"),
        (["optimse", model], "invalid choice: 'optimse'"),
    ]


def test_usage_mistakes_fail_at_once_with_one_line_and_status_2(tmp_path: Path) -> None:
    feeds: dict[str, Any] = MLP.feeds()
    np.savez(tmp_path / "in.npz", **feeds)
    mistakes = _usage_mistakes(tmp_path)
    # Two at a time: each process spends most of its second importing knopt.
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda mistake: knopt_process(*mistake[0]), mistakes))
    for (args, message), done in zip(mistakes, runs, strict=True):
        assert done.returncode == 2, args
        line = error_line(done)
        assert line.startswith("knopt") and ": error: " in line, line
        assert message in line, line
        assert not (tmp_path / "o.onnx").exists()


def test_a_failed_run_exits_1_with_one_line(tmp_path: Path) -> None:
    done = knopt_process("optimize", tmp_path / "missing.onnx", "-o", tmp_path / "o.onnx")
    assert done.returncode == 1
    assert error_line(done) == f"knopt optimize: error: {tmp_path}/missing.onnx: no such file"


def test_a_bad_report_path_warns_at_once_and_the_model_is_still_saved(tmp_path: Path) -> None:
    output, report = tmp_path / "o.onnx", tmp_path / "no" / "r.json"
    done = knopt_process("optimize", MLP.path, "-o", output, "--report-json", report)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    first, *_, last = done.stderr.splitlines()
    assert first.startswith(f"knopt optimize: warning: --report-json {report}: folder")
    assert last.endswith("does not exist; the report was not written")
    assert onnx.load(output).graph.node


def test_optimize_saves_at_the_opset_asked_for_and_writes_the_json_report(tmp_path: Path) -> None:
    output, report = tmp_path / "o.onnx", tmp_path / "r.json"
    args = ["optimize", str(MLP.path), "-o", str(output), "--opset", "21"]
    assert main([*args, "--report-json", str(report)]) == 0
    assert [(o.domain, o.version) for o in onnx.load(output).opset_import] == [("", 21)]
    assert '"kernels": 9' in report.read_text()


# ---- the basics a new user looks for -------------------------------------------------------


def test_version_and_python_dash_m() -> None:
    done = knopt_process("--version")
    assert done.returncode == 0
    assert done.stdout == f"knopt {knopt.__version__}\n"


def test_a_fresh_process_has_the_report_module_and_short_reprs(tmp_path: Path) -> None:
    script = (
        "import knopt\n"
        "print(knopt.opt.explain.to_html.__name__, knopt.opt.explain.format_report.__name__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
        check=False,
    )
    assert done.stdout == "to_html format_report\n", done.stderr


def test_result_and_session_reprs_are_one_short_line() -> None:
    result = knopt.optimize(knopt.load(MLP.path))
    text = repr(result)
    report = result.report
    assert text.startswith(f"<OptimizeResult {report.nodes_before} -> {report.nodes_after} IR")
    assert f"{report.kernels} kernels" in text and len(text) < 120
    session = knopt.compile(MLP.path)
    assert repr(session) == "<Session cpu f32, not optimized, inputs ['input'], outputs ['logits']>"


def test_optimize_names_its_keywords() -> None:
    parameters = inspect.signature(knopt.optimize).parameters
    assert list(parameters) == [
        "graph",
        "rules",
        "profile",
        "limits",
        "ilp",
        "sizes",
        "progress",
        "strict",
    ]
    engine = inspect.signature(run_optimizer).parameters
    for name in list(parameters)[1:]:
        assert parameters[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert parameters[name].default == engine[name].default


def test_demo_says_where_its_model_is(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--device-profile", "cpu"]) == 0
    out = capsys.readouterr().out
    path = Path(knopt.__file__).parent / "data" / "demo.onnx"
    assert out.startswith(f"demo model: {path} (")
    assert out.splitlines()[-1] == f"next: knopt optimize {path} -o demo.opt.onnx --html demo.html"


# ---- optimize without -o, and run: optimized, timed, on random inputs ------------------------


def test_optimize_without_output_says_nothing_is_saved(tmp_path: Path) -> None:
    done = knopt_process("optimize", MLP.path, cwd=tmp_path)
    assert done.returncode == 0
    first, last = done.stderr.splitlines()
    assert (
        first == "knopt optimize: note: no -o PATH given, so the optimized model will not be saved"
    )
    assert last.startswith("mlp_ts14.onnx: 26 ONNX nodes") and last.endswith(
        "nothing saved (no -o)"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("optimize", [[], ["--optimize"]])
def test_run_on_random_inputs_matches_onnxruntime(tmp_path: Path, optimize: list[str]) -> None:
    out = tmp_path / "out.npz"
    args = ["run", str(GPT2.path), "--seed", "7", "--dims", "batch=2", "--dims", "seq=1:5:16"]
    assert main([*args, "--output", str(out), *optimize]) == 0
    session = knopt.compile(GPT2.path, dims={"batch": 2, "seq": (1, 5, 16)})
    feeds = random_inputs(session, 7)
    assert feeds["input_ids"].shape == (2, 5)
    assert set(np.unique(feeds["input_ids"])) <= {0, 1}
    (expected,) = run_onnxruntime(onnx.load(GPT2.path), feeds)
    with np.load(out) as saved:
        np.testing.assert_allclose(saved["last_hidden_state"], expected, rtol=1e-4, atol=1e-4)


def test_run_optimize_runs_the_optimizer_once_and_repeat_reports_latency(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions: list[knopt.Session] = []
    compile_model = knopt.compile

    def compile_and_keep(*args: Any, **kwargs: Any) -> knopt.Session:
        sessions.append(compile_model(*args, **kwargs))
        return sessions[-1]

    monkeypatch.setattr(knopt, "compile", compile_and_keep)
    assert main(["run", str(MLP.path), "--optimize", "--repeat", "3", "--device", "best"]) == 0
    (session,) = sessions
    assert session.stats.optimizer_runs == 1
    captured = capsys.readouterr()
    summary, timing = captured.out.splitlines()
    assert summary.startswith("logits: shape [1, 8], dtype float32")
    device = session.device
    assert re.fullmatch(
        rf"latency over 3 run\(s\): median [0-9.]+ ms, min [0-9.]+ ms \({device}, f32, "
        r"optimized; first run [0-9.]+ ms\)",
        timing,
    )
    assert f"knopt run: device 'best': running on {device}\n" in captured.err
    assert "knopt run: random inputs (seed 0): input float32 [1, 16]\n" in captured.err


# ---- progress on stderr --------------------------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_status_line_shows_on_a_terminal_after_a_delay_and_is_erased(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(Status, "DELAY", 0.0)
    status = Status("optimize")
    status("algebra: saturating 58 nodes")
    with status:
        for _ in range(500):  # until the thread drew the line once
            if terminal.getvalue():
                break
            time.sleep(0.01)
    text = terminal.getvalue()
    assert text.startswith("\r\x1b[Kknopt optimize: algebra: saturating 58 nodes (")
    assert text.endswith("\r\x1b[K")


@pytest.mark.parametrize("tty", [False, True])
def test_no_status_line_off_a_terminal_or_with_quiet(
    monkeypatch: pytest.MonkeyPatch, tty: bool
) -> None:
    stream = _Terminal() if tty else io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    monkeypatch.setattr(Status, "DELAY", 0.0)
    with Status("optimize", quiet=tty) as status:
        assert not status.enabled
        status("kernels: extracting")
        time.sleep(0.05)
    assert stream.getvalue() == ""


def test_quiet_optimize_prints_nothing_but_what_was_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["optimize", str(MLP.path), "-q"]) == 0
    assert capsys.readouterr() == ("", "")
    assert main(["optimize", str(MLP.path), "-q", "--explain"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("optimized with the cpu cost model in ")
    assert captured.err == ""


def test_optimize_reports_each_phase_to_its_progress_callback() -> None:
    lines: list[str] = []
    knopt.optimize(knopt.load(MLP.path), progress=lines.append)
    assert [line.split(" ", 2)[:2] for line in lines] == [
        ["algebra:", "saturating"],
        ["algebra:", "extracting"],
        ["kernels:", "saturating"],
        ["kernels:", "extracting"],
    ]


# ---- ops knopt lacks, kept as they are -----------------------------------------------------


def _model_with_a_contrib_op(path: Path) -> Path:
    """x -> Relu -> com.microsoft.FastGelu -> Relu -> y, with the contrib op's output declared."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="first"),
        helper.make_node("FastGelu", ["a"], ["g"], name="gelu", domain="com.microsoft"),
        helper.make_node("Relu", ["g"], ["y"], name="last"),
    ]
    graph = helper.make_graph(
        nodes,
        "contrib",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        value_info=[helper.make_tensor_value_info("g", TensorProto.FLOAT, [2, 3])],
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets), path)
    return path


def test_info_and_optimize_keep_an_op_knopt_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _model_with_a_contrib_op(tmp_path / "contrib.onnx")
    assert main(["info", str(model)]) == 0
    out = capsys.readouterr().out
    assert "ops knopt lacks, kept as they are" in out
    assert "com.microsoft.FastGelu: 'gelu'" in out
    assert "Opaque[com.microsoft.FastGelu]" in out  # among the IR ops
    assert main(["optimize", str(model), "-o", str(tmp_path / "o.onnx"), "--explain"]) == 0
    assert "opaque[Opaque[com.microsoft.FastGelu]]" in capsys.readouterr().out
    feeds = {"x": np.random.default_rng(3).uniform(-2, 2, (2, 3)).astype(np.float32)}
    saved = onnx.load(tmp_path / "o.onnx")
    assert [n.op_type for n in saved.graph.node] == ["Relu", "FastGelu", "Relu"]
    np.testing.assert_allclose(
        run_onnxruntime(saved, feeds)[0], run_onnxruntime(onnx.load(model), feeds)[0], rtol=1e-6
    )


def test_strict_optimize_and_running_an_op_knopt_cannot_run_exit_1_with_one_line(
    tmp_path: Path,
) -> None:
    model = _model_with_a_contrib_op(tmp_path / "contrib.onnx")
    commands = [
        ["optimize", model, "-o", tmp_path / "o.onnx", "--strict"],
        ["run", model],
    ]
    with ThreadPoolExecutor(2) as pool:
        strict, run = pool.map(lambda args: knopt_process(*args), commands)
    assert strict.returncode == 1
    assert "op com.microsoft.FastGelu is not supported" in error_line(strict)
    assert not (tmp_path / "o.onnx").exists()
    assert run.returncode == 1
    line = error_line(run)
    assert "node 'gelu' (com.microsoft.FastGelu)" in line and "--target onnx" in line
