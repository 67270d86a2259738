"""cuDNN plans: one per convolution key, the engine chosen by timing and remembered on disk."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from knopt.ir import GraphBuilder
from knopt.ir.dtype import DType
from knopt.ir.op import Unary
from knopt.ir.program import Program, program_from_graph
from tests.cuda.programs import compare, random_array

dnn = pytest.importorskip("knopt.cuda.dnn", reason="needs the cuDNN frontend")


def test_dense_strides_in_either_order() -> None:
    assert dnn.dense_strides([2, 3, 4, 5]) == [60, 20, 5, 1]
    assert dnn.dense_strides([2, 3, 4, 5], channels_last=True) == [60, 1, 15, 3]
    assert dnn.dense_strides([1, 8, 1, 1], channels_last=True) == [8, 1, 8, 8]


def _program(rng: np.random.Generator) -> Program:
    g = GraphBuilder("conv")
    x = g.input("x", (4, 32, 14, 14), DType.F32)
    w = g.constant((0.1 * rng.standard_normal((32, 32, 3, 3))).astype(np.float32))
    y = g.conv(x, w, strides=(1, 1), pads=((1, 1), (1, 1)), dilations=(1, 1))
    g.output(g.unary(Unary.RELU, y), "y")
    return program_from_graph(g.build())


@pytest.mark.cuda
@pytest.mark.parametrize("precision", ["fp16", "f32"])
def test_the_fastest_plan_is_chosen_and_remembered(
    rng: np.random.Generator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, precision: str
) -> None:
    from knopt.cuda import prepare

    monkeypatch.setenv("KNOPT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("KNOPT_TUNE", raising=False)
    program = _program(rng)
    (plan,) = prepare(program, precision).dnn._plans.values()  # type: ignore[union-attr]
    assert plan is not None and plan.name
    (path,) = (tmp_path / "tuning").glob("cudnn-*.json")
    (entry,) = json.loads(path.read_text())["entries"].values()
    assert entry["name"] == plan.name
    (again,) = prepare(program, precision).dnn._plans.values()  # type: ignore[union-attr]
    assert again is not None and again.name == plan.name and again.times == {}
    # Strict f32 stays strict whichever engine won: the f32 comparison is to 1e-4.
    compare(program, {"x": random_array(rng, (4, 32, 14, 14), DType.F32)}, precision=precision)
