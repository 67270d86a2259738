"""cuBLASLt plans: one per shape key, the algorithm chosen by timing and remembered on disk."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from knopt.cpu.program import run_program
from knopt.cuda.planner import build_plan
from knopt.cuda.steps import Gemm
from knopt.ir import GraphBuilder
from knopt.ir.dtype import DType
from knopt.ir.program import Program, program_from_graph
from tests.cuda.programs import compare, random_array

blas = pytest.importorskip("knopt.cuda.blas", reason="needs nvmath-python")


Weights = tuple[np.ndarray, np.ndarray, np.ndarray]


def _weights(rng: np.random.Generator) -> Weights:
    """w (384 x 512), b (512) and w2 (512 x 64) of `y = (x @ w + b) @ w2`."""
    w = (0.1 * rng.standard_normal((384, 512))).astype(np.float32)
    b = rng.standard_normal(512).astype(np.float32)
    w2 = (0.1 * rng.standard_normal((512, 64))).astype(np.float32)
    return w, b, w2


def _mlp(weights: Weights) -> Program:
    w, b, w2 = weights
    g = GraphBuilder("mlp")
    x = g.input("x", (256, 384), DType.F32)
    h = g.add(g.matmul(x, g.constant(w)), g.constant(b))
    g.output(g.matmul(h, g.constant(w2)), "y")
    return program_from_graph(g.build())


def _program(rng: np.random.Generator) -> Program:
    return _mlp(_weights(rng))


def _f32_error_bound(x: np.ndarray, weights: Weights) -> np.ndarray:
    """How far two f32 evaluations of `(x @ w + b) @ w2` may differ, element by element.

    A sum of n f32 terms is off by at most about sqrt(n) * u * (sum of the terms' magnitudes)
    (the probabilistic bound of Higham and Mary, 2019: the n rounding errors, each at most u
    times a partial sum, have independent signs). The first GEMM's errors (384 products and
    the bias) reach y through w2 with independent signs too, so they add in quadrature. The
    GPU and the oracle each err that much: eps = 2u. Here that is about 5e-4 everywhere (5e-6
    of the magnitude of y's terms): looser than `compare`'s atol where y cancels, tighter than
    its rtol 1e-4 on y's large elements. On the CPU, an f32 evaluation summing in the other
    extreme order (one product at a time) stays below 5% of it.
    """
    w, b, w2 = (np.asarray(a, dtype=np.float64) for a in weights)
    x = np.asarray(x, dtype=np.float64)
    eps = float(np.finfo(np.float32).eps)
    h = x @ w + b
    first = np.abs(x) @ np.abs(w) + np.abs(b)  # magnitude of each h's terms
    own = np.sqrt(w2.shape[0]) * (np.abs(h) @ np.abs(w2))
    carried = np.sqrt(w.shape[0] + 1) * np.sqrt(first**2 @ w2**2)
    return eps * (own + carried)


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
    # Half of each alignment the planner found (x, an input bound in place, is only 16-byte
    # aligned), so every entry differs from the step's own.
    a, b, c, d = (max(1, alignment // 2) for alignment in step.alignment)
    halved = (a, b, c, d)
    narrow = dataclasses.replace(step, alignment=halved)
    assert narrow.alignment != step.alignment
    assert blas.gemm_key(narrow, True) != blas.gemm_key(step, True)
    assert f"align{list(halved)}" in blas.gemm_key(narrow, True).text()


@pytest.mark.cuda
def test_the_heuristic_hears_each_alignment_in_cublaslt_order(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    (step, *_) = [s for s in build_plan(_program(rng)).steps if isinstance(s, Gemm)]
    assert step.alignment == (16, 256, 256, 256)  # our a is x, an input bound in place
    told: dict[object, int] = {}
    tell = blas._preference

    def record(preference: int, attribute: object, value: int) -> None:
        told[attribute] = value
        tell(preference, attribute, value)

    monkeypatch.setattr(blas, "_preference", record)
    blas.GemmPlan(blas.Blas().handle, blas.gemm_key(step, True))
    attribute = blas.lt.MatmulPreferenceAttribute
    # D^T = B^T A^T: cuBLASLt's A is our b (256-byte aligned), its B our a (16).
    assert told[attribute.MIN_ALIGNMENT_A_BYTES] == 256
    assert told[attribute.MIN_ALIGNMENT_B_BYTES] == 16


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
    from knopt.cuda import prepare

    monkeypatch.setenv("KNOPT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("KNOPT_TUNE", "0")
    weights = _weights(rng)
    program = _mlp(weights)
    x = random_array(rng, (256, 384), DType.F32)
    executable = prepare(program)
    (actual,) = executable.run({"x": x})
    (expected,) = run_program(program, {"x": x})
    assert actual.shape == expected.shape and actual.dtype == expected.dtype == np.float32
    # Strict f32 on both sides, in different summation orders: they agree to f32's error bound
    # for this chain of two GEMMs (not to `compare`'s fixed atol, which a cancelling element
    # of this output, -0.0264 from terms up to ~10, exceeded by 1.4e-5 on an H200).
    difference = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    np.testing.assert_array_less(difference, _f32_error_bound(x, weights))
    assert all(p.chosen == 0 and p.times == [] for p in _plans(executable))  # type: ignore[attr-defined]
    assert not (tmp_path / "tuning").exists()
