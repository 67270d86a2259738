"""rules/quantize.egg: quantized models' products become integer products, on imported models.

The models are written as onnxruntime's quantizers write them and imported, so the rules see
the importer's spelling. Scales are powers of two and sums short: the float arithmetic of the
QDQ model is then exact too, so the optimized graph (integer products) must equal the
original bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import knopt
from knopt.cpu import run_graph
from knopt.ir import bind_symbols
from knopt.ir.shape import static_dims
from knopt.opt.optimize import OptimizeResult
from knopt.testing.onnxbuild import OnnxBuilder
from tests.cuda.quant import random_nbits

U8, I8 = np.uint8, np.int8


class Model(OnnxBuilder):
    """A small ONNX model built node by node, with quantization's spellings."""

    def qdq(self, x: str, scale: float, zero: int, dtype: type) -> str:
        """QuantizeLinear then DequantizeLinear with one scale and zero point."""
        s, z = self.const(np.float32(scale)), self.const(np.array(zero, dtype=dtype))
        return self.node("DequantizeLinear", [self.node("QuantizeLinear", [x, s, z]), s, z])

    def dq(self, codes: np.ndarray, scale: np.ndarray, zero: np.ndarray, axis: int) -> str:
        """DequantizeLinear of constant codes (a quantized weight)."""
        args = [self.const(codes), self.const(scale.astype(np.float32)), self.const(zero)]
        return self.node("DequantizeLinear", args, axis=axis)

    def build(self, output: str) -> bytes:
        self.nodes[-1].output[0] = "y"
        del output
        return self.build_outputs(["y"])

    def build_outputs(self, outputs: Sequence[str]) -> bytes:
        """The model whose outputs are these values."""
        return self.model(outputs, "q").SerializeToString()


def _optimized(model: bytes, rng: np.random.Generator, sizes: dict[str, int]) -> OptimizeResult:
    """Optimize the model; check the optimized graph equals the original bit for bit."""
    graph = knopt.load(model)
    result = knopt.optimize(graph, profile="h200", ilp=False)
    before, after = bind_symbols(graph, sizes), bind_symbols(result.graph, sizes)
    feeds = {
        name: (rng.integers(-40, 40, static_dims(v.shape)) / 8).astype(np.float32)
        for name, v in zip(before.input_names, before.inputs, strict=True)
    }
    for ours, theirs in zip(run_graph(after, feeds), run_graph(before, feeds), strict=True):
        np.testing.assert_array_equal(ours, theirs)
    return result


