"""The ONNX writer's spellings: each recognised pattern as its fused standard op, the rest short.

Every case exports a small IR graph, checks which ONNX ops the file holds, passes onnx's full
check and strict shape inference, and runs on onnxruntime (as written, and fully optimized)
with the results of knopt's CPU executor.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping

import numpy as np
import onnx
import pytest

from knopt.ir import GraphBuilder, sym
from knopt.ir.dtype import DType
from knopt.ir.graph import Graph, Value
from knopt.ir.op import Reduction, Unary
from knopt.ir.shape import Shape
from knopt.onnx.export import save_onnx
from tests.oracle import assert_same, random_array, run_knopt

F32 = DType.F32
BATCH, SEQ = sym("batch"), sym("seq")
Build = Callable[[GraphBuilder], None]


def graph_of(build: Build) -> Graph:
    b = GraphBuilder("case")
    build(b)
    return b.build()


def _run(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], *, optimize: bool) -> list:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    level = ort.GraphOptimizationLevel
    options.graph_optimization_level = level.ORT_ENABLE_ALL if optimize else level.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])
    return list(session.run(None, dict(feeds)))


def onnxruntime_ops(model: onnx.ModelProto) -> Counter[str]:
    """The ops of the model onnxruntime runs after its own optimizations."""
    import tempfile

    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as folder:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.optimized_model_filepath = f"{folder}/optimized.onnx"
        ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])
        return ops_of(onnx.load(options.optimized_model_filepath))


def ops_of(model: onnx.ModelProto) -> Counter[str]:
    """How many nodes of each op type the model has."""
    return Counter(node.op_type for node in model.graph.node)


def check(
    graph: Graph,
    feeds: Mapping[str, np.ndarray],
    *,
    opset: int = 18,
    target: str = "onnx",
    rtol: float = 1e-4,
    atol: float = 1e-5,
) -> onnx.ModelProto:
    """Export, validate, and compare onnxruntime (as written and optimized) with knopt."""
    model = save_onnx(graph, opset=opset, target=target)
    onnx.checker.check_model(model, full_check=True)
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    expected = run_knopt(graph, feeds)
    for optimize in (False, True):
        assert_same(_run(model, feeds, optimize=optimize), expected, rtol=rtol, atol=atol)
    return model


def feeds_for(graph: Graph, rng: np.random.Generator, sizes: Mapping[str, int]) -> dict:
    """Random inputs for every graph input, symbolic sizes bound by `sizes`."""
    feeds = {}
    for name, value in zip(graph.input_names, graph.inputs, strict=True):
        shape = [d if isinstance(d, int) else sizes[str(d)] for d in value.shape]
        feeds[name] = random_array(rng, shape, value.dtype)
    return feeds


def constant(b: GraphBuilder, rng: np.random.Generator, shape: Shape) -> Value:
    return b.constant(random_array(rng, shape, F32))  # type: ignore[arg-type]


# ---- normalizations ------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [1, 2])
@pytest.mark.parametrize("eps", [1e-5, 1e-12])
@pytest.mark.parametrize("affine", ["scale_bias", "bias_scale_swapped", "scale", "bias", "none"])
def test_layer_norm_with_its_affine_is_one_layer_normalization(
    rng: np.random.Generator, axis: int, eps: float, affine: str
) -> None:
    def build(b: GraphBuilder) -> None:
        x = b.input("x", (BATCH, 6, 8), F32)
        y = b.layer_norm(x, axis=axis, eps=eps)
        normalized = (6, 8)[axis - 1 :]
        if affine in ("scale_bias", "scale"):
            y = b.mul(y, constant(b, rng, normalized))
        if affine == "bias_scale_swapped":
            y = b.mul(constant(b, rng, normalized), y)
        if affine in ("scale_bias", "bias", "bias_scale_swapped"):
            y = b.add(constant(b, rng, normalized[-1:]), y)
        b.output(y, "y")

    graph = graph_of(build)
    model = check(graph, feeds_for(graph, rng, {"batch": 3}))
    assert ops_of(model) == Counter({"LayerNormalization": 1})
    (node,) = model.graph.node
    assert [a.i for a in node.attribute if a.name == "axis"] == [axis]


def test_scale_that_varies_outside_the_normalized_axes_stays_a_mul(
    rng: np.random.Generator,
) -> None:
    def build(b: GraphBuilder) -> None:
        x = b.input("x", (4, 6, 8), F32)
        b.output(b.mul(b.layer_norm(x, axis=2, eps=1e-5), constant(b, rng, (6, 1))), "y")

    graph = graph_of(build)
    model = check(graph, feeds_for(graph, rng, {}))
    assert ops_of(model) == Counter({"LayerNormalization": 1, "Mul": 1})


@pytest.mark.parametrize("opset", [18, 23])
def test_rms_norm_times_scale_is_rms_normalization_or_what_onnxruntime_fuses(
    rng: np.random.Generator, opset: int
) -> None:
    def build(b: GraphBuilder) -> None:
        x = b.input("x", (BATCH, SEQ, 16), F32)
        b.output(b.mul(constant(b, rng, (16,)), b.rms_norm(x, axis=2, eps=1e-6)), "y")

    graph = graph_of(build)
    model = check(graph, feeds_for(graph, rng, {"batch": 2, "seq": 5}), opset=opset)
    if opset >= 23:
        assert ops_of(model) == Counter({"RMSNormalization": 1})
    else:
        assert onnxruntime_ops(model) == Counter({"SimplifiedLayerNormalization": 1})


# ---- activations ---------------------------------------------------------------------------


@pytest.mark.parametrize("opset", [18, 20])
@pytest.mark.parametrize("kind", [Unary.GELU, Unary.GELU_TANH], ids=lambda k: k.name)
def test_gelu_is_gelu_from_opset_20_and_fuses_in_onnxruntime_before(
    rng: np.random.Generator, opset: int, kind: Unary
) -> None:
    def build(b: GraphBuilder) -> None:
        x = b.input("x", (BATCH, 32), F32)
        b.output(b.add(b.unary(kind, b.unary(Unary.NEG, x)), x), "y")  # not a graph output

    graph = graph_of(build)
    model = check(graph, feeds_for(graph, rng, {"batch": 3}), opset=opset)
    if opset >= 20:
        (gelu,) = [n for n in model.graph.node if n.op_type == "Gelu"]
        approximate = [a.s.decode() for a in gelu.attribute if a.name == "approximate"]
        assert approximate == (["tanh"] if kind is Unary.GELU_TANH else [])
    else:
        fused = "Gelu" if kind is Unary.GELU else "FastGelu"
        assert onnxruntime_ops(model)[fused] == 1


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_softmax_and_log_softmax_on_any_axis_are_one_node(
    rng: np.random.Generator, axis: int
) -> None:
    def build(b: GraphBuilder) -> None:
        x = b.input("x", (3, 4, 5), F32)
        b.output(b.softmax(x, axis=axis), "softmax")
        shifted = b.sub(x, b.reduce(Reduction.MAX, x, axes=[axis]))
        total = b.reduce(Reduction.SUM, b.unary(Unary.EXP, shifted), axes=[axis])
        b.output(b.sub(shifted, b.unary(Unary.LOG, total)), "log_softmax")

    graph = graph_of(build)
    model = check(graph, feeds_for(graph, rng, {}))
    assert ops_of(model) == Counter({"Softmax": 1, "LogSoftmax": 1})


def test_hard_swish_is_hard_swish(rng: np.random.Generator) -> None:
    def build(b: GraphBuilder) -> None:
        b.output(b.unary(Unary.HARD_SWISH, b.input("x", (2, 3, 4, 4), F32)), "y")

    graph = graph_of(build)
    assert ops_of(check(graph, feeds_for(graph, rng, {}))) == Counter({"HardSwish": 1})


# ---- convolutions and products -------------------------------------------------------------


@pytest.mark.parametrize("bias_shape", [(8, 1, 1), (1, 8, 1, 1), ()])
def test_conv_plus_channel_bias_is_conv_with_bias(
    rng: np.random.Generator, bias_shape: tuple[int, ...]
) -> None:
    def build(b: GraphBuilder) -> None:
        x = b.input("x", (BATCH, 4, 9, 9), F32)
        y = b.conv(
            x,
            constant(b, rng, (8, 4, 3, 3)),
            strides=(2, 2),
            pads=((1, 1), (1, 1)),
            dilations=(1, 1),
        )
        b.output(b.add(y, constant(b, rng, bias_shape)), "y")

    graph = graph_of(build)
    model = check(graph, feeds_for(graph, rng, {"batch": 2}))
    assert ops_of(model) == Counter({"Conv": 1})
    assert len(model.graph.node[0].input) == 3


def test_bias_that_varies_along_space_stays_an_add(rng: np.random.Generator) -> None:
    def build(b: GraphBuilder) -> None:
        x = b.input("x", (2, 4, 5, 5), F32)
        y = b.conv(
            x, constant(b, rng, (8, 4, 1, 1)), strides=(1, 1), pads=((0, 0),) * 2, dilations=(1, 1)
        )
        b.output(b.add(y, constant(b, rng, (5, 5))), "y")

    graph = graph_of(build)
    assert ops_of(check(graph, feeds_for(graph, rng, {}))) == Counter({"Conv": 1, "Add": 1})


@pytest.mark.parametrize("bias_shape", [(6,), (1, 6), (BATCH, 1), ()])
@pytest.mark.parametrize("transposed", [False, True])
def test_matmul_plus_bias_on_matrices_is_gemm(
    rng: np.random.Generator, bias_shape: Shape, transposed: bool
) -> None:
    def build(b: GraphBuilder) -> None:
        x = b.input("x", (BATCH, 5), F32)
        weights = (
            b.permute(constant(b, rng, (6, 5)), (1, 0)) if transposed else constant(b, rng, (5, 6))
        )
        if BATCH in bias_shape:
            bias = b.input("bias", bias_shape, F32)
        else:
            bias = constant(b, rng, bias_shape)
        b.output(b.add(b.matmul(x, weights), bias), "y")

    graph = graph_of(build)
    model = check(graph, feeds_for(graph, rng, {"batch": 3}))
    assert ops_of(model) == Counter({"Gemm": 1})
    (gemm,) = model.graph.node
    assert [a.i for a in gemm.attribute if a.name == "transB"] == ([1] if transposed else [])


def test_matmul_on_flattened_rows_is_one_matmul_on_the_rows(rng: np.random.Generator) -> None:
    # GPT-2's Conv1D: view [b, s, k] as [b*s, k], multiply and add, view back as [b, s, n].
    def build(b: GraphBuilder) -> None:
        x = b.input("x", (BATCH, SEQ, 8), F32)
        flat = b.view(x, (BATCH * SEQ, 8))
        product = b.add(b.matmul(flat, constant(b, rng, (8, 12))), constant(b, rng, (12,)))
        b.output(b.view(product, (BATCH, SEQ, 12)), "y")

    graph = graph_of(build)
    model = check(graph, feeds_for(graph, rng, {"batch": 2, "seq": 3}))
    assert ops_of(model) == Counter({"MatMul": 1, "Add": 1})


@pytest.mark.parametrize(("axes", "op_type"), [((2, 3), "GlobalAveragePool"), ((1,), "ReduceMean")])
@pytest.mark.parametrize("divide", [False, True])
def test_sum_over_count_is_a_mean(
    rng: np.random.Generator, axes: tuple[int, ...], op_type: str, divide: bool
) -> None:
    def build(b: GraphBuilder) -> None:
        x = b.input("x", (BATCH, 3, 4, 5), F32)
        total = b.reduce(Reduction.SUM, x, axes=axes)
        count = int(np.prod([(3, 4, 5)[a - 1] for a in axes]))
        if divide:
            b.output(b.div(total, b.constant(np.float32(count))), "y")
        else:
            b.output(b.mul(total, b.constant(np.float32(1 / count))), "y")

    graph = graph_of(build)
    assert ops_of(check(graph, feeds_for(graph, rng, {"batch": 2}))) == Counter({op_type: 1})


# ---- layout --------------------------------------------------------------------------------


def test_slices_that_tile_an_axis_are_one_split(rng: np.random.Generator) -> None:
    def build(b: GraphBuilder) -> None:
        x = b.input("x", (BATCH, 12), F32)
        for name, (start, stop) in zip("qkv", [(0, 4), (4, 8), (8, 12)], strict=True):
            b.output(b.unary(Unary.NEG, b.slice(x, axis=1, start=start, stop=stop)), name)

    graph = graph_of(build)
    model = check(graph, feeds_for(graph, rng, {"batch": 2}))
    assert ops_of(model) == Counter({"Split": 1, "Neg": 3})


def test_gathers_that_repeat_pixels_are_one_resize(rng: np.random.Generator) -> None:
    def build(b: GraphBuilder) -> None:
        x = b.input("x", (BATCH, 3, 4, 5), F32)
        rows = b.gather(x, b.constant(np.arange(8) // 2), axis=2)
        b.output(b.gather(rows, b.constant(np.arange(15) // 3), axis=3), "y")

    graph = graph_of(build)
    model = check(graph, feeds_for(graph, rng, {"batch": 2}))
    assert ops_of(model) == Counter({"Resize": 1})
