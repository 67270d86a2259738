"""Fused kernels: extraction groups ops into kernels by cost, and Programs compute the graph."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import knopt
from knopt.cpu import run_graph
from knopt.cpu.program import run_program
from knopt.ir import DType, GraphBuilder, Unary
from knopt.ir.program import format_expr, format_program
from knopt.opt import OptimizeResult
from knopt.opt.cost import H200, DeviceProfile
from tests.models import Fixture, fixtures


def _chain(rng: np.random.Generator) -> knopt.Graph:
    """x -> matmul -> + bias -> tanh -> * 2 -> + x2: one GEMM and one elementwise region."""
    b = GraphBuilder("chain")
    x = b.input("x", (8, 16), DType.F32)
    y = b.input("y", (8, 32), DType.F32)
    w = b.constant(rng.standard_normal((16, 32)).astype(np.float32))
    bias = b.constant(rng.standard_normal((32,)).astype(np.float32))
    h = b.add(b.matmul(x, w), bias)
    h = b.mul(b.unary(Unary.TANH, h), b.constant(np.float32(2.0)))
    b.output(b.add(h, y), "out")
    return b.build()


def test_elementwise_chain_becomes_one_kernel_on_a_gpu_profile(rng: np.random.Generator) -> None:
    graph = _chain(rng)
    result = knopt.optimize(graph, profile="h200")
    kinds = sorted(k.kind.lower() for k in result.program.launches())
    assert kinds == ["elementwise", "matmul"], format_program(result.program)
    feeds = {
        "x": rng.standard_normal((8, 16)).astype(np.float32),
        "y": rng.standard_normal((8, 32)).astype(np.float32),
    }
    np.testing.assert_allclose(
        run_program(result.program, feeds)[0], run_graph(graph, feeds)[0], rtol=1e-5, atol=1e-6
    )


def _shared(rng: np.random.Generator, heavy: bool) -> knopt.Graph:
    """A shared intermediate s = f(x) read by two consumers, cheap (one add) or heavy."""
    b = GraphBuilder("shared")
    x = b.input("x", (64, 64), DType.F32)
    s = b.add(x, b.constant(np.float32(1.0)))
    if heavy:
        for _ in range(3):
            s = b.unary(Unary.TANH, b.unary(Unary.EXP, s))
    c1 = b.unary(Unary.SIGMOID, s)
    c2 = b.mul(s, b.unary(Unary.TANH, x))
    b.output(c1, "a")
    b.output(c2, "b")
    return b.build()


def _materialized(result: OptimizeResult) -> int:
    return len(result.program.launches())


def test_cheap_shared_intermediate_is_recomputed_in_each_reader(
    rng: np.random.Generator,
) -> None:
    # With launches dear and arithmetic nearly free, recomputing x + 1 in both readers beats
    # writing it out and reading it back: two kernels instead of three.
    profile = DeviceProfile("test", bandwidth=1e9, peak=H200.peak, launch=1e-5)
    result = knopt.optimize(_shared(rng, heavy=False), profile=profile)
    assert _materialized(result) == 2, format_program(result.program)


def test_expensive_shared_intermediate_is_materialized_once(rng: np.random.Generator) -> None:
    # Six transcendental ops per element, with a slow ALU and fast memory: computing
    # them once and reading the result twice is cheaper than computing them twice.
    profile = DeviceProfile(
        "test",
        bandwidth=1e13,
        peak={"f32": 1e9, "f16": 1e9, "f64": 1e9, "int": 1e9},
        launch=1e-7,
    )
    result = knopt.optimize(_shared(rng, heavy=True), profile=profile)
    assert _materialized(result) == 3, format_program(result.program)
    x = rng.standard_normal((64, 64)).astype(np.float32) * 0.1
    expected = run_graph(_shared(rng, heavy=True), {"x": x})
    for mine, theirs in zip(run_program(result.program, {"x": x}), expected, strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)


def test_layer_norm_affine_tail_is_the_kernel_epilogue(rng: np.random.Generator) -> None:
    b = GraphBuilder("ln")
    x = b.input("x", (4, 32), DType.F32)
    g = b.constant(rng.standard_normal(32).astype(np.float32))
    beta = b.constant(rng.standard_normal(32).astype(np.float32))
    b.output(b.add(b.mul(b.layer_norm(x, axis=1, eps=1e-5), g), beta), "y")
    result = knopt.optimize(b.build(), profile="h200")
    (kernel,) = result.program.launches()
    assert kernel.kind == "layer_norm" and kernel.epilogue is not None


def _gemm(rng: np.random.Generator, tail: Unary | None) -> knopt.Graph:
    b = GraphBuilder("gemm")
    x = b.input("x", (8, 16), DType.F32)
    w = b.constant(rng.standard_normal((16, 32)).astype(np.float32))
    bias = b.constant(rng.standard_normal(32).astype(np.float32))
    h = b.clamp(b.add(b.matmul(x, w), bias), lo=0.0)  # relu(x @ w + bias): one cuBLASLt call
    b.output(h if tail is None else b.unary(tail, h), "y")
    return b.build()


def test_bias_and_relu_become_the_gemm_epilogue(rng: np.random.Generator) -> None:
    result = knopt.optimize(_gemm(rng, None), profile="h200")
    (kernel,) = result.program.launches()
    assert kernel.kind == "matmul" and kernel.epilogue is not None


def test_gemm_epilogue_holds_only_what_cublaslt_fuses(rng: np.random.Generator) -> None:
    result = knopt.optimize(_gemm(rng, Unary.EXP), profile="h200")  # exp: no such epilogue
    launches = result.program.launches()
    assert len(launches) == 2, format_program(result.program)
    epilogues = [k.epilogue for k in launches if k.kind == "matmul" and k.epilogue is not None]
    assert all("EXP" not in format_expr(e) for e in epilogues)


@pytest.mark.parametrize("fixture", fixtures(), ids=lambda f: f.file)
def test_program_matches_graph_and_has_fewer_kernels_than_onnxruntime_nodes(
    fixture: Fixture, tmp_path: object
) -> None:
    graph = knopt.load(fixture.path)
    result = knopt.optimize(graph, profile="h200", ilp=False)
    feeds = fixture.feeds()
    expected = knopt.compile(graph).run(None, feeds)
    bound = knopt.load(fixture.path, dims=_dims(feeds, graph))
    program = knopt.optimize(bound, profile="h200", ilp=False).program
    for mine, theirs in zip(run_program(program, feeds), expected, strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(tmp_path / "ort.onnx")  # type: ignore[operator]
    options.log_severity_level = 3
    ort.InferenceSession(str(fixture.path), options, providers=["CPUExecutionProvider"])
    ort_nodes = len(onnx.load(options.optimized_model_filepath).graph.node)
    assert result.report.kernels < ort_nodes
    assert result.report.to_json()["kernels"] == result.report.kernels


def _dims(feeds: dict[str, np.ndarray], graph: knopt.Graph) -> dict[str, int]:
    from knopt.ir.bind import infer_sizes

    return infer_sizes(graph, {name: array.shape for name, array in feeds.items()})


@pytest.mark.parametrize("fixture", fixtures()[::3], ids=lambda f: f.file)
def test_kernel_onnx_runs_on_onnxruntime_and_reloads_in_knopt(
    fixture: Fixture, tmp_path: object
) -> None:
    result = knopt.optimize(knopt.load(fixture.path), profile="h200", ilp=False)
    path = tmp_path / "kernels.onnx"  # type: ignore[operator]
    model = knopt.save(result, path, kernels=True)
    assert model.functions and all(f.domain == "knopt" for f in model.functions)
    feeds = fixture.feeds()
    original = ort.InferenceSession(str(fixture.path), providers=["CPUExecutionProvider"])
    saved = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    expected = original.run(None, feeds)
    for mine, theirs in zip(saved.run(None, feeds), expected, strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)
    for mine, theirs in zip(knopt.compile(path).run(None, feeds), expected, strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)
