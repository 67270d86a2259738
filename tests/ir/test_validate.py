"""`validate` accepts well-formed graphs and names the node behind each broken invariant."""

from __future__ import annotations

import pytest

from knopt.errors import InvalidGraphError, MemoryLimitError
from knopt.ir import DType, Graph, GraphBuilder, TensorType, Unary, sym, validate
from knopt.ir.graph import Node, Value
from knopt.ir.op import Input, UnaryOp

F32 = DType.F32


def _chain() -> Graph:
    b = GraphBuilder("chain")
    x = b.input("x", (sym("n"), 3), F32)
    b.current_name = "first"
    y = b.unary(Unary.EXP, x)
    b.current_name = "second"
    b.output(b.unary(Unary.NEG, y), "z")
    return b.build()


def test_builder_graphs_are_valid() -> None:
    validate(_chain())


def test_node_before_its_input_is_reported() -> None:
    graph = _chain()
    x, first, second = graph.nodes
    unsorted = Graph([x, second, first], graph.inputs, graph.outputs, graph.output_names)
    with pytest.raises(InvalidGraphError, match=r"node 'second'.*not defined before it"):
        validate(unsorted)


def test_node_whose_input_is_missing_from_the_graph_is_reported() -> None:
    graph = _chain()
    x, _, second = graph.nodes
    dangling = Graph([x, second], graph.inputs, graph.outputs, graph.output_names)
    with pytest.raises(InvalidGraphError, match=r"node 'second'.*dangling"):
        validate(dangling)


def test_node_typed_differently_from_its_op_is_reported() -> None:
    graph = _chain()
    first = graph.nodes[1]
    first.output.type = TensorType(first.output.shape, DType.F16)
    with pytest.raises(InvalidGraphError, match=r"node 'first'.*has type f16"):
        validate(graph)


def test_graph_input_that_is_not_an_input_node_is_reported() -> None:
    graph = _chain()
    not_input = graph.nodes[1].output
    broken = Graph(graph.nodes, [not_input], graph.outputs, graph.output_names)
    with pytest.raises(InvalidGraphError, match="not a unique Input node"):
        validate(broken)


def test_output_names_must_match_outputs() -> None:
    graph = _chain()
    broken = Graph(graph.nodes, graph.inputs, graph.outputs, ["z", "extra"])
    with pytest.raises(InvalidGraphError, match="outputs and output names"):
        validate(broken)


def test_output_not_computed_by_the_graph_is_reported() -> None:
    graph = _chain()
    elsewhere = _chain().outputs[0]
    broken = Graph(graph.nodes, graph.inputs, [elsewhere], ["z"])
    with pytest.raises(InvalidGraphError, match="graph output 'z' is not defined"):
        validate(broken)


def test_tensor_beyond_the_memory_limit_is_reported() -> None:
    big = TensorType((2**20, 2**20), F32)
    source = Node(Input("x", big), (), name="x")
    source.output = Value(big, source)
    neg = Node(UnaryOp(Unary.NEG), (source.output,), name="huge")
    neg.output = Value(big, neg)
    graph = Graph([source, neg], [source.output], [neg.output], ["y"])
    with pytest.raises(MemoryLimitError, match=r"node 'x'.*4\.0 TiB, more than the memory limit"):
        validate(graph)
