"""rules/merge.egg: GEMMs and convolutions sharing an input become one over concatenated weights."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest

import knopt
from knopt.cpu import run_graph
from knopt.cpu.program import run_program
from knopt.ir import Graph, GraphBuilder, Unary, Value, bind_symbols
from knopt.ir.shape import sym
from knopt.opt import OptimizeResult
from tests.models import fixtures
from tests.oracle import assert_same, run_onnxruntime
from tests.rules.helpers import F32, graph_of, random_feeds
from tests.rules.test_quantize import Model

D = 16  # the shared input's last size
_RNG = np.random.default_rng(31)


def _weight(g: GraphBuilder, *shape: int) -> Value:
    return g.constant((_RNG.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32))


def _projections(
    g: GraphBuilder, widths: Sequence[int], *, bias: bool = True, rows: int = 10, depth: int = D
) -> list[Value]:
    """x @ w_i (+ b_i) for each width, on a flat [rows, depth] input as exporters view one."""
    x = g.input("x", (rows, depth), F32)
    outs = []
    for n in widths:
        y = g.matmul(x, _weight(g, depth, n))
        outs.append(g.add(y, _weight(g, n)) if bias else y)
    return outs


def _optimize(graph: Graph, profile: str = "h200") -> OptimizeResult:
    """Optimize, then check the graph and its program against the original on the CPU."""
    result = knopt.optimize(graph, profile=profile, ilp=False)
    feeds = random_feeds(graph, np.random.default_rng(5))
    expected = run_graph(graph, feeds)
    assert_same(run_graph(result.graph, feeds), expected)
    assert_same(run_program(result.program, feeds), expected)
    return result


def _kinds(result: OptimizeResult) -> list[str]:
    return sorted(k.kind.lower() for k in result.program.launches())


def _fired(result: OptimizeResult, rule: str) -> int:
    return result.report.rules_fired.get(rule, 0)


# ---- matmuls ---------------------------------------------------------------------------------


@pytest.mark.parametrize("profile", ["h200", "h200-graph", "cpu"])
def test_projections_with_biases_become_one_gemm(profile: str) -> None:
    # Q, K and V of grouped-query attention: one wide and two narrow projections.
    result = _optimize(graph_of(lambda g: _projections(g, (16, 8, 8))), profile)
    assert _fired(result, "merge-matmuls") == 2  # a chain of three siblings: two steps
    assert _fired(result, "merged-constants") == 2
    assert _kinds(result) == ["matmul"], _kinds(result)  # the biases are its epilogue
    assert result.graph.op_histogram().get("Slice") == 3


@pytest.mark.parametrize("profile", ["h200", "h200-graph"])
def test_bert_base_projections_at_batch_1_become_one_gemm(profile: str) -> None:
    # 128 tokens, hidden 768: three GEMMs cost 3 * (launch + 3.0 us of f32 arithmetic) on an
    # H200, one over the concatenated weights launch + 8.9 us.
    graph = graph_of(lambda g: _projections(g, (768,) * 3, rows=128, depth=768))
    result = knopt.optimize(graph, profile=profile, ilp=False)
    assert _kinds(result) == ["matmul"]


def test_projections_without_biases_become_one_gemm() -> None:
    result = _optimize(graph_of(lambda g: _projections(g, (8, 8), bias=False)))
    assert _kinds(result) == ["matmul"]
    assert _fired(result, "merged-constants") == 0


def test_weights_broadcast_over_a_symbolic_batch_merge() -> None:
    def build(g: GraphBuilder) -> list[Value]:
        batch = sym("batch")
        x = g.input("x", (batch, 5, D), F32)
        outs = []
        for n in (8, 12):
            w = g.broadcast(g.view(_weight(g, D, n), (1, D, n)), (batch, D, n))
            outs.append(g.add(_weight(g, n), g.matmul(x, w)))  # the bias first, as ts14 writes
        return outs

    graph = graph_of(build)
    result = knopt.optimize(graph, profile="h200", ilp=False)
    assert _fired(result, "merge-broadcast-matmuls") == 1
    assert _fired(result, "merge-binaries-with-constants-first") == 1  # the biases
    assert _kinds(result) == ["matmul"]
    before, after = bind_symbols(graph, {"batch": 3}), bind_symbols(result.graph, {"batch": 3})
    feeds = random_feeds(before, np.random.default_rng(6))
    assert_same(run_graph(after, feeds), run_graph(before, feeds))


def test_gate_and_up_projections_merge_and_their_product_is_one_kernel() -> None:
    def build(g: GraphBuilder) -> Value:
        gate, up = _projections(g, (12, 12), bias=False)
        return g.mul(g.unary(Unary.SILU, gate), up)

    result = _optimize(graph_of(build))
    assert _kinds(result) == ["elementwise", "matmul"]


def test_a_shared_activation_merges_into_the_gemm_epilogue() -> None:
    def build(g: GraphBuilder) -> list[Value]:
        return [g.unary(Unary.GELU_TANH, y) for y in _projections(g, (8, 12))]

    result = _optimize(graph_of(build))
    assert _fired(result, "merge-activations") == 1
    assert _kinds(result) == ["matmul"]


def test_merging_that_loses_an_epilogue_is_left_to_the_cost_model() -> None:
    # Merged, the GELU of one part runs as a kernel of its own: two launches either way, and
    # more memory traffic, so extraction keeps the two GEMMs, each with its epilogue.
    def build(g: GraphBuilder) -> list[Value]:
        y, z = _projections(g, (8, 12))
        return [g.unary(Unary.GELU_TANH, y), z]

    result = _optimize(graph_of(build))
    assert _fired(result, "merged-constants") == 1
    assert _kinds(result) == ["matmul", "matmul"]
    assert "Slice" not in result.graph.op_histogram()


def test_a_part_read_by_an_activation_is_read_from_the_merged_gemm() -> None:
    # K's bias joins the merged GEMM's epilogue and its Tanh reads K's slice: two kernels, not
    # K's own GEMM again with the bias in the Tanh kernel.
    def build(g: GraphBuilder) -> list[Value]:
        q, k, v = _projections(g, (16, 8, 8))
        return [q, g.unary(Unary.TANH, k), v]

    result = _optimize(graph_of(build))
    assert _kinds(result) == ["matmul", "tanh"], _kinds(result)


def test_chains_grow_linearly_with_the_number_of_siblings() -> None:
    # Merging any two would make a merged op per subset (247 for 8 siblings); the chain makes 7.
    result = _optimize(graph_of(lambda g: _projections(g, (4,) * 8, bias=False)))
    assert _fired(result, "merge-matmuls") == 7
    assert _kinds(result) == ["matmul"]


# ---- where the guards stop it ------------------------------------------------------------------


def test_a_weight_that_is_an_input_does_not_merge() -> None:
    def build(g: GraphBuilder) -> list[Value]:
        x = g.input("x", (10, D), F32)
        return [g.matmul(x, g.input("w", (D, 8), F32)), g.matmul(x, _weight(g, D, 8))]

    result = _optimize(graph_of(build))
    assert _fired(result, "merge-matmuls") == 0
    assert _kinds(result) == ["matmul", "matmul"]


def test_matmuls_of_different_inputs_do_not_merge() -> None:
    def build(g: GraphBuilder) -> list[Value]:
        a, b = g.input("a", (10, D), F32), g.input("b", (10, D), F32)
        return [g.matmul(a, _weight(g, D, 8)), g.matmul(b, _weight(g, D, 8))]

    result = _optimize(graph_of(build))
    assert _fired(result, "merge-matmuls") == 0


def test_biases_that_vary_along_the_rows_do_not_merge() -> None:
    def build(g: GraphBuilder) -> list[Value]:
        x = g.input("x", (10, D), F32)
        return [g.add(g.matmul(x, _weight(g, D, 8)), _weight(g, 10, 1)) for _ in range(2)]

    result = _optimize(graph_of(build))
    assert _fired(result, "merge-matmuls") == 1
    assert _fired(result, "merged-constants") == 0


# ---- convolutions ------------------------------------------------------------------------------


def _convs(g: GraphBuilder, channels: Sequence[int], strides: Sequence[int]) -> list[Value]:
    """Parallel convolutions of one input, each with a bias and a ReLU (inception branches)."""
    x = g.input("x", (2, 4, 6, 6), F32)
    outs = []
    for c, s in zip(channels, strides, strict=True):
        y = g.conv(
            x, _weight(g, c, 4, 1, 1), strides=(s, s), pads=((0, 0), (0, 0)), dilations=(1, 1)
        )
        y = g.add(y, g.view(_weight(g, c), (1, c, 1, 1)))
        outs.append(g.clamp(y, lo=0.0))
    return outs


def test_parallel_convolutions_become_one_with_bias_and_relu() -> None:
    result = _optimize(graph_of(lambda g: _convs(g, (4, 8, 2), (1, 1, 1))))
    assert _fired(result, "merge-convs") == 2
    assert _fired(result, "merge-clamps") == 2
    assert _kinds(result) == ["conv"]


def test_convolutions_with_different_strides_do_not_merge() -> None:
    result = _optimize(graph_of(lambda g: _convs(g, (4, 8), (1, 2))))
    assert _fired(result, "merge-convs") == 0
    assert _kinds(result) == ["conv", "conv"]


# ---- models ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kernels", [False, True], ids=["graph", "kernel-functions"])
def test_merged_programs_save_as_onnx_that_onnxruntime_runs(kernels: bool, tmp_path: Path) -> None:
    graph = graph_of(lambda g: _projections(g, (16, 8, 8)))
    result = _optimize(graph)
    knopt.save(result if kernels else result.graph, tmp_path / "merged.onnx")
    feeds = random_feeds(graph, np.random.default_rng(7))
    saved = onnx.load(tmp_path / "merged.onnx")
    assert_same(run_onnxruntime(saved, feeds), run_graph(graph, feeds))


@pytest.mark.parametrize("file", ["bert_dynamo18.onnx", "llama_ts14.onnx"])
def test_attention_projections_of_fixtures_are_one_gemm_per_layer(file: str) -> None:
    fixture = next(f for f in fixtures() if f.file == file)
    graph = knopt.load(fixture.path)
    result = knopt.optimize(graph, profile="h200", ilp=False)
    main_ops = [k.op.name for k in result.program.launches() if k.op is not None]
    attention, matmuls = main_ops.count("Attention"), main_ops.count("MatMul")
    # Per layer: Q, K and V as one GEMM, the output projection and the two of the MLP (the
    # gate and up projections of LLaMA's are one already; phase 1 merges them).
    per_layer = 4
    assert attention > 0 and matmuls == per_layer * attention, matmuls
    feeds = fixture.feeds()
    sizes = {
        name: size
        for spec in fixture.inputs
        for axis, name in spec.get("dynamic_axes", {}).items()
        for size in [spec["shape"][int(axis)]]
    }
    before, after = bind_symbols(graph, sizes), bind_symbols(result.graph, sizes)
    assert_same(run_graph(after, feeds), run_graph(before, feeds))


# ---- integer products --------------------------------------------------------------------------


def _quantized_projections(zeros: Sequence[int], weight_zeros: Sequence[int] = (0, 0, 0)) -> bytes:
    """Q, K and V projections of one 8-bit input, as quantize_static writes them.

    Per-channel int8 weights; each output quantized and dequantized with a scale and zero point
    of its own. Scales are powers of two and sums short, so the float model is exact too.
    """
    m = Model()
    x = m.qdq(m.input("x", ["batch", 5, D]), 0.25, -3, np.int8)
    outs = []
    for i, (zero, weight_zero) in enumerate(zip(zeros, weight_zeros, strict=True)):
        codes = _RNG.integers(-127, 128, (D, 8)).astype(np.int8)
        scales = np.exp2(-_RNG.integers(5, 8, 8)).astype(np.float32)
        w = m.dq(codes, scales, np.full(8, weight_zero, np.int8), axis=1)
        outs.append(m.qdq(m.node("MatMul", [x, w]), 2.0 ** -(i + 1), zero, np.int8))
    return m.build_outputs(outs)


def _integer_merge(model: bytes) -> OptimizeResult:
    graph = knopt.load(model)
    result = knopt.optimize(graph, profile="h200", ilp=False)
    before, after = bind_symbols(graph, {"batch": 2}), bind_symbols(result.graph, {"batch": 2})
    x = (np.random.default_rng(8).integers(-40, 40, (2, 5, D)) / 8).astype(np.float32)
    for ours, theirs in zip(run_graph(after, {"x": x}), run_graph(before, {"x": x}), strict=True):
        np.testing.assert_array_equal(ours, theirs)
    return result


@pytest.mark.parametrize(
    ("zeros", "rule"),
    [
        ((0, 4, -6), "merge-zero-point-of-one-part"),
        ((4, 0, -6), "merge-zero-point-of-other-part"),
    ],
)
def test_quantized_projections_become_one_integer_product(
    zeros: tuple[int, ...], rule: str
) -> None:
    # Each part dequantizes and requantizes with its own scales and zero points, which merge
    # as concatenated vectors; one part's zero point of 0 was removed by algebra, and merges
    # as a 0 beside the other part's.
    result = _integer_merge(_quantized_projections(zeros))
    assert _fired(result, "merge-broadcast-int-matmuls") == 2
    assert _fired(result, "merged-constants") > 0
    assert _fired(result, "merge-nan-saturations") == 2
    assert _fired(result, "merge-binaries-with-constants") > 0
    # The weight's scale times the activations' does not fold over a symbolic batch.
    assert _fired(result, "merged-constant-operands") == 2
    assert _fired(result, rule) == 1
    kinds = [str(k.kind) for k in result.program.launches()]
    assert kinds == ["elementwise", "int_matmul"], kinds
    (product,) = [n for n in result.graph.nodes if n.op.name == "IntMatMul"]
    assert product.inputs[1].shape[-1] == 3 * 8


def test_integer_products_whose_weights_have_other_zero_points_do_not_merge() -> None:
    # The second weight's zero point differs: the chain stops before it (and the third).
    result = _integer_merge(_quantized_projections((0, 0, 0), weight_zeros=(0, 1, 0)))
    assert _fired(result, "merge-broadcast-int-matmuls") == 0
    assert [str(k.kind) for k in result.program.launches()].count("int_matmul") == 3
