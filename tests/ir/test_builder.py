"""GraphBuilder: hash-consing, typing at construction, no-op shortcuts and pruning."""

from __future__ import annotations

import numpy as np
import pytest

from knopt.errors import InvalidGraphError
from knopt.ir import Binary, DType, GraphBuilder, Reduction, Unary, sym
from knopt.ir import op as ops

F32 = DType.F32


def test_identical_ops_on_identical_inputs_are_one_value() -> None:
    b = GraphBuilder()
    x = b.input("x", (2, 3), F32)
    first = b.unary(Unary.EXP, x)
    assert b.unary(Unary.EXP, x) is first
    assert b.add(first, x) is b.add(first, x)
    assert b.add(first, x) is not b.add(x, first)  # no algebra: operand order matters
    b.output(b.add(first, x), "y")
    assert [n.op.name for n in b.build().nodes] == ["Input", "EXP", "ADD"]


def test_constants_with_equal_contents_are_shared() -> None:
    b = GraphBuilder()
    one = b.constant(np.array([1.0, 2.0], np.float32))
    assert b.constant(np.array([1.0, 2.0], np.float32)) is one
    assert b.constant(np.array([1.0, 2.0], np.float64)) is not one
    assert b.constant(np.array([1.0, 3.0], np.float32)) is not one


def test_constant_is_copied_from_the_callers_array() -> None:
    b = GraphBuilder()
    array = np.array([1.0, 2.0], np.float32)
    value = b.constant(array)
    array[0] = 5.0
    op = value.producer.op
    assert isinstance(op, ops.Constant)
    assert op.data.array.tolist() == [1.0, 2.0]


def test_differently_attributed_ops_stay_apart() -> None:
    b = GraphBuilder()
    x = b.input("x", (2, 3, 4), F32)
    assert b.reduce(Reduction.SUM, x, axes=(1,)) is not b.reduce(Reduction.SUM, x, axes=(2,))
    assert b.reduce(Reduction.SUM, x, axes=(2, 1)) is b.reduce(Reduction.SUM, x, axes=(1, 2))


def test_no_op_calls_return_their_input() -> None:
    b = GraphBuilder()
    x = b.input("x", (2, 3), F32)
    assert b.view(x, (2, 3)) is x
    assert b.broadcast(x, (2, 3)) is x
    assert b.permute(x, (0, 1)) is x
    assert b.slice(x, axis=1, start=0, stop=3) is x
    assert b.pad(x, pads=((0, 0), (0, 0))) is x
    assert b.cast(x, F32) is x
    assert b.reduce(Reduction.MAX, x, axes=()) is x
    assert b.concat([x], axis=0) is x


def test_binary_broadcasts_explicitly() -> None:
    b = GraphBuilder()
    x = b.input("x", (2, 3), F32)
    y = b.input("y", (3,), F32)
    z = b.binary(Binary.MUL, x, y)
    assert z.shape == (2, 3)
    (_, right) = z.producer.inputs
    assert isinstance(right.producer.op, ops.Broadcast)
    assert isinstance(right.producer.inputs[0].producer.op, ops.View)


def test_types_are_inferred_including_symbolic_sizes() -> None:
    b = GraphBuilder()
    n = sym("n")
    x = b.input("x", (n, 8), F32)
    assert b.view(x, (2 * n, 4)).shape == (2 * n, 4)
    assert b.slice(x, axis=1, start=1, stop=7, step=2).shape == (n, 3)
    assert b.binary(Binary.LESS, x, x).dtype is DType.BOOL
    assert b.arg_reduce(x, axis=0).type.shape == (1, 8)
    assert b.arg_reduce(x, axis=0).dtype is DType.I64


def test_typing_errors_name_the_node() -> None:
    b = GraphBuilder()
    x = b.input("x", (2, 3), F32)
    b.current_name = "/encoder/reshape"
    with pytest.raises(InvalidGraphError, match=r"node '/encoder/reshape' \(View\).*\[2, 3\]"):
        b.view(x, (4, 2))
    b.current_name = "/encoder/matmul"
    with pytest.raises(InvalidGraphError, match=r"node '/encoder/matmul'.*inner dimensions"):
        b.matmul(x, x)


def test_dtype_errors_name_the_node() -> None:
    b = GraphBuilder()
    x = b.input("x", (2,), DType.I32)
    b.current_name = "exp_of_int"
    with pytest.raises(InvalidGraphError, match=r"node 'exp_of_int'.*EXP needs a float"):
        b.unary(Unary.EXP, x)
    b.current_name = "mixed"
    with pytest.raises(InvalidGraphError, match=r"node 'mixed'.*different element types"):
        b.apply(ops.BinaryOp(Binary.ADD), [x, b.input("y", (2,), F32)])


def test_wrong_input_count_is_an_error() -> None:
    b = GraphBuilder()
    x = b.input("x", (2,), F32)
    with pytest.raises(InvalidGraphError, match="takes 2 inputs, got 1"):
        b.apply(ops.MatMul(), [x])


def test_names_must_be_unique() -> None:
    b = GraphBuilder()
    x = b.input("x", (2,), F32)
    with pytest.raises(InvalidGraphError, match="'x' is declared twice"):
        b.input("x", (3,), F32)
    b.output(x, "y")
    with pytest.raises(InvalidGraphError, match="'y' is declared twice"):
        b.output(x, "y")


def test_build_drops_nodes_no_output_needs_but_keeps_inputs() -> None:
    b = GraphBuilder()
    x = b.input("x", (2,), F32)
    unused = b.input("unused", (2,), F32)
    b.unary(Unary.EXP, unused)
    b.output(b.unary(Unary.NEG, x), "y")
    graph = b.build()
    assert graph.input_names == ["x", "unused"]
    assert [n.op.name for n in graph.nodes] == ["Input", "Input", "NEG"]
    assert [n.op.name for n in x.users()] == ["NEG"]


def test_build_without_outputs_is_an_error() -> None:
    with pytest.raises(InvalidGraphError, match="no outputs"):
        GraphBuilder("empty").build()
