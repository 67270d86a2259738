"""Single ops as the writer spells them: broadcasts implicit, reshapes without shape arithmetic.

Each case exports a small IR graph, checks the ONNX ops of the file, and runs it on onnxruntime
(as written and optimized) with the results of knopt's CPU executor.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest

from knopt.ir import GraphBuilder
from knopt.ir.dtype import DType
from knopt.ir.op import OP_CLASSES, Binary, Unary
from knopt.onnx.export_layout import HANDLERS
from tests.onnx.test_export_fused import (
    BATCH,
    SEQ,
    check,
    constant,
    feeds_for,
    graph_of,
    ops_of,
)

F32 = DType.F32


def test_handlers_cover_every_op_class() -> None:
    assert set(HANDLERS) == set(OP_CLASSES)


@pytest.mark.parametrize(
    ("lo", "hi", "op_type"), [(0.0, np.inf, "Relu"), (0.0, 6.0, "Clip"), (-1.0, 1.0, "Clip")]
)
def test_relu_stays_relu(rng: np.random.Generator, lo: float, hi: float, op_type: str) -> None:
    def build(b: GraphBuilder) -> None:
        b.output(b.clamp(b.input("x", (2, 7), F32), lo=lo, hi=hi), "y")

    graph = graph_of(build)
    assert ops_of(check(graph, feeds_for(graph, rng, {}))) == Counter({op_type: 1})


def test_matmul_reads_weights_without_expanding_them(rng: np.random.Generator) -> None:
    def build(b: GraphBuilder) -> None:
        x = b.input("x", (BATCH, SEQ, 8), F32)
        weights = b.broadcast(constant(b, rng, (8, 4)), (BATCH, 8, 4))
        b.output(b.matmul(x, weights), "y")

    graph = graph_of(build)
    model = check(graph, feeds_for(graph, rng, {"batch": 2, "seq": 3}))
    assert ops_of(model) == Counter({"MatMul": 1})
    assert [list(t.dims) for t in model.graph.initializer] == [[8, 4]]


def test_broadcasts_stay_implicit(rng: np.random.Generator) -> None:
    def build(b: GraphBuilder) -> None:
        x = b.input("x", (BATCH, SEQ, 8), F32)
        mask = b.input("mask", (BATCH, 1, SEQ), F32)
        y = b.mul(b.add(x, constant(b, rng, (8,))), b.constant(np.float32(0.5)))
        b.output(b.add(y, b.permute(mask, (0, 2, 1))), "y")

    graph = graph_of(build)
    model = check(graph, feeds_for(graph, rng, {"batch": 2, "seq": 3}))
    assert "Expand" not in ops_of(model)
    assert ops_of(model) == Counter({"Add": 2, "Mul": 1, "Transpose": 1})


def test_symbolic_views_are_one_reshape_with_constant_sizes(rng: np.random.Generator) -> None:
    def build(b: GraphBuilder) -> None:
        x = b.input("x", (BATCH, SEQ, 8), F32)
        heads = b.permute(b.view(x, (BATCH, SEQ, 2, 4)), (0, 2, 1, 3))
        b.output(b.view(b.permute(b.unary(Unary.EXP, heads), (0, 2, 1, 3)), (BATCH, SEQ, 8)), "y")
        b.output(b.view(x, (BATCH * SEQ, 8)), "rows")

    graph = graph_of(build)
    model = check(graph, feeds_for(graph, rng, {"batch": 2, "seq": 3}))
    assert not {"Shape", "Concat", "Gather"} & set(ops_of(model))
    assert ops_of(model) == Counter({"Reshape": 3, "Transpose": 2, "Exp": 1})
    shapes = {
        tuple(onnx.numpy_helper.to_array(t).tolist())
        for t in model.graph.initializer
        if t.data_type == onnx.TensorProto.INT64
    }
    assert shapes >= {(0, 0, 2, 4), (0, 0, 8), (-1, 8)}


def test_neutral_operands_and_gathers_from_splats_write_nothing(rng: np.random.Generator) -> None:
    def build(b: GraphBuilder) -> None:
        x = b.input("x", (BATCH, 4), F32)
        flags = b.input("flags", (BATCH, 4), DType.BOOL)
        ones = b.gather(
            b.scalar(True, DType.BOOL, (6,)), b.constant(np.array([0, 5, 2, 1])), axis=0
        )
        b.output(b.binary(Binary.AND, flags, b.broadcast(ones, (BATCH, 4))), "flags_out")
        b.output(b.mul(b.add(x, b.constant(np.float32(0))), b.constant(np.float32(1))), "y")

    graph = graph_of(build)
    model = check(graph, feeds_for(graph, rng, {"batch": 2}))
    assert ops_of(model) == Counter({"Identity": 2})