def _onnxruntime(model: bytes, x: np.ndarray) -> np.ndarray:
    """The model's one output on input `x`, by onnxruntime's CPU run without its optimizations."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": x})
    return np.asarray(y)


def _ops(result: OptimizeResult) -> dict[str, int]:
    return result.graph.op_histogram()


def _pow2(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return np.exp2(-rng.integers(5, 8, shape)).astype(np.float32)


@pytest.mark.parametrize(("act", "weight"), [(U8, U8), (I8, I8), (U8, I8)])
@pytest.mark.parametrize("per_channel", [False, True])
def test_qdq_matmul_is_one_integer_kernel_with_its_requantization(
    rng: np.random.Generator, act: type, weight: type, per_channel: bool
) -> None:
    m = Model()
    x = m.qdq(m.input("x", ["batch", 5, 16]), 0.25, 3 if act is U8 else -2, act)
    codes: np.ndarray = rng.integers(np.iinfo(weight).min, np.iinfo(weight).max, (16, 12)).astype(
        weight
    )
    if per_channel:
        w = m.dq(codes, _pow2(rng, (12,)), rng.integers(0, 5, 12).astype(weight), axis=1)
    else:
        w = m.dq(codes, _pow2(rng, ()), np.array(1, weight), axis=1)
    y = m.node(
        "Add", [m.node("MatMul", [x, w]), m.const((rng.integers(-8, 8, 12) / 4).astype("f"))]
    )
    m.qdq(y, 2.0, 7 if act is U8 else 0, act)
    result = _optimized(m.build("y"), rng, {"batch": 2})
    assert _ops(result).get("IntMatMul") == 1
    assert "MatMul" not in _ops(result)
    assert result.report.rules_fired.get("int-matmul-of-dequantized-codes", 0) > 0
    kinds = [k.kind for k in result.program.kernels if k.kind != "view"]
    assert kinds.count("int_matmul") == 1


def test_qdq_conv_per_channel_pads_with_the_zero_point(rng: np.random.Generator) -> None:
    m = Model()
    x = m.qdq(m.input("x", [2, 3, 6, 6]), 0.125, 100, U8)
    codes: np.ndarray = rng.integers(-128, 128, (4, 3, 3, 3)).astype(I8)
    w = m.dq(codes, _pow2(rng, (4,)), np.zeros(4, I8), axis=0)
    conv = m.node("Conv", [x, w], pads=[1, 1, 1, 1])
    m.qdq(m.node("Relu", [conv]), 4.0, 0, U8)
    result = _optimized(m.build("y"), rng, {})
    assert _ops(result).get("IntConv") == 1
    assert "Conv" not in _ops(result)
    assert result.report.rules_fired.get("int-conv-of-dequantized-codes-per-channel", 0) > 0


def test_scales_varying_along_the_summed_axis_stay_float(rng: np.random.Generator) -> None:
    m = Model()
    x = m.qdq(m.input("x", [3, 8]), 0.25, 0, I8)
    codes: np.ndarray = rng.integers(-128, 128, (8, 4)).astype(I8)
    w = m.dq(codes, _pow2(rng, (8,)), np.zeros(8, I8), axis=0)  # one scale per k
    m.node("MatMul", [x, w])
    result = _optimized(m.build("y"), rng, {})
    assert "IntMatMul" not in _ops(result)


def test_max_pool_of_codes_feeds_the_next_integer_product(rng: np.random.Generator) -> None:
    m = Model()
    x = m.qdq(m.input("x", [1, 2, 6, 6]), 0.25, 10, U8)
    pooled = m.qdq(m.node("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2]), 0.25, 10, U8)
    codes: np.ndarray = rng.integers(-128, 128, (3, 2, 1, 1)).astype(I8)
    conv = m.node("Conv", [pooled, m.dq(codes, _pow2(rng, (3,)), np.zeros(3, I8), axis=0)])
    m.qdq(conv, 0.5, 0, I8)
    result = _optimized(m.build("y"), rng, {})
    assert result.report.rules_fired.get("max-pool-of-dequantized", 0) > 0
    assert result.report.rules_fired.get("quantize-of-dequantized", 0) > 0
    pools = [n for n in result.graph.nodes if n.op.name == "MAX_POOL"]
    assert [n.inputs[0].dtype.short for n in pools] == ["u8"]
    assert _ops(result).get("IntConv") == 1


def test_max_pool_of_a_negative_scale_stays_float(rng: np.random.Generator) -> None:
    m = Model()
    x = m.qdq(m.input("x", [1, 2, 6, 6]), -0.25, 10, U8)
    m.node("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
    result = _optimized(m.build("y"), rng, {})
    assert result.report.rules_fired.get("max-pool-of-dequantized", 0) == 0


def test_quantizing_with_another_scale_does_not_cancel(rng: np.random.Generator) -> None:
    m = Model()
    x = m.qdq(m.input("x", [4, 6]), 0.25, 10, U8)
    m.qdq(x, 0.5, 10, U8)
    result = _optimized(m.build("y"), rng, {})
    assert result.report.rules_fired.get("quantize-of-dequantized", 0) == 0


def test_dynamic_quantization_is_one_integer_kernel(rng: np.random.Generator) -> None:
    m = Model()
    q, scale, zero = (f"d{i}" for i in range(3))
    m.nodes.append(
        helper.make_node("DynamicQuantizeLinear", [m.input("x", [4, 16])], [q, scale, zero])
    )
    w_zero = m.const(np.array(131, U8))
    codes = m.const(rng.integers(0, 256, (16, 8)).astype(U8))
    acc = m.node("MatMulInteger", [q, codes, zero, w_zero])
    both = m.node("Mul", [scale, m.const(np.float32(0.0625))])
    m.node("Mul", [m.node("Cast", [acc], to=TensorProto.FLOAT), both])
    result = _optimized(m.build("y"), rng, {})
    assert result.report.rules_fired.get("int-matmul-of-centered-codes", 0) > 0
    assert _ops(result).get("IntMatMul") == 1
    assert "MatMul" not in _ops(result)


def test_conv_integer_is_int_conv(rng: np.random.Generator) -> None:
    m = Model()
    q, scale, zero = (f"d{i}" for i in range(3))
    x = m.input("x", [1, 2, 5, 5])
    m.nodes.append(helper.make_node("DynamicQuantizeLinear", [x], [q, scale, zero]))
    codes = m.const(rng.integers(0, 256, (3, 2, 3, 3)).astype(U8))
    acc = m.node("ConvInteger", [q, codes, zero, m.const(np.array(120, U8))], pads=[1, 1, 1, 1])
    m.node("Mul", [m.node("Cast", [acc], to=TensorProto.FLOAT), scale])
    result = _optimized(m.build("y"), rng, {})
    assert _ops(result).get("IntConv") == 1
    assert "Conv" not in _ops(result)


@pytest.mark.parametrize(("bits", "zeros"), [(4, True), (4, False), (8, True)])
def test_matmul_nbits_reads_its_packed_weight(
    rng: np.random.Generator, bits: int, zeros: bool
) -> None:
    from knopt.ir.dtype import DType

    k, n, block = 48, 8, 16
    m = Model()
    weight = random_nbits(rng, n, k, block, DType.F16, zeros)
    packed = weight.b if bits == 4 else rng.integers(0, 256, (n, 3, block), dtype=U8)
    args = [m.input("a", ["batch", k]), m.const(packed), m.const(_pow2(rng, (n, 3)))]
    if zeros:
        assert weight.zeros is not None
        args.append(m.const(weight.zeros if bits == 4 else rng.integers(0, 256, (n, 3), dtype=U8)))
    m.node("MatMulNBits", args, "com.microsoft", K=k, N=n, bits=bits, block_size=block)
    result = _optimized(m.build("y"), rng, {"batch": 3})
    assert _ops(result).get("Int4MatMul", 0) == (1 if bits == 4 else 0)


@pytest.mark.parametrize("dtype", [ml_dtypes.uint4, ml_dtypes.int4])
def test_int4_dequantize_linear_is_repacked_for_int4_matmul(
    rng: np.random.Generator, dtype: type
) -> None:
    k, n, block = 40, 6, 16  # k is no multiple of the block
    m = Model(opset=21)
    info = ml_dtypes.iinfo(dtype)
    codes: np.ndarray = rng.integers(int(info.min), int(info.max) + 1, (k, n)).astype(dtype)
    zeros: np.ndarray = rng.integers(int(info.min), int(info.max) + 1, (3, n)).astype(dtype)
    args = [m.const(codes), m.const(_pow2(rng, (3, n))), m.const(zeros)]
    w = m.node("DequantizeLinear", args, axis=0, block_size=block)
    m.node("MatMul", [m.input("a", [2, 5, k]), w])
    result = _optimized(m.build("y"), rng, {})
    (product,) = [node for node in result.graph.nodes if node.op.name == "Int4MatMul"]
    assert product.inputs[1].type.shape == (n, 3, block // 2)  # two codes a byte
    assert product.inputs[1].dtype.short == "u8"
    weights = [node.output.type.shape for node in result.graph.nodes if node.op.name == "Constant"]
    assert (k, n) not in weights and (n, k) not in weights  # never expanded to floats


def _bert_like_layer(rng: np.random.Generator, batch: int, rows: int, width: int) -> bytes:
    """Two linear layers as torch's TorchScript exporter and quantize_static write BERT's.

    Static sizes; MatMuls of a [batch, rows, width] activation by a 2-D weight (which the
    importer broadcasts over the batch); int8 activations with a zero point; symmetric
    per-channel int8 weights; the product's output quantized and dequantized before its bias,
    added bias first; a residual added after the second layer.
    """
    m = Model()
    x = m.input("x", [batch, rows, width])
    h = x
    for layer in range(2):
        q = m.qdq(h, 0.25, -3, I8)
        codes: np.ndarray = rng.integers(-127, 128, (width, width)).astype(I8)
        w = m.dq(codes, _pow2(rng, (width,)), np.zeros(width, I8), axis=1)
        y = m.qdq(m.node("MatMul", [q, w]), 2.0, 5, I8)
        bias = m.const((rng.integers(-8, 8, width) / 4).astype("f"))
        h = m.node("Add", [bias, y])
        h = m.node("Relu", [h]) if layer == 0 else m.node("Add", [h, x])
    return m.build(h)


def test_static_batch_products_fuse_their_epilogues_and_match_onnxruntime(
    rng: np.random.Generator,
) -> None:
    # The weights' scales broadcast over the batch (2 x 768 x 768 elements) are too large to
    # fold; read as their rows, they fold, and the dequantize -> bias -> requantize chains after
    # each product join the integer product's epilogue (before: 38 kernels, most of one op).
    model = _bert_like_layer(rng, batch=2, rows=3, width=768)
    result = knopt.optimize(knopt.load(model), profile="h200", ilp=False)
    kinds = [str(k.kind) for k in result.program.launches()]
    assert kinds.count("int_matmul") == 2
    assert len(kinds) == 3, kinds
    # Each weight's scale is read as its vector of 768 (sliced-scale-row), which folds with
    # the activations' scale, not as a slice of its spread over the batch.
    assert result.report.rules_fired.get("sliced-scale-row", 0) == 2
    assert "Slice" not in result.graph.op_histogram()
    magnitude = rng.uniform(0.125, 5.0, (2, 3, 768)).astype(np.float32)
    x = np.where(rng.random((2, 3, 768)) < 0.5, -magnitude, magnitude)
    (ours,) = knopt.compile(result.graph).run(None, {"x": x})
    theirs = _onnxruntime(model, x)
    np.testing.assert_array_equal(ours, theirs)


def _quantized_attention(rng: np.random.Generator, width: int, heads: int) -> bytes:
    """BERT's self-attention with only its linear layers quantized, as quantize_static writes it.

    int8 Q, K and V projections of one quantized input, each output quantized and dequantized;
    the attention products themselves float (scores, softmax, `@ v`).
    """
    m = Model()
    x = m.qdq(m.input("x", ["batch", "seq", width]), 0.25, -3, I8)
    split = m.const(np.array([0, 0, heads, width // heads], np.int64))
    parts = []
    for zero in (0, 4, -6):  # K's and V's outputs have zero points, Q's has none
        codes: np.ndarray = rng.integers(-127, 128, (width, width)).astype(I8)
        w = m.dq(codes, _pow2(rng, (width,)), np.zeros(width, I8), axis=1)
        y = m.qdq(m.node("MatMul", [x, w]), 2.0, zero, I8)
        parts.append(m.node("Transpose", [m.node("Reshape", [y, split])], perm=[0, 2, 1, 3]))
    q, k, v = parts
    scores = m.node("MatMul", [q, m.node("Transpose", [k], perm=[0, 1, 3, 2])])
    scaled = m.node("Mul", [scores, m.const(np.float32((width // heads) ** -0.5))])
    out = m.node("MatMul", [m.node("Softmax", [scaled], axis=-1), v])
    merge = m.const(np.array([0, 0, width], np.int64))
    m.node("Reshape", [m.node("Transpose", [out], perm=[0, 2, 1, 3]), merge])
    return m.build("y")


def test_float_attention_of_quantized_projections_stays_one_attention_kernel(
    rng: np.random.Generator,
) -> None:
    # Q @ K^T of the projections' codes is an integer product too (int-matmul-of-dequantized-
    # codes), but the GPU has no tensor-core path for a product of two computed operands: at
    # BERT-base's sizes it is priced, and measured, far above the fused float Attention (122 us
    # against 23 us a layer), which the program keeps. The projections, whose scales and zero
    # points differ, are one integer product over their concatenated weights (merge.egg), its
    # epilogue dequantizing what Attention reads: the quantized input, one GEMM, Attention.
    model = _quantized_attention(rng, width=768, heads=12)
    graph = knopt.load(model)
    result = knopt.optimize(graph, profile="h200", ilp=False, sizes={"batch": 32, "seq": 128})
    kinds = [str(k.kind) for k in result.program.launches()]
    assert kinds == ["elementwise", "int_matmul", "Attention"], kinds
    (product,) = [n for n in result.graph.nodes if n.op.name == "IntMatMul"]
    assert product.inputs[1].shape[-1] == 3 * 768
    fired = result.report.rules_fired
    assert (
        fired.get("merge-zero-point-of-one-part", 0)
        + fired.get("merge-zero-point-of-other-part", 0)
        == 1
    )
    x = (rng.integers(-40, 40, (2, 5, 768)) / 8).astype(np.float32)
    (ours,) = knopt.compile(result.graph).run(None, {"x": x})
    theirs = _onnxruntime(model, x)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5 * float(np.abs(theirs).max()))


def test_a_norm_writes_the_codes_its_products_and_residual_read(rng: np.random.Generator) -> None:
    # quantize_static quantizes a LayerNorm's result for the next product and dequantizes the
    # same codes for the residual: the norm kernel writes the codes (its epilogue quantizes),
    # the product's epilogue dequantizes them where it adds the residual (full-cast-of-codes),
    # and no kernel writes a float copy of them (before: a Cast and an elementwise kernel).
    m = Model(opset=17)
    gamma, beta = m.const(_pow2(rng, (64,))), m.const(_pow2(rng, (64,)))
    h = m.qdq(m.node("LayerNormalization", [m.input("x", [2, 8, 64]), gamma, beta]), 0.25, 5, I8)
    codes: np.ndarray = rng.integers(-127, 128, (64, 64)).astype(I8)
    w = m.dq(codes, _pow2(rng, (64,)), np.zeros(64, I8), axis=1)
    y = m.qdq(m.node("MatMul", [h, w]), 2.0, -4, I8)
    m.node("Add", [m.node("Add", [m.const(_pow2(rng, (64,))), y]), h])
    model = m.build("y")
    result = knopt.optimize(knopt.load(model), profile="h200", ilp=False)
    kinds = [str(k.kind) for k in result.program.launches()]
    assert kinds == ["layer_norm", "int_matmul"], kinds
    assert result.report.rules_fired.get("full-cast-of-codes", 0) > 0
    x = rng.standard_normal((2, 8, 64)).astype(np.float32)
    (ours,) = knopt.compile(result.graph).run(None, {"x": x})
    theirs = _onnxruntime(model, x)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5 * float(np.abs(theirs).max()))
