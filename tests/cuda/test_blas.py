"""cuBLASLt plans: one per shape key, the algorithm chosen by timing and remembered on disk."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from knopt.cuda.planner import build_plan
from knopt.cuda.steps import Gemm
from knopt.ir import GraphBuilder
from knopt.ir.dtype import DType
from knopt.ir.program import Program, program_from_graph
from tests.cuda.programs import compare, random_array

blas = pytest.importorskip("knopt.cuda.blas", reason="needs nvmath-python")


def _program(rng: np.random.Generator) -> Program:
    g = GraphBuilder("mlp")
    x = g.input("x", (256, 384), DType.F32)
    w = g.constant((0.1 * rng.standard_normal((384, 512))).astype(np.float32))
    b = g.constant(rng.standard_normal(512).astype(np.float32))
    h = g.add(g.matmul(x, w), b)
    g.output(
        g.matmul(h, g.constant((0.1 * rng.standard_normal((512, 64))).astype(np.float32))), "y"
    )
    return program_from_graph(g.build())


def test_keys_leave_out_tensors_and_alpha(rng: np.random.Generator) -> None:
    (step, *_) = [s for s in build_plan(_program(rng)).steps if isinstance(s, Gemm)]
    other = dataclasses.replace(
        step,
        a=dataclasses.replace(step.a, tensor=99),
        d=dataclasses.replace(step.d, tensor=98),
        alpha=0.5,
    )
    assert blas.gemm_key(step, True) == blas.gemm_key(other, True)
    assert blas.gemm_key(step, True).text() == blas.gemm_key(other, True).text()
    narrow = dataclasses.replace(step, alignment=(16, 256, 256, 256))
    assert blas.gemm_key(narrow, True) != blas.gemm_key(step, True)
    assert "align[16, 256, 256, 256]" in blas.gemm_key(narrow, True).text()


def _plans(executable: object) -> list[object]:
    return list(executable.blas._plans.values())  # type: ignore[attr-defined]


@pytest.mark.cuda
def test_the_fastest_candidate_is_chosen_and_remembered(
    rng: np.random.Generator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from knopt.cuda import prepare

    monkeypatch.setenv("KNOPT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("KNOPT_TUNE", raising=False)
    program = _program(rng)
    first = _plans(prepare(program, "fp16"))
    timed = [p for p in first if len(p.candidates) > 1]  # type: ignore[attr-defined]
    assert timed, "cuBLASLt offered one algorithm for every GEMM: nothing was timed"
    for plan in timed:
        times = plan.times  # type: ignore[attr-defined]
        assert len(times) == len(plan.candidates)  # type: ignore[attr-defined]
        assert times[plan.chosen] == min(times)  # type: ignore[attr-defined]
    (path,) = (tmp_path / "tuning").glob("cublaslt-*.json")
    assert len(json.loads(path.read_text())["entries"]) == len(timed)
    # A new process reads the choices instead of timing again.
    again = {p.key: p for p in _plans(prepare(program, "fp16"))}  # type: ignore[attr-defined]
    for plan in timed:
        stored = again[plan.key]  # type: ignore[attr-defined]
        assert stored.chosen == plan.chosen and stored.times == []  # type: ignore[attr-defined]
    compare(program, {"x": random_array(rng, (256, 384), DType.F32)}, precision="fp16")


@pytest.mark.cuda
def test_without_tuning_the_heuristic_first_pick_runs(
    rng: np.random.Generator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KNOPT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("KNOPT_TUNE", "0")
    program = _program(rng)
    compare(program, {"x": random_array(rng, (256, 384), DType.F32)})
    from knopt.cuda import prepare

    assert all(p.chosen == 0 and p.times == [] for p in _plans(prepare(program)))  # type: ignore[attr-defined]
    assert not (tmp_path / "tuning").exists()
