"""Each CPU kernel against onnxruntime (or onnx's reference evaluator) running the ONNX op.

The kernels are called directly on random non-zero arrays, and the oracle runs a one-node ONNX
model written by hand, so neither knopt's importer nor its exporter sits between them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from knopt.cpu.elementwise import NUMPY_BINARY, NUMPY_UNARY
from knopt.cpu.executor import run_graph
from knopt.cpu.kernels import KERNELS
from knopt.ir import op as ops
from knopt.ir.builder import GraphBuilder
from knopt.ir.dtype import DType
from knopt.ir.op import (
    OP_CLASSES,
    Binary,
    PadMode,
    PoolKind,
    Reduction,
    ScatterReduction,
    Unary,
)
from tests.oracle import random_array

F32 = DType.F32


def test_kernels_cover_every_op_class() -> None:
    assert set(KERNELS) | {ops.Input} == set(OP_CLASSES)


def test_numpy_tables_cover_every_elementwise_kind() -> None:
    assert set(NUMPY_UNARY) == set(Unary)
    assert set(NUMPY_BINARY) == set(Binary)


def _onnx(
    op_type: str,
    inputs: Sequence[np.ndarray | None],
    *,
    outputs: int = 1,
    opset: int = 18,
    engine: str = "onnxruntime",
    **attrs: Any,
) -> list[np.ndarray]:
    """Run one ONNX node on `inputs` (None: an absent optional input) and return its outputs."""
    names = [f"in{i}" if a is not None else "" for i, a in enumerate(inputs)]
    feeds = {n: a for n, a in zip(names, inputs, strict=True) if a is not None}
    infos = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for n, a in feeds.items()
    ]
    out_names = [f"out{i}" for i in range(outputs)]
    node = helper.make_node(op_type, names, out_names, **attrs)
    graph = helper.make_graph(
        [node], "one", infos, [onnx.ValueInfoProto(name=n) for n in out_names]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    if engine == "reference":
        from onnx.reference import ReferenceEvaluator

        return [np.asarray(a) for a in ReferenceEvaluator(model).run(None, feeds)]
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(session.run(None, feeds))


def _close(ours: np.ndarray, theirs: np.ndarray, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    assert ours.shape == theirs.shape
    assert ours.dtype == theirs.dtype
    np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=atol)


# ---- convolution and pooling ---------------------------------------------------------------

_CONVS = [
    # input, weight, strides, pads ((before, after) per axis), dilations, groups
    ((2, 4, 9), (6, 4, 3), (1,), ((0, 0),), (1,), 1),
    ((1, 4, 10), (8, 2, 2), (3,), ((2, 1),), (2,), 2),
    ((2, 3, 8, 7), (5, 3, 3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1),
    ((1, 6, 9, 8), (6, 1, 3, 2), (2, 1), ((0, 2), (1, 0)), (2, 3), 6),
    ((2, 8, 7, 7), (4, 2, 1, 1), (2, 2), ((0, 0), (0, 0)), (1, 1), 4),
    ((1, 2, 5, 6, 4), (4, 1, 2, 3, 2), (1, 2, 1), ((1, 0), (0, 1), (1, 1)), (2, 1, 1), 2),
]


@pytest.mark.parametrize(("x_shape", "w_shape", "strides", "pads", "dilations", "groups"), _CONVS)
def test_conv_matches_onnxruntime(
    rng: np.random.Generator,
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    strides: tuple[int, ...],
    pads: tuple[tuple[int, int], ...],
    dilations: tuple[int, ...],
    groups: int,
) -> None:
    x = random_array(rng, x_shape, F32)
    w = random_array(rng, w_shape, F32)
    op = ops.Conv(strides, pads, dilations, groups)
    (expected,) = _onnx(
        "Conv",
        [x, w],
        strides=list(strides),
        pads=[b for b, _ in pads] + [a for _, a in pads],
        dilations=list(dilations),
        group=groups,
    )
    _close(KERNELS[ops.Conv](op, x, w), expected, rtol=1e-4, atol=1e-5)


_POOLS = [
    # kernel, strides, pads, dilations
    ((3,), (2,), ((1, 1),), (1,)),
    ((2, 2), (2, 2), ((0, 0), (0, 0)), (1, 1)),
    ((3, 2), (2, 3), ((1, 1), (0, 1)), (1, 1)),
    ((3, 3), (2, 2), ((1, 0), (1, 1)), (1, 1)),
    ((2, 2, 2), (2, 1, 2), ((0, 1), (1, 0), (0, 0)), (1, 1, 1)),
]


@pytest.mark.parametrize(("kernel", "strides", "pads", "dilations"), _POOLS)
@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("count_include_pad", [False, True])
def test_average_pool_matches_onnxruntime(
    rng: np.random.Generator,
    kernel: tuple[int, ...],
    strides: tuple[int, ...],
    pads: tuple[tuple[int, int], ...],
    dilations: tuple[int, ...],
    ceil_mode: bool,
    count_include_pad: bool,
) -> None:
    x = random_array(rng, (2, 3, *(7 - i for i in range(len(kernel)))), F32)
    op = ops.Pool(PoolKind.AVG, kernel, strides, pads, dilations, ceil_mode, count_include_pad)
    (expected,) = _onnx(
        "AveragePool",
        [x],
        kernel_shape=list(kernel),
        strides=list(strides),
        pads=[b for b, _ in pads] + [a for _, a in pads],
        ceil_mode=int(ceil_mode),
        count_include_pad=int(count_include_pad),
    )
    _close(KERNELS[ops.Pool](op, x), expected)


@pytest.mark.parametrize("dilations", [(1, 1), (2, 1)])
@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("dtype", [F32, DType.I8, DType.U8])
def test_max_pool_matches_onnxruntime(
    rng: np.random.Generator, dilations: tuple[int, int], ceil_mode: bool, dtype: DType
) -> None:
    x = random_array(rng, (1, 2, 8, 7), dtype, low=-100, high=100)
    pads = ((1, 0), (1, 1))
    op = ops.Pool(PoolKind.MAX, (3, 2), (2, 2), pads, dilations, ceil_mode)
    (expected,) = _onnx(
        "MaxPool",
        [x],
        kernel_shape=[3, 2],
        strides=[2, 2],
        pads=[1, 1, 0, 1],
        dilations=list(dilations),
        ceil_mode=int(ceil_mode),
    )
    _close(KERNELS[ops.Pool](op, x), expected)


# ---- sorting, scanning, indexing -----------------------------------------------------------


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("axis", [0, 1])
def test_arg_sort_breaks_ties_by_index_like_topk(
    rng: np.random.Generator, descending: bool, axis: int
) -> None:
    x = rng.integers(-2, 3, (6, 7)).astype(np.int64)  # few values: many ties
    op = ops.ArgSort(axis, descending)
    k = np.array([x.shape[axis]], np.int64)
    _, expected = _onnx("TopK", [x, k], outputs=2, axis=axis, largest=int(descending), sorted=1)
    ours = KERNELS[ops.ArgSort](op, x)
    np.testing.assert_array_equal(ours, expected)


def test_arg_sort_descending_of_the_smallest_integer_does_not_overflow() -> None:
    x = np.array([np.iinfo(np.int32).min, 5, np.iinfo(np.int32).min, 7], np.int32)
    assert KERNELS[ops.ArgSort](ops.ArgSort(0, True), x).tolist() == [3, 1, 0, 2]


@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [F32, DType.I32, DType.I64])
def test_cumsum_matches_onnxruntime(
    rng: np.random.Generator, exclusive: bool, reverse: bool, dtype: DType
) -> None:
    x = random_array(rng, (3, 5, 4), dtype, low=-9, high=9)
    op = ops.CumSum(1, exclusive, reverse)
    (expected,) = _onnx(
        "CumSum", [x, np.array(1, np.int64)], exclusive=int(exclusive), reverse=int(reverse)
    )
    _close(KERNELS[ops.CumSum](op, x), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("largest", [False, True])
@pytest.mark.parametrize("last", [False, True])
def test_arg_reduce_picks_first_or_last_tie(
    rng: np.random.Generator, largest: bool, last: bool
) -> None:
    x = rng.integers(-2, 3, (4, 6)).astype(np.float32)
    op = ops.ArgReduce(1, largest, last)
    (expected,) = _onnx(
        "ArgMax" if largest else "ArgMin", [x], axis=1, keepdims=1, select_last_index=int(last)
    )
    np.testing.assert_array_equal(KERNELS[ops.ArgReduce](op, x), expected)


def test_gather_wraps_negative_indices(rng: np.random.Generator) -> None:
    x = random_array(rng, (3, 5, 2), F32)
    indices = np.array([[-1, 0], [4, -5]], np.int64)
    (expected,) = _onnx("Gather", [x, indices], axis=1)
    _close(KERNELS[ops.Gather](ops.Gather(1), x, indices), expected)


@pytest.mark.parametrize("reduction", list(ScatterReduction), ids=lambda r: r.name)
def test_scatter_matches_scatter_elements(
    rng: np.random.Generator, reduction: ScatterReduction
) -> None:
    data = random_array(rng, (3, 5), F32)
    updates = random_array(rng, (3, 3), F32)
    unique = np.array([[0, 4, 2], [-1, 1, 3], [2, 0, -2]], np.int64)
    repeated = np.array([[0, 0, 2], [1, 1, 1], [4, 0, 4]], np.int64)
    indices = unique if reduction is ScatterReduction.NONE else repeated
    op = ops.Scatter(1, reduction)
    (expected,) = _onnx(
        "ScatterElements", [data, indices, updates], axis=1, reduction=reduction.name.lower()
    )
    _close(KERNELS[ops.Scatter](op, data, indices, updates), expected)


@pytest.mark.parametrize(
    ("axis", "start", "stop", "step"), [(0, 1, 4, 1), (1, 0, 7, 3), (1, 2, 3, 5), (0, 2, 2, 1)]
)
def test_slice_matches_onnxruntime(
    rng: np.random.Generator, axis: int, start: int, stop: int, step: int
) -> None:
    x = random_array(rng, (4, 7), F32)
    args = [np.array([v], np.int64) for v in (start, stop, axis, step)]
    (expected,) = _onnx("Slice", [x, *args])
    _close(KERNELS[ops.Slice](ops.Slice(axis, start, stop, step), x), expected)


@pytest.mark.parametrize("mode", list(PadMode), ids=lambda m: m.name)
def test_pad_matches_onnxruntime(rng: np.random.Generator, mode: PadMode) -> None:
    x = random_array(rng, (3, 4), F32)
    pads = ((2, 1), (0, 3))
    op = ops.Pad(pads, mode, 2.5)
    extra = [np.array(2.5, np.float32)] if mode is PadMode.CONSTANT else []
    (expected,) = _onnx(
        "Pad", [x, np.array([2, 0, 1, 3], np.int64), *extra], mode=mode.name.lower(), opset=19
    )
    _close(KERNELS[ops.Pad](op, x), expected)


# ---- arithmetic semantics ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [DType.I8, DType.I32, DType.I64, DType.U8])
def test_integer_division_truncates_toward_zero(rng: np.random.Generator, dtype: DType) -> None:
    a = random_array(rng, (40,), dtype, low=-100, high=100)
    b = random_array(rng, (40,), dtype, low=-9, high=9)
    op = ops.BinaryOp(Binary.DIV)
    (expected,) = _onnx("Div", [a, b])
    np.testing.assert_array_equal(KERNELS[ops.BinaryOp](op, a, b), expected)


@pytest.mark.parametrize("dtype", [DType.I32, DType.I64, F32])
@pytest.mark.parametrize("kind", [Binary.MOD, Binary.FMOD], ids=lambda k: k.name)
def test_mod_signs_follow_onnx(rng: np.random.Generator, dtype: DType, kind: Binary) -> None:
    a = random_array(rng, (40,), dtype, low=-50, high=50)
    b = random_array(rng, (40,), dtype, low=-7, high=7)
    fmod = int(kind is Binary.FMOD)
    # ONNX allows floats only with fmod=1; the reference evaluator also does Python % on them.
    engine = "reference" if dtype.is_float and not fmod else "onnxruntime"
    (expected,) = _onnx("Mod", [a, b], fmod=fmod, engine=engine)
    _close(KERNELS[ops.BinaryOp](ops.BinaryOp(kind), a, b), expected, rtol=1e-5, atol=1e-5)


def test_clamp_of_integers_rounds_bounds_inward(rng: np.random.Generator) -> None:
    x = random_array(rng, (30,), DType.I32, low=-10, high=10)
    op = ops.Clamp(-3.5, 4.5)
    (expected,) = _onnx("Clip", [x, np.array(-3, np.int32), np.array(4, np.int32)])
    np.testing.assert_array_equal(KERNELS[ops.Clamp](op, x), expected)


@pytest.mark.parametrize("target", [DType.I32, DType.I8, DType.BOOL, DType.F16, DType.U8])
def test_cast_from_float_matches_onnxruntime(rng: np.random.Generator, target: DType) -> None:
    x = random_array(rng, (50,), F32, low=-100 if target is not DType.U8 else 0.5, high=100)
    (expected,) = _onnx("Cast", [x], to=int(target))
    np.testing.assert_array_equal(KERNELS[ops.Cast](ops.Cast(target), x), expected)


@pytest.mark.parametrize("kind", list(Reduction), ids=lambda k: k.name)
@pytest.mark.parametrize("dtype", [F32, DType.I64])
def test_reduce_matches_onnxruntime(
    rng: np.random.Generator, kind: Reduction, dtype: DType
) -> None:
    x = random_array(rng, (3, 4, 5), dtype, low=-3, high=3)
    axes = (0, 2)
    op = ops.Reduce(kind, axes)
    (expected,) = _onnx(
        f"Reduce{kind.name.capitalize()}", [x, np.array(axes, np.int64)], keepdims=1
    )
    _close(KERNELS[ops.Reduce](op, x), expected, rtol=1e-5, atol=1e-5)


# ---- normalization -------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_softmax_matches_onnxruntime(rng: np.random.Generator, axis: int) -> None:
    x = random_array(rng, (3, 4, 5), F32, low=-20, high=20)
    (expected,) = _onnx("Softmax", [x], axis=axis)
    _close(KERNELS[ops.Softmax](ops.Softmax(axis), x), expected)


@pytest.mark.parametrize("axis", [1, 2])
def test_layer_norm_matches_onnxruntime(rng: np.random.Generator, axis: int) -> None:
    x = random_array(rng, (2, 4, 6), F32)
    scale = np.ones(x.shape[axis:], np.float32)
    (expected,) = _onnx("LayerNormalization", [x, scale], axis=axis, epsilon=1e-3)
    _close(KERNELS[ops.LayerNorm](ops.LayerNorm(axis, 1e-3), x), expected, rtol=1e-4)


@pytest.mark.parametrize("axis", [1, 2])
def test_rms_norm_matches_the_reference(rng: np.random.Generator, axis: int) -> None:
    x = random_array(rng, (2, 4, 6), F32)
    scale = np.ones(x.shape[axis:], np.float32)
    (expected,) = _onnx(
        "RMSNormalization", [x, scale], axis=axis, epsilon=1e-3, opset=23, engine="reference"
    )
    _close(KERNELS[ops.RmsNorm](ops.RmsNorm(axis, 1e-3), x), expected, rtol=1e-4)


@pytest.mark.parametrize("engine", ["reference", "onnxruntime"])
@pytest.mark.parametrize("dtype", [F32, DType.F16], ids=lambda d: d.short)
def test_rope_matches_rotary_embedding(rng: np.random.Generator, dtype: DType, engine: str) -> None:
    # ONNX's RotaryEmbedding takes half-width tables; Rope reads them repeated, as LLaMA's
    # cos = cat(freqs, freqs).cos() is, and broadcast over the heads.
    x = random_array(rng, (2, 3, 5, 8), dtype)
    angles = rng.uniform(-4.0, 4.0, (2, 5, 4)).astype(dtype.numpy)
    cos, sin = np.cos(angles), np.sin(angles)
    (expected,) = _onnx("RotaryEmbedding", [x, cos, sin], opset=23, engine=engine)

    def table(half: np.ndarray) -> np.ndarray:
        return np.broadcast_to(np.concatenate([half, half], axis=-1)[:, None], x.shape)

    ours = KERNELS[ops.Rope](ops.Rope(), x, table(cos), table(sin))
    tolerance = 1e-6 if dtype is F32 else 2e-3
    _close(ours, expected, rtol=tolerance, atol=tolerance)


def test_conv_of_a_non_contiguous_input_matches(rng: np.random.Generator) -> None:
    x = random_array(rng, (2, 7, 6, 3), F32).transpose(0, 3, 1, 2)  # a permuted view
    w = random_array(rng, (4, 3, 3, 3), F32)
    op = ops.Conv((1, 1), ((0, 0), (0, 0)), (1, 1), 1)
    (expected,) = _onnx("Conv", [np.ascontiguousarray(x), w])
    _close(KERNELS[ops.Conv](op, x, w), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [DType.F16, F32, DType.F64], ids=lambda d: d.short)
def test_sigmoid_keeps_relative_precision_in_both_tails(dtype: DType) -> None:
    x = np.linspace(-80, 80, 20001).astype(dtype.numpy)
    exact = 1 / (1 + np.exp(-x.astype(np.float64)))
    ours = KERNELS[ops.UnaryOp](ops.UnaryOp(Unary.SIGMOID), x)
    assert ours.dtype == x.dtype
    normal = exact > np.finfo(dtype.numpy).tiny
    rtol = {DType.F16: 1e-3, F32: 1e-4, DType.F64: 1e-12}[dtype]
    np.testing.assert_allclose(ours[normal], exact[normal], rtol=rtol)


@pytest.mark.parametrize("exponent", [2.0, 3.0, 0.5, -1.0, 1.0, 0.0, -0.5, 1.7])
def test_pow_with_a_scalar_exponent_matches_numpy_power(exponent: float) -> None:
    x = np.array([[-2.5, 3.0, 0.0, -0.0, 1e-3, np.inf, -np.inf, np.nan]], np.float32)
    b = np.full((1, 1), exponent, np.float32)
    with np.errstate(all="ignore"):
        ours = KERNELS[ops.BinaryOp](ops.BinaryOp(Binary.POW), x, b)
        expected = np.power(x, np.broadcast_to(b, x.shape))
    np.testing.assert_allclose(ours, expected, rtol=2e-7)
    np.testing.assert_array_equal(np.signbit(ours), np.signbit(expected))


# ---- half precision ------------------------------------------------------------------------

_HALF_UNARY = {
    Unary.EXP: "Exp",
    Unary.TANH: "Tanh",
    Unary.SIGMOID: "Sigmoid",
    Unary.RELU: "Relu",
    Unary.SQRT: "Sqrt",
    Unary.NEG: "Neg",
    Unary.ERF: "Erf",
}


@pytest.mark.parametrize("kind", list(_HALF_UNARY), ids=lambda k: k.name)
def test_f16_unary_matches_onnxruntime(rng: np.random.Generator, kind: Unary) -> None:
    x = random_array(rng, (64,), DType.F16, low=0.05, high=4.0)
    (expected,) = _onnx(_HALF_UNARY[kind], [x])
    _close(KERNELS[ops.UnaryOp](ops.UnaryOp(kind), x), expected, rtol=2e-3, atol=1e-3)


@pytest.mark.parametrize("dtype", [DType.F16, F32, DType.F64], ids=lambda d: d.short)
def test_float_unary_kinds_keep_the_dtype(dtype: DType) -> None:
    x = np.linspace(0.1, 0.9, 5).astype(dtype.numpy)
    to_bool = {Unary.IS_NAN, Unary.IS_INF}
    for kind, fn in NUMPY_UNARY.items():
        if kind in ops.UNARY_FLOAT_ONLY - to_bool or kind in (Unary.NEG, Unary.ABS):
            with np.errstate(invalid="ignore"):
                assert np.asarray(fn(x)).dtype == x.dtype, kind.name


def test_f16_matmul_and_softmax_match_onnxruntime(rng: np.random.Generator) -> None:
    a = random_array(rng, (2, 3, 8), DType.F16, low=-1, high=1)
    b = random_array(rng, (2, 8, 4), DType.F16, low=-1, high=1)
    (product,) = _onnx("MatMul", [a, b])
    _close(KERNELS[ops.MatMul](ops.MatMul(), a, b), product, rtol=1e-2, atol=1e-2)
    (soft,) = _onnx("Softmax", [product], axis=-1)
    _close(KERNELS[ops.Softmax](ops.Softmax(2), product), soft, rtol=1e-2, atol=1e-3)


def test_bf16_graph_computes_in_f32_and_rounds_once(rng: np.random.Generator) -> None:
    """bf16 ops run in f32 and round to bf16; compare to onnxruntime's f32 result, rounded."""
    bf16 = DType.BF16.numpy
    b = GraphBuilder("bf16")
    x = b.input("x", (3, 8), DType.BF16)
    w = b.input("w", (8, 5), DType.BF16)
    y = b.softmax(b.unary(Unary.GELU, b.matmul(x, w)), axis=1)
    b.output(y, "y")
    xs = random_array(rng, (3, 8), F32, low=-1, high=1).astype(bf16)
    ws = random_array(rng, (8, 5), F32, low=-1, high=1).astype(bf16)
    (ours,) = run_graph(b.build(), {"x": xs, "w": ws})
    assert ours.dtype == bf16
    (product,) = _onnx("MatMul", [xs.astype(np.float32), ws.astype(np.float32)])
    (gelu,) = _onnx("Gelu", [product.astype(bf16).astype(np.float32)], opset=20)
    (soft,) = _onnx("Softmax", [gelu.astype(bf16).astype(np.float32)], axis=1)
    np.testing.assert_allclose(
        ours.astype(np.float32), soft.astype(bf16).astype(np.float32), rtol=1e-2, atol=1e-2
    )


def test_bf16_constants_keep_their_type() -> None:
    data = np.array([1.5, -2.25, 3.0], DType.BF16.numpy)
    tensor = numpy_helper.from_array(data, "c")
    assert tensor.data_type == int(DType.BF16)
    value = KERNELS[ops.Constant](ops.Constant(ops.ConstData(data)))
    assert value.dtype == DType.BF16.numpy
    assert value.tolist() == data.tolist()
