"""The graph IR: an SSA DAG of `Node`s, each producing one `Value`.

A `Value` is compared by identity and carries its type and the node that makes it. A `Graph`
lists its nodes in topological order; `GraphBuilder` (in `builder.py`) is the way to make one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from knopt.ir.dtype import DType
from knopt.ir.op import Input, Op, TensorType
from knopt.ir.shape import Shape, symbols_of


class Value:
    """One SSA result: a tensor of static type, produced by exactly one node."""

    __slots__ = ("_users", "producer", "type")

    def __init__(self, tensor_type: TensorType, producer: Node) -> None:
        self.type = tensor_type
        self.producer = producer
        self._users: list[Node] = []

    @property
    def shape(self) -> Shape:
        """The value's dimensions (integers or symbolic sizes)."""
        return self.type.shape

    @property
    def dtype(self) -> DType:
        """The value's element type."""
        return self.type.dtype

    @property
    def rank(self) -> int:
        """Number of dimensions."""
        return len(self.type.shape)

    def users(self) -> list[Node]:
        """The nodes of the graph that read this value (one entry per reading node)."""
        return list(self._users)

    def __repr__(self) -> str:
        return f"<Value {self.type} from {self.producer.op.name}>"


@dataclass(eq=False)
class Node:
    """One operation: `op` applied to `inputs`, producing `output`.

    Attributes:
        name: Where the node came from (the ONNX node name), for messages and reports.
    """

    op: Op
    inputs: tuple[Value, ...]
    name: str = ""
    output: Value = None  # type: ignore[assignment]  # set right after construction

    @property
    def outputs(self) -> tuple[Value, ...]:
        """The node's results (always exactly one)."""
        return (self.output,)

    def describe(self) -> str:
        """A short phrase naming the node for error messages."""
        return f"node '{self.name}' ({self.op.name})" if self.name else f"{self.op.name} node"


class Graph:
    """A computation: named inputs, named outputs and the nodes between them.

    Nodes are kept in topological order and every node is needed by some output.
    """

    def __init__(
        self,
        nodes: Sequence[Node],
        inputs: Sequence[Value],
        outputs: Sequence[Value],
        output_names: Sequence[str],
        name: str = "",
    ) -> None:
        self.nodes = list(nodes)
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.output_names = list(output_names)
        self.name = name
        for node in self.nodes:
            node.output._users = []
        for node in self.nodes:
            for value in node.inputs:
                value._users.append(node)

    @property
    def input_names(self) -> list[str]:
        """Names of the graph inputs, in order."""
        return [_input_op(v).input_name for v in self.inputs]

    def values(self) -> Iterator[Value]:
        """Every value, in topological order."""
        return (node.output for node in self.nodes)

    def symbols(self) -> frozenset[str]:
        """The symbolic size names used anywhere in the graph."""
        return frozenset().union(*(symbols_of(v.shape) for v in self.values()))

    def op_histogram(self) -> dict[str, int]:
        """How many nodes of each op name the graph has, most common first."""
        counts: dict[str, int] = {}
        for node in self.nodes:
            counts[node.op.name] = counts.get(node.op.name, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def __repr__(self) -> str:
        return f"<Graph '{self.name}': {len(self.nodes)} nodes>"


def _input_op(value: Value) -> Input:
    op = value.producer.op
    assert isinstance(op, Input)
    return op
