"""ONNX export: exported models run on onnxruntime exactly as the IR runs on knopt's executor."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest

import knopt
from knopt.errors import KnoptError, UnsupportedModelError
from knopt.ir import GraphBuilder, sym
from knopt.ir.dtype import DType
from knopt.ir.graph import Graph, Value
from knopt.ir.op import (
    OP_CLASSES,
    Binary,
    PadMode,
    PoolKind,
    Reduction,
    ScatterReduction,
    Sizes,
    Unary,
)
from knopt.ir.shape import Dim, Shape
from knopt.onnx.export import save_onnx
from knopt.onnx.export_elementwise import BINARY_EXPORTERS, UNARY_EXPORTERS
from knopt.onnx.export_ops import EXPORTERS
from tests.models import Fixture, fixtures
from tests.oracle import (
    assert_same,
    random_array,
    run_knopt,
    run_onnxruntime,
    run_reference,
)

F32 = DType.F32


def test_exporters_cover_every_op_class() -> None:
    assert set(EXPORTERS) == set(OP_CLASSES)


def test_exporters_cover_every_elementwise_kind() -> None:
    assert set(UNARY_EXPORTERS) == set(Unary)
    assert set(BINARY_EXPORTERS) == set(Binary)


# ---- real models ---------------------------------------------------------------------------


def _resized_feeds(fixture: Fixture) -> dict[str, np.ndarray] | None:
    """Feeds with every dynamic axis one longer than in the manifest, or None if none is."""
    specs = []
    for spec in fixture.inputs:
        shape = list(spec["shape"])
        for axis in spec.get("dynamic_axes", {}):
            shape[int(axis)] += 1
        specs.append({**spec, "shape": shape})
    if all(s["shape"] == o["shape"] for s, o in zip(specs, fixture.inputs, strict=True)):
        return None
    return Fixture(fixture.file, fixture.model, fixture.style, specs).feeds(seed=1)


@pytest.mark.parametrize("fixture", fixtures(), ids=lambda f: f.file)
def test_fixture_round_trips_through_onnxruntime(fixture: Fixture) -> None:
    exported = save_onnx(knopt.load(fixture.path))
    original = onnx.load(fixture.path)
    feeds = fixture.feeds()
    assert_same(run_onnxruntime(exported, feeds), run_onnxruntime(original, feeds))
    resized = _resized_feeds(fixture)
    if resized is not None:  # dynamic axes still work at other sizes
        assert_same(run_onnxruntime(exported, resized), run_onnxruntime(original, resized))


def test_reimported_export_runs_like_the_original() -> None:
    fixture = next(f for f in fixtures() if f.file == "gpt2_ts14.onnx")
    graph = knopt.load(fixture.path)
    again = knopt.load(save_onnx(graph).SerializeToString())
    feeds = fixture.feeds()
    assert_same(run_knopt(again, feeds), run_knopt(graph, feeds))


# ---- one op at a time ----------------------------------------------------------------------

Body = Callable[[GraphBuilder, Value], Value]


def _unary_graph(shape: Shape, dtype: DType, body: Body) -> Graph:
    b = GraphBuilder("case")
    b.output(body(b, b.input("x", shape, dtype)), "y")
    return b.build()


def _check_one_input(
    rng: np.random.Generator,
    body: Body,
    shape: tuple[int, ...] = (2, 3, 4),
    dtype: DType = F32,
    *,
    low: float = -3.0,
    high: float = 3.0,
    opset: int = 18,
) -> None:
    graph = _unary_graph(shape, dtype, body)
    feeds = {"x": random_array(rng, shape, dtype, low=low, high=high)}
    assert_same(run_onnxruntime(save_onnx(graph, opset=opset), feeds), run_knopt(graph, feeds))


_ANGLES = np.linspace(-2.0, 2.0, 12, dtype=np.float32).reshape(3, 4)  # rope's [seq, head] table
_STRUCTURAL: dict[str, Body] = {
    "view": lambda b, x: b.view(x, (6, 4)),
    "broadcast": lambda b, x: b.broadcast(b.slice(x, axis=1, start=0, stop=1), (2, 3, 4)),
    "permute": lambda b, x: b.permute(x, (2, 0, 1)),
    "slice_step": lambda b, x: b.slice(x, axis=2, start=1, stop=4, step=2),
    "flip": lambda b, x: b.flip(x, axis=1),
    "pad_constant": lambda b, x: b.pad(x, pads=((0, 0), (1, 2), (2, 0)), value=1.5),
    "pad_reflect": lambda b, x: b.pad(x, pads=((0, 0), (1, 1), (2, 3)), mode=PadMode.REFLECT),
    "pad_edge": lambda b, x: b.pad(x, pads=((1, 0), (0, 2), (3, 1)), mode=PadMode.EDGE),
    "pad_wrap": lambda b, x: b.pad(x, pads=((0, 0), (2, 1), (5, 9)), mode=PadMode.WRAP),
    "concat": lambda b, x: b.concat([x, b.unary(Unary.NEG, x), x], axis=1),
    "gather": lambda b, x: b.gather(x, b.constant(np.array([[2, -1], [0, 1]])), axis=1),
    "cast_to_int": lambda b, x: b.cast(b.mul(x, b.constant(np.float32(3))), DType.I32),
    "cast_to_bool": lambda b, x: b.cast(b.unary(Unary.ROUND, x), DType.BOOL),
    "cast_to_f16": lambda b, x: b.cast(x, DType.F16),
    "clamp": lambda b, x: b.clamp(x, lo=-0.5, hi=1.25),
    "clamp_low_only": lambda b, x: b.clamp(x, lo=0.25),
    "where": lambda b, x: b.where(
        b.binary(Binary.GREATER, x, b.constant(np.float32(0))), x, b.constant(np.float32(-2))
    ),
    "arg_max": lambda b, x: b.arg_reduce(x, axis=1),
    "arg_min_last": lambda b, x: b.arg_reduce(
        b.unary(Unary.ROUND, x), axis=2, largest=False, last=True
    ),
    "arg_sort": lambda b, x: b.arg_sort(b.unary(Unary.ROUND, x), axis=2),
    "arg_sort_descending": lambda b, x: b.arg_sort(
        b.unary(Unary.ROUND, x), axis=1, descending=True
    ),
    "matmul": lambda b, x: b.matmul(x, b.permute(x, (0, 2, 1))),
    "softmax": lambda b, x: b.softmax(x, axis=1),
    "layer_norm": lambda b, x: b.layer_norm(x, axis=1, eps=1e-5),
    "rms_norm": lambda b, x: b.rms_norm(x, axis=2, eps=1e-6),
    "rope": lambda b, x: b.rope(x, b.constant(np.cos(_ANGLES)), b.constant(np.sin(_ANGLES))),
    "iota": lambda b, x: b.add(x, b.cast(b.iota(4, DType.I32), F32)),
    "iota_u8": lambda b, x: b.add(x, b.cast(b.iota(4, DType.U8), F32)),
    "sizes": lambda b, x: b.apply(_sizes_op((2, 7), DType.I32)),
}


def _reduce(kind: Reduction) -> Body:
    return lambda b, x: b.reduce(kind, x, axes=(0, 2))


def _cumsum(exclusive: bool, reverse: bool) -> Body:
    return lambda b, x: b.cumsum(x, axis=2, exclusive=exclusive, reverse=reverse)


for _kind in Reduction:
    _STRUCTURAL[f"reduce_{_kind.name.lower()}"] = _reduce(_kind)
for _exclusive in (False, True):
    for _reverse in (False, True):
        _STRUCTURAL[f"cumsum_exclusive{_exclusive:d}_reverse{_reverse:d}"] = _cumsum(
            _exclusive, _reverse
        )


def _sizes_op(dims: tuple[Dim, ...], dtype: DType) -> Sizes:
    return Sizes(dims, dtype)


@pytest.mark.parametrize("name", sorted(_STRUCTURAL))
def test_op_exports_and_matches_knopt(rng: np.random.Generator, name: str) -> None:
    _check_one_input(rng, _STRUCTURAL[name])


@pytest.mark.parametrize("opset", [19, 20, 23])
@pytest.mark.parametrize("name", ["pad_wrap", "rms_norm", "layer_norm"])
def test_op_exports_at_newer_opsets(rng: np.random.Generator, name: str, opset: int) -> None:
    _check_one_input(rng, _STRUCTURAL[name], opset=opset)


_UNARY_DOMAINS: dict[Unary, tuple[float, float]] = {
    Unary.LOG: (0.1, 4.0),
    Unary.SQRT: (0.1, 4.0),
    Unary.RSQRT: (0.1, 4.0),
    Unary.ASIN: (-0.9, 0.9),
    Unary.ACOS: (-0.9, 0.9),
    Unary.ATANH: (-0.9, 0.9),
    Unary.ACOSH: (1.1, 4.0),
    Unary.TAN: (-1.2, 1.2),
}
_NOT_FLOAT = {Unary.NOT: DType.BOOL, Unary.BITWISE_NOT: DType.I32}


@pytest.mark.parametrize("opset", [18, 20])
@pytest.mark.parametrize("kind", list(Unary), ids=lambda k: k.name)
def test_unary_kind_exports_and_matches_knopt(
    rng: np.random.Generator, kind: Unary, opset: int
) -> None:
    low, high = _UNARY_DOMAINS.get(kind, (-3.0, 3.0))
    dtype = _NOT_FLOAT.get(kind, F32)
    _check_one_input(
        rng, lambda b, x: b.unary(kind, x), dtype=dtype, low=low, high=high, opset=opset
    )


def test_is_nan_and_is_inf_find_them() -> None:
    graph = _unary_graph(
        (4,),
        F32,
        lambda b, x: b.binary(Binary.OR, b.unary(Unary.IS_NAN, x), b.unary(Unary.IS_INF, x)),
    )
    feeds = {"x": np.array([1.0, np.nan, -np.inf, 2.0], np.float32)}
    (ours,) = run_knopt(graph, feeds)
    assert ours.tolist() == [False, True, True, False]
    assert_same(run_onnxruntime(save_onnx(graph), feeds), [ours])


_BINARY_DTYPES: dict[Binary, list[DType]] = {
    Binary.DIV: [F32, DType.I32, DType.I64],
    Binary.MOD: [F32, DType.I32, DType.I64],
    Binary.FMOD: [F32, DType.I32],
    Binary.POW: [F32],
    Binary.AND: [DType.BOOL],
    Binary.OR: [DType.BOOL],
    Binary.XOR: [DType.BOOL],
    Binary.BITWISE_AND: [DType.I32],
    Binary.BITWISE_OR: [DType.I32],
    Binary.BITWISE_XOR: [DType.I32],
    Binary.SHIFT_LEFT: [DType.U8, DType.I32],
    Binary.SHIFT_RIGHT: [DType.U32, DType.I32, DType.I64],
}
_BINARY_CASES = [
    (kind, dtype) for kind in Binary for dtype in _BINARY_DTYPES.get(kind, [F32, DType.I64])
]


@pytest.mark.parametrize(
    ("kind", "dtype"), _BINARY_CASES, ids=[f"{k.name}-{d.short}" for k, d in _BINARY_CASES]
)
def test_binary_kind_exports_and_matches_knopt(
    rng: np.random.Generator, kind: Binary, dtype: DType
) -> None:
    b = GraphBuilder("case")
    x = b.input("x", (3, 4), dtype)
    y = b.input("y", (1, 4), dtype)
    b.output(b.binary(kind, x, y), "z")
    graph = b.build()
    if kind in (Binary.SHIFT_LEFT, Binary.SHIFT_RIGHT):
        feeds = {
            "x": random_array(rng, (3, 4), dtype, low=-100, high=100),
            "y": rng.integers(0, 4, (1, 4)).astype(dtype.numpy),
        }
    elif kind is Binary.POW:
        feeds = {
            "x": random_array(rng, (3, 4), dtype, low=0.1, high=3.0),
            "y": random_array(rng, (1, 4), dtype),
        }
    else:
        feeds = {
            "x": random_array(rng, (3, 4), dtype, low=-20, high=20),
            "y": random_array(rng, (1, 4), dtype, low=-6, high=6),
        }
    assert_same(run_onnxruntime(save_onnx(graph), feeds), run_knopt(graph, feeds))


def test_integer_division_truncates_and_mod_follows_divisor() -> None:
    b = GraphBuilder("case")
    x = b.input("x", (4,), DType.I32)
    y = b.input("y", (4,), DType.I32)
    b.output(b.binary(Binary.DIV, x, y), "quotient")
    b.output(b.binary(Binary.MOD, x, y), "mod")
    b.output(b.binary(Binary.FMOD, x, y), "fmod")
    graph = b.build()
    feeds = {"x": np.array([7, -7, 7, -7], np.int32), "y": np.array([2, 2, -2, -2], np.int32)}
    ours = run_knopt(graph, feeds)
    assert [a.tolist() for a in ours] == [[3, -3, -3, 3], [1, 1, -1, -1], [1, -1, 1, -1]]
    assert_same(run_onnxruntime(save_onnx(graph), feeds), ours)


def test_scatter_reductions_export(rng: np.random.Generator) -> None:
    b = GraphBuilder("case")
    data = b.input("data", (3, 5), F32)
    updates = b.input("updates", (3, 2), F32)
    indices = b.constant(np.array([[0, 4], [-1, 2], [3, 1]]))
    for reduction in ScatterReduction:
        out = b.scatter(data, indices, updates, axis=1, reduction=reduction)
        b.output(out, reduction.name.lower())
    graph = b.build()
    feeds = {"data": random_array(rng, (3, 5), F32), "updates": random_array(rng, (3, 2), F32)}
    assert_same(run_onnxruntime(save_onnx(graph), feeds), run_knopt(graph, feeds))


# (strides, pads, dilations, groups) of the float and the integer convolution exports.
CONV_CASES = [
    ((1, 1), ((0, 0), (0, 0)), (1, 1), 1),
    ((2, 1), ((1, 2), (0, 1)), (1, 2), 2),
    ((1, 2), ((2, 2), (1, 1)), (2, 1), 4),
]


@pytest.mark.parametrize(("strides", "pads", "dilations", "groups"), CONV_CASES)
def test_conv_exports(
    rng: np.random.Generator,
    strides: tuple[int, int],
    pads: tuple[tuple[int, int], ...],
    dilations: tuple[int, int],
    groups: int,
) -> None:
    b = GraphBuilder("case")
    x = b.input("x", (2, 4, 9, 8), F32)
    w = b.constant(random_array(rng, (8, 4 // groups, 3, 2), F32))
    b.output(b.conv(x, w, strides=strides, pads=pads, dilations=dilations, groups=groups), "y")
    graph = b.build()
    feeds = {"x": random_array(rng, (2, 4, 9, 8), F32)}
    assert_same(run_onnxruntime(save_onnx(graph), feeds), run_knopt(graph, feeds))


@pytest.mark.parametrize(("strides", "pads", "dilations", "groups"), CONV_CASES)
def test_integer_conv_exports(
    rng: np.random.Generator,
    strides: tuple[int, int],
    pads: tuple[tuple[int, int], ...],
    dilations: tuple[int, int],
    groups: int,
) -> None:
    # QLinearConv and ConvInteger import as an int32 conv of centered operands, which ONNX's
    # Conv does not take: it exports as im2col with integer MatMuls, exactly.
    i32 = DType.I32
    b = GraphBuilder("case")
    x = b.input("x", (sym("batch"), 4, 9, 8), i32)
    w = b.constant(random_array(rng, (8, 4 // groups, 3, 2), i32, low=-255, high=255))
    b.output(b.conv(x, w, strides=strides, pads=pads, dilations=dilations, groups=groups), "y")
    graph = b.build()
    for batch in (1, 3):
        feeds = {"x": random_array(rng, (batch, 4, 9, 8), i32, low=-255, high=255)}
        (expected,) = run_knopt(graph, feeds)
        (ours,) = run_onnxruntime(save_onnx(graph), feeds)
        np.testing.assert_array_equal(ours, expected)


def test_bfloat16_conv_pool_and_hard_swish_export_at_opset_18(rng: np.random.Generator) -> None:
    # ONNX allows bfloat16 in Conv, MaxPool and HardSwish only from opset 22 (a torch
    # `.bfloat16()` CNN): at opset 18 they compute in float32 between Casts, as knopt's executor.
    bf16 = DType.BF16
    b = GraphBuilder("case")
    x = b.input("x", (sym("batch"), 3, 8, 8), bf16)
    w = b.constant(random_array(rng, (4, 3, 3, 3), bf16))
    y = b.conv(x, w, strides=(1, 1), pads=((1, 1), (1, 1)), dilations=(1, 1))
    y = b.unary(Unary.HARD_SWISH, y)
    pooled = b.pool(
        PoolKind.MAX,
        y,
        kernel=(2, 2),
        strides=(2, 2),
        pads=((0, 0), (0, 0)),
        dilations=(1, 1),
        ceil_mode=False,
        count_include_pad=False,
    )
    b.output(b.add(pooled, pooled), "y")
    graph = b.build()
    model = save_onnx(graph)
    onnx.checker.check_model(model, full_check=True)
    assert {n.op_type for n in model.graph.node} >= {"Cast", "Conv", "MaxPool", "HardSwish"}
    for batch in (1, 2):
        feeds = {"x": random_array(rng, (batch, 3, 8, 8), bf16)}
        (expected,) = run_knopt(graph, feeds)
        (ours,) = run_reference(model, feeds)
        assert ours.dtype == expected.dtype
        np.testing.assert_array_equal(ours.astype(np.float32), expected.astype(np.float32))


@pytest.mark.parametrize("kind", list(PoolKind), ids=lambda k: k.name)
@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("count_include_pad", [False, True])
def test_pool_exports(
    rng: np.random.Generator, kind: PoolKind, ceil_mode: bool, count_include_pad: bool
) -> None:
    def body(b: GraphBuilder, x: Value) -> Value:
        return b.pool(
            kind,
            x,
            kernel=(3, 2),
            strides=(2, 2),
            pads=((1, 1), (0, 1)),
            dilations=(1, 1),
            ceil_mode=ceil_mode,
            count_include_pad=count_include_pad,
        )

    _check_one_input(rng, body, shape=(1, 2, 8, 7))


def test_dilated_average_pool_needs_opset_19(rng: np.random.Generator) -> None:
    graph = _unary_graph(
        (1, 1, 7, 7),
        F32,
        lambda b, x: b.pool(
            PoolKind.AVG, x, kernel=(2, 2), strides=(1, 1), pads=((0, 0), (0, 0)), dilations=(2, 2)
        ),
    )
    with pytest.raises(UnsupportedModelError, match="opset=19"):
        save_onnx(graph)
    feeds = {"x": random_array(rng, (1, 1, 7, 7), F32)}
    assert_same(run_onnxruntime(save_onnx(graph, opset=19), feeds), run_knopt(graph, feeds))


def test_attention_exports(rng: np.random.Generator) -> None:
    from knopt.ir.op import Attention

    b = GraphBuilder("case")
    q, k, v = (b.input(name, (2, 3, 5, 4), F32) for name in "qkv")
    bias = b.constant(np.triu(np.full((2, 3, 5, 5), -1e9, np.float32), k=1))
    b.output(b.apply(Attention(0.5), [q, k, v, bias]), "y")
    graph = b.build()
    feeds = {name: random_array(rng, (2, 3, 5, 4), F32) for name in "qkv"}
    assert_same(run_onnxruntime(save_onnx(graph), feeds), run_knopt(graph, feeds))


# ---- symbolic sizes ------------------------------------------------------------------------


def _symbolic_graph() -> Graph:
    batch, seq = sym("batch"), sym("seq")
    b = GraphBuilder("symbolic")
    x = b.input("x", (batch, seq, 4), F32)
    flat = b.view(x, (batch * seq * 2, 2))
    b.output(b.view(b.unary(Unary.NEG, flat), (batch, seq, 4)), "viewed")
    b.output(b.broadcast(b.slice(x, axis=0, start=0, stop=1), (batch, seq, 4)), "broadcast")
    b.output(b.slice(x, axis=1, start=1, stop=seq), "sliced")
    positions = b.cast(b.view(b.iota(seq), (1, seq, 1)), F32)
    b.output(b.add(x, positions), "positioned")
    b.output(b.apply(_sizes_op((batch, seq * 2 + 1), DType.I64)), "sizes")
    b.output(b.layer_norm(x, axis=1, eps=1e-5), "normalized")
    b.output(b.arg_sort(x, axis=1), "sorted")
    b.output(b.pad(x, pads=((0, 0), (1, 2), (0, 0)), mode=PadMode.WRAP), "wrapped")
    return b.build()


@pytest.mark.parametrize("sizes", [(2, 3), (3, 5)])
def test_symbolic_sizes_stay_dynamic(rng: np.random.Generator, sizes: tuple[int, int]) -> None:
    graph = _symbolic_graph()
    model = save_onnx(graph, opset=19)
    feeds = {"x": random_array(rng, (*sizes, 4), F32)}
    assert_same(run_onnxruntime(model, feeds), run_knopt(graph, feeds))


def test_symbolic_sizes_become_dim_params() -> None:
    model = save_onnx(_symbolic_graph(), opset=19)
    (x,) = model.graph.input
    assert [d.dim_param or d.dim_value for d in x.type.tensor_type.shape.dim] == ["batch", "seq", 4]
    outputs = {o.name: o for o in model.graph.output}
    sliced = outputs["sliced"].type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in sliced] == ["batch", str(sym("seq") - 1), 4]


def test_wrap_pad_of_symbolic_axis_needs_opset_19() -> None:
    with pytest.raises(UnsupportedModelError, match="opset=19"):
        save_onnx(_symbolic_graph(), opset=18)


def test_reshape_infers_the_one_size_no_input_carries(rng: np.random.Generator) -> None:
    b = GraphBuilder("case")
    x = b.input("x", (2 * sym("n"),), F32)
    b.output(b.view(x, (sym("n"), 2)), "y")
    graph = b.build()
    model = save_onnx(graph)
    assert [n.op_type for n in model.graph.node] == ["Reshape"]
    x_value = random_array(rng, (6,), F32)
    (y_value,) = run_onnxruntime(model, {"x": x_value})
    np.testing.assert_array_equal(y_value, x_value.reshape(3, 2))


def test_size_that_no_input_carries_cannot_export() -> None:
    b = GraphBuilder("case")
    x = b.input("x", (2 * sym("n"),), F32)
    positions = b.cast(b.iota(sym("n")), F32)
    b.output(b.add(b.view(x, (sym("n"), 2)), b.view(positions, (sym("n"), 1))), "y")
    with pytest.raises(UnsupportedModelError, match="'n'"):
        save_onnx(b.build())


# ---- model structure -----------------------------------------------------------------------


def test_nodes_carry_ir_node_names() -> None:
    b = GraphBuilder("case")
    x = b.input("x", (2, 3), F32)
    b.current_name = "/block/gelu"
    y = b.unary(Unary.GELU, x)
    b.current_name = "/block/act"
    b.output(b.unary(Unary.RELU, y), "y")
    names = [n.name for n in save_onnx(b.build()).graph.node]
    assert "/block/act" in names
    assert "/block/gelu" in names
    assert sum(n.startswith("/block/gelu") for n in names) > 1
    assert len(set(names)) == len(names)


def test_constants_are_initializers_at_their_smallest_broadcasting_shape() -> None:
    b = GraphBuilder("case")
    x = b.input("x", (4, 8), F32)
    y = b.add(x, b.constant(np.arange(32, dtype=np.float32).reshape(4, 8) + 1))
    rows = b.constant(np.broadcast_to(np.arange(8, dtype=np.float32), (4, 8)).copy())
    b.output(b.mul(b.sub(y, rows), b.constant(np.full((4, 8), 2, np.float32))), "y")
    model = save_onnx(b.build())
    assert [n.op_type for n in model.graph.node] == ["Add", "Sub", "Mul"]
    assert sorted(tuple(t.dims) for t in model.graph.initializer) == [(), (4, 8), (8,)]


def test_outputs_that_are_inputs_or_repeated_values_get_their_names(
    rng: np.random.Generator,
) -> None:
    b = GraphBuilder("case")
    x = b.input("x", (2, 3), F32)
    y = b.unary(Unary.EXP, x)
    b.output(y, "first")
    b.output(y, "second")
    b.output(x, "echo")
    b.output(b.constant(np.float32(1.5)), "constant")
    graph = b.build()
    model = save_onnx(graph)
    assert [o.name for o in model.graph.output] == ["first", "second", "echo", "constant"]
    feeds = {"x": random_array(rng, (2, 3), F32)}
    assert_same(run_onnxruntime(model, feeds), run_knopt(graph, feeds))


def test_save_writes_a_file_knopt_loads_again(tmp_path: Path, rng: np.random.Generator) -> None:
    graph = _unary_graph((2, 3), F32, lambda b, x: b.unary(Unary.TANH, x))
    path = tmp_path / "model.onnx"
    knopt.save(graph, path)
    feeds = {"x": random_array(rng, (2, 3), F32)}
    assert_same(run_knopt(knopt.load(path), feeds), run_knopt(graph, feeds))


@pytest.mark.parametrize("opset", [17, onnx.defs.onnx_opset_version() + 1])
def test_unknown_opsets_are_refused(opset: int) -> None:
    graph = _unary_graph((2,), F32, lambda b, x: b.unary(Unary.EXP, x))
    with pytest.raises(UnsupportedModelError, match=f"opset {opset}"):
        save_onnx(graph, opset=opset)


def test_unwritable_path_is_a_knopt_error(tmp_path: Path) -> None:
    graph = _unary_graph((2,), F32, lambda b, x: b.unary(Unary.EXP, x))
    with pytest.raises(KnoptError, match="cannot write"):
        save_onnx(graph, tmp_path / "missing" / "model.onnx")


@pytest.mark.parametrize(
    "dtype",
    [DType.BOOL, DType.I16, DType.U16, DType.U64],
    ids=lambda d: d.name,
)
def test_where_exports_for_types_onnxruntime_lacks(rng: np.random.Generator, dtype: DType) -> None:
    # A causal bool mask (torch.triu of a bool tensor) imports as Where on bool data.
    b = GraphBuilder("case")
    condition = b.input("condition", (3, 4), DType.BOOL)
    x = b.input("x", (3, 4), dtype)
    y = b.input("y", (3, 4), dtype)
    b.output(b.where(condition, x, y), "out")
    graph = b.build()
    feeds = {
        "condition": rng.integers(0, 2, (3, 4)).astype(bool),
        "x": random_array(rng, (3, 4), dtype),
        "y": random_array(rng, (3, 4), dtype),
    }
    if dtype is DType.U64:  # values past int64's range keep their bits through the int64 carrier
        feeds["x"] = feeds["x"] + np.uint64(2**63)
    assert_same(run_onnxruntime(save_onnx(graph), feeds), run_knopt(graph, feeds))


@pytest.mark.parametrize("dtype", [DType.I64, DType.I32, DType.U8], ids=lambda d: d.name)
def test_integer_clamp_with_one_open_side_exports(rng: np.random.Generator, dtype: DType) -> None:
    # tensor.clamp(min=0) on indices: the open side must not wrap to the type's other end.
    b = GraphBuilder("case")
    x = b.input("x", (6,), dtype)
    b.output(b.clamp(x, lo=1.0), "low")
    b.output(b.clamp(x, hi=3.5), "high")
    graph = b.build()
    feeds = {"x": np.array([0, 1, 2, 3, 4, 100], dtype.numpy)}
    ours = run_knopt(graph, feeds)
    assert ours[0].tolist() == [1, 1, 2, 3, 4, 100]
    assert ours[1].tolist() == [0, 1, 2, 3, 3, 3]
    assert_same(run_onnxruntime(save_onnx(graph), feeds), ours)
