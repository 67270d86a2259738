"""Every IR op class runs on the GPU and matches the CPU executor (unfused programs)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from knopt.ir import GraphBuilder
from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.op import Binary, PadMode, PoolKind, Reduction, ScatterReduction, Unary
from tests.cuda.programs import compare_graph, random_array

pytestmark = pytest.mark.cuda

Build = Callable[[GraphBuilder, np.random.Generator, dict[str, np.ndarray]], None]


def _run(build: Build, rng: np.random.Generator, **kwargs: object) -> None:
    g = GraphBuilder("t")
    feeds: dict[str, np.ndarray] = {}
    build(g, rng, feeds)
    compare_graph(g.build(), feeds, **kwargs)


def _input(
    g: GraphBuilder,
    feeds: dict[str, np.ndarray],
    rng: np.random.Generator,
    shape: tuple[int, ...],
    dtype: DType = DType.F32,
    *,
    positive: bool = False,
):
    name = f"x{len(feeds)}"
    array = random_array(rng, shape, dtype)
    if positive and dtype.is_float:
        array = np.abs(array) + np.asarray(0.1, array.dtype)
    feeds[name] = array
    return g.input(name, shape, dtype)


_POSITIVE = {Unary.LOG, Unary.SQRT, Unary.RSQRT, Unary.ACOSH}
_UNIT = {Unary.ASIN, Unary.ACOS, Unary.ATANH}


def test_every_unary_kind_on_floats(rng: np.random.Generator) -> None:
    def build(g: GraphBuilder, rng: np.random.Generator, feeds: dict) -> None:
        for kind in Unary:
            if kind in (Unary.NOT, Unary.BITWISE_NOT):
                continue
            x = _input(g, feeds, rng, (3, 37), positive=kind in _POSITIVE)
            if kind in _UNIT:
                x = g.clamp(x, lo=-0.9, hi=0.9)
            if kind is Unary.ACOSH:
                x = g.add(x, g.scalar(1.0, DType.F32))
            g.output(g.unary(kind, x), kind.name)

    _run(build, rng)


def test_integer_and_bool_unary_kinds(rng: np.random.Generator) -> None:
    def build(g: GraphBuilder, rng: np.random.Generator, feeds: dict) -> None:
        for dtype in (DType.I32, DType.I64, DType.I8):
            x = _input(g, feeds, rng, (5, 9), dtype)
            for kind in (
                Unary.NEG,
                Unary.ABS,
                Unary.SIGN,
                Unary.RELU,
                Unary.BITWISE_NOT,
                Unary.RECIPROCAL,
            ):
                g.output(g.unary(kind, x), f"{kind.name}_{dtype.short}")
        b = _input(g, feeds, rng, (4, 4), DType.BOOL)
        g.output(g.unary(Unary.NOT, b), "not")

    _run(build, rng)


def test_every_binary_kind(rng: np.random.Generator) -> None:
    def build(g: GraphBuilder, rng: np.random.Generator, feeds: dict) -> None:
        a, b = _input(g, feeds, rng, (4, 33)), _input(g, feeds, rng, (4, 33))
        ia, ib = (
            _input(g, feeds, rng, (4, 33), DType.I64),
            _input(g, feeds, rng, (4, 33), DType.I64),
        )
        ua = _input(g, feeds, rng, (4, 33), DType.U8)
        ub = g.clamp(_input(g, feeds, rng, (4, 33), DType.U8), lo=0, hi=7)
        pa, pb = (
            _input(g, feeds, rng, (4, 33), DType.BOOL),
            _input(g, feeds, rng, (4, 33), DType.BOOL),
        )
        for kind in Binary:
            if kind in (Binary.AND, Binary.OR, Binary.XOR):
                g.output(g.binary(kind, pa, pb), kind.name)
            elif kind in (
                Binary.BITWISE_AND,
                Binary.BITWISE_OR,
                Binary.BITWISE_XOR,
                Binary.SHIFT_LEFT,
                Binary.SHIFT_RIGHT,
            ):
                g.output(g.binary(kind, ua, ub), kind.name)
            else:
                if kind is Binary.POW:
                    g.output(g.binary(kind, g.unary(Unary.ABS, a), b), kind.name)
                else:
                    g.output(g.binary(kind, a, b), kind.name)
                if kind is not Binary.POW:
                    g.output(g.binary(kind, ia, ib), f"{kind.name}_int")

    _run(build, rng)


def test_cast_clamp_where_iota_sizes(rng: np.random.Generator) -> None:
    def build(g: GraphBuilder, rng: np.random.Generator, feeds: dict) -> None:
        x = _input(g, feeds, rng, (6, 10))
        for target in (
            DType.F16,
            DType.BF16,
            DType.I32,
            DType.I64,
            DType.U8,
            DType.BOOL,
            DType.F64,
        ):
            g.output(g.cast(x, target), f"cast_{target.short}")
        i = _input(g, feeds, rng, (6, 10), DType.I64)
        g.output(g.cast(i, DType.F32), "i2f")
        g.output(g.clamp(x, lo=-1.0, hi=0.5), "clamp")
        g.output(g.clamp(i, lo=-2.5, hi=3.5), "clamp_int")
        c = _input(g, feeds, rng, (6, 10), DType.BOOL)
        g.output(g.where(c, x, g.scalar(7.0, DType.F32)), "where")
        g.output(g.iota(17, DType.I64), "iota")
        g.output(g.iota(9, DType.F32), "iota_f")
        g.output(g.apply(ops.Sizes((3, 4, 5))), "sizes")

    _run(build, rng)


def test_views_pad_concat_gather_scatter(rng: np.random.Generator) -> None:
    def build(g: GraphBuilder, rng: np.random.Generator, feeds: dict) -> None:
        x = _input(g, feeds, rng, (4, 6, 5))
        t = g.permute(x, (2, 0, 1))
        g.output(g.view(t, (5, 24)), "permute_view")  # a reshape of a permuted tensor copies
        g.output(g.flip(g.slice(x, axis=1, start=1, stop=6, step=2), axis=2), "slice_flip")
        g.output(g.broadcast(g.slice(x, axis=0, start=1, stop=2), (3, 6, 5)), "broadcast")
        for mode in PadMode:
            g.output(
                g.pad(x, pads=((1, 2), (0, 3), (2, 1)), mode=mode, value=1.5), f"pad_{mode.name}"
            )
        y = _input(g, feeds, rng, (4, 2, 5))
        g.output(g.concat([x, y, g.permute(g.permute(y, (1, 0, 2)), (1, 0, 2))], axis=1), "concat")
        idx = g.constant(np.array([[0, -1, 2], [3, 1, -4]], np.int64))
        g.output(g.gather(x, idx, axis=1), "gather")
        g.output(g.gather(x, g.constant(np.array(2, np.int64)), axis=0), "gather_scalar")
        indices = g.constant(
            np.stack([rng.permutation(6)[:4] for _ in range(4 * 5)])
            .reshape(4, 5, 4)
            .transpose(0, 2, 1)
            .astype(np.int64)
        )
        updates = _input(g, feeds, rng, (4, 4, 5))
        for reduction in ScatterReduction:
            g.output(
                g.apply(ops.Scatter(1, reduction), [x, indices, updates]),
                f"scatter_{reduction.name}",
            )

    _run(build, rng)


def test_reductions_scans_and_sorts(rng: np.random.Generator) -> None:
    def build(g: GraphBuilder, rng: np.random.Generator, feeds: dict) -> None:
        x = _input(g, feeds, rng, (3, 40, 7))
        i = _input(g, feeds, rng, (3, 40, 7), DType.I32)
        for kind in Reduction:
            for axes in ((0,), (1,), (2,), (0, 2), (1, 2), (0, 1, 2)):
                source = g.clamp(x, lo=0.9, hi=1.1) if kind is Reduction.PROD else x
                g.output(g.reduce(kind, source, axes=axes), f"{kind.name}_{axes}")
            g.output(g.reduce(kind, i, axes=(1,)), f"{kind.name}_int")
        wide = _input(g, feeds, rng, (2, 5000))
        g.output(g.reduce(Reduction.SUM, wide, axes=(1,)), "wide_sum")
        g.output(g.reduce(Reduction.MAX, wide, axes=(0, 1)), "all_max")
        for axis in (0, 1, 2):
            for largest in (True, False):
                for last in (True, False):
                    g.output(
                        g.arg_reduce(i, axis=axis, largest=largest, last=last),
                        f"arg_{axis}_{largest}_{last}",
                    )
            for descending in (True, False):
                g.output(
                    g.arg_sort(i, axis=axis, descending=descending), f"sort_{axis}_{descending}"
                )
            for exclusive in (True, False):
                for reverse in (True, False):
                    g.output(
                        g.cumsum(x, axis=axis, exclusive=exclusive, reverse=reverse),
                        f"cumsum_{axis}_{exclusive}_{reverse}",
                    )
        g.output(g.arg_sort(x, axis=1), "sort_float")

    _run(build, rng, rtol=1e-4, atol=1e-4)


def test_softmax_and_norms(rng: np.random.Generator) -> None:
    def build(g: GraphBuilder, rng: np.random.Generator, feeds: dict) -> None:
        for shape in ((4, 7, 33), (2, 3, 1000), (2, 70000)):
            x = _input(g, feeds, rng, shape)
            for axis in range(len(shape)):
                g.output(g.softmax(x, axis=axis), f"softmax_{shape}_{axis}")
            g.output(g.layer_norm(x, axis=len(shape) - 1, eps=1e-5), f"ln_{shape}")
            g.output(g.rms_norm(x, axis=len(shape) - 1, eps=1e-6), f"rms_{shape}")
            g.output(g.layer_norm(x, axis=1, eps=1e-5), f"ln1_{shape}")

    _run(build, rng)


def test_matmul(rng: np.random.Generator) -> None:
    def build(g: GraphBuilder, rng: np.random.Generator, feeds: dict) -> None:
        a = _input(g, feeds, rng, (3, 17, 40))
        b = _input(g, feeds, rng, (3, 40, 9))
        g.output(g.matmul(a, b), "batched")
        w = _input(g, feeds, rng, (40, 24))
        g.output(g.matmul(a, g.broadcast(g.view(w, (1, 40, 24)), (3, 40, 24))), "shared")
        g.output(g.matmul(g.permute(b, (0, 2, 1)), g.permute(a, (0, 2, 1))), "transposed")
        g.output(g.matmul(a, g.permute(g.permute(b, (1, 0, 2)), (1, 0, 2))), "strided_batch")
        ia = _input(g, feeds, rng, (5, 7), DType.I64)
        ib = _input(g, feeds, rng, (7, 3), DType.I64)
        g.output(g.matmul(ia, ib), "int")
        h = g.cast(_input(g, feeds, rng, (64, 32)), DType.F16)
        k = g.cast(_input(g, feeds, rng, (32, 16)), DType.F16)
        g.output(g.cast(g.matmul(h, k), DType.F32), "half")
        d = g.cast(_input(g, feeds, rng, (8, 8)), DType.F64)
        g.output(g.matmul(d, d), "double")

    _run(build, rng, rtol=1e-4, atol=1e-3)


def test_conv_and_pool(rng: np.random.Generator) -> None:
    def build(g: GraphBuilder, rng: np.random.Generator, feeds: dict) -> None:
        x = _input(g, feeds, rng, (2, 8, 13, 11))
        w = _input(g, feeds, rng, (16, 4, 3, 3))
        g.output(
            g.conv(x, w, strides=(2, 1), pads=((1, 0), (2, 1)), dilations=(1, 2), groups=2),
            "conv2d",
        )
        dw = _input(g, feeds, rng, (8, 1, 3, 3))
        g.output(
            g.conv(x, dw, strides=(1, 1), pads=((1, 1), (1, 1)), dilations=(1, 1), groups=8),
            "depthwise",
        )
        x1 = _input(g, feeds, rng, (2, 3, 20))
        w1 = _input(g, feeds, rng, (5, 3, 4))
        g.output(g.conv(x1, w1, strides=(2,), pads=((1, 2),), dilations=(1,)), "conv1d")
        x3 = _input(g, feeds, rng, (1, 2, 5, 6, 7))
        w3 = _input(g, feeds, rng, (3, 2, 2, 3, 2))
        g.output(
            g.conv(x3, w3, strides=(1, 2, 1), pads=((0, 1), (1, 1), (0, 0)), dilations=(1, 1, 2)),
            "conv3d",
        )
        xi = _input(g, feeds, rng, (1, 2, 6, 6), DType.I32)
        wi = _input(g, feeds, rng, (3, 2, 3, 3), DType.I32)
        g.output(
            g.conv(xi, wi, strides=(1, 1), pads=((1, 1), (1, 1)), dilations=(1, 1)), "conv_int"
        )
        for kind in PoolKind:
            for ceil in (False, True):
                for count_pad in (False, True):
                    g.output(
                        g.pool(
                            kind,
                            x,
                            kernel=(3, 2),
                            strides=(2, 2),
                            pads=((1, 1), (0, 1)),
                            dilations=(1, 1),
                            ceil_mode=ceil,
                            count_include_pad=count_pad,
                        ),
                        f"pool_{kind.name}_{ceil}_{count_pad}",
                    )

    _run(build, rng, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [DType.F32, DType.F16])
@pytest.mark.parametrize("head", [16, 64, 80, 128, 256, 300])
def test_attention(rng: np.random.Generator, dtype: DType, head: int) -> None:
    def build(g: GraphBuilder, rng: np.random.Generator, feeds: dict) -> None:
        q = g.cast(_input(g, feeds, rng, (2, 3, 70, head)), dtype)
        k = g.cast(_input(g, feeds, rng, (2, 3, 45, head)), dtype)
        v = g.cast(_input(g, feeds, rng, (2, 3, 45, 24 if head == 80 else head)), dtype)
        mask = np.where(rng.random((2, 1, 1, 45)) < 0.2, -1e9, 0.0).astype(np.float32)
        bias = g.cast(g.broadcast(g.constant(mask), (2, 3, 70, 45)), dtype)
        out = g.apply(ops.Attention(1.0 / np.sqrt(head)), [q, k, v, bias])
        g.output(g.cast(out, DType.F32), "attention")

    tolerance = {"rtol": 1e-4, "atol": 1e-5} if dtype is DType.F32 else {"rtol": 2e-2, "atol": 2e-2}
    _run(build, rng, **tolerance)
