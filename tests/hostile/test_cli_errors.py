"""The command line ends a failed, interrupted or cut-off command without a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

import knopt.commands.info
from knopt.cli import main
from knopt.errors import InvalidModelError
from tests.hostile.builders import LOCAL, external, function, info, model
from tests.models import fixtures

MLP = next(f for f in fixtures() if f.file == "mlp_ts14.onnx")
ROOT = Path(__file__).parents[2]


def test_a_knopt_error_fails_with_one_line_and_status_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "secret.bin").write_bytes(b"top secret bytes")
    folder = tmp_path / "models"
    folder.mkdir()
    value = external("v", "../secret.bin", [16], helper.TensorProto.UINT8)
    leak = function("Leak", [], ["y"], [helper.make_node("Constant", [], ["y"], value=value)])
    call = helper.make_node("Leak", [], ["y"], domain=LOCAL, name="call")
    path = folder / "model.onnx"
    path.write_bytes(model([call], [], [info("y", [16])], functions=[leak]).SerializeToString())
    np.savez(tmp_path / "in.npz", unused=np.ones(1))
    assert main(["run", str(path), "--inputs", str(tmp_path / "in.npz")]) == 1
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1
    assert "outside the model's folder" in captured.err
    assert "secret" not in captured.out


def test_writing_outputs_over_the_memory_limit_fails_before_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = [helper.make_node("Neg", ["x"], ["a"]), helper.make_node("Relu", ["x"], ["b"])]
    path = tmp_path / "two.onnx"
    outputs = [info("a", [150]), info("b", [150])]
    path.write_bytes(model(nodes, [info("x", [150])], outputs).SerializeToString())
    np.savez(tmp_path / "in.npz", x=np.linspace(-1, 1, 150, dtype=np.float32))
    out = tmp_path / "out.npz"
    monkeypatch.setenv("KNOPT_MEMORY_LIMIT", "1000")  # bytes: each output has 600, both 1200
    args = ["run", str(path), "--inputs", str(tmp_path / "in.npz"), "--output", str(out)]
    assert main(args) == 1
    assert "the outputs: needs 1.2 KiB" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    ("raised", "status", "message"),
    [
        (KeyboardInterrupt(), 130, "knopt info: interrupted\n"),
        (BrokenPipeError(), 141, ""),
        (InvalidModelError("m.onnx: broken"), 1, "knopt info: error: m.onnx: broken\n"),
    ],
)
def test_interruptions_end_with_their_status_and_no_traceback(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    raised: BaseException,
    status: int,
    message: str,
) -> None:
    def fail(args: object) -> int:
        raise raised

    monkeypatch.setattr(knopt.commands.info, "run", fail)
    assert main(["info", str(MLP.path)]) == status
    assert capsys.readouterr().err == message


def test_output_into_a_closed_pipe_ends_quietly() -> None:
    reader, writer = os.pipe()
    os.close(reader)  # like `| head` having exited already: every write fails
    try:
        done = subprocess.run(
            [sys.executable, "-m", "knopt.cli", "info", str(MLP.path)],
            stdout=writer,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            timeout=120,
            check=False,
        )
    finally:
        os.close(writer)
    assert done.stderr == b""
    assert done.returncode == 141
