"""`validate`: check every invariant of a graph and name the node that breaks one."""

from __future__ import annotations

from knopt.errors import InvalidGraphError
from knopt.ir.graph import Graph, Value
from knopt.ir.memory import check_value
from knopt.ir.op import Input


def validate(graph: Graph) -> None:
    """Check that `graph` is well formed.

    Checks: nodes are in topological order and each input is defined before use (so there is no
    cycle), every node's type is what its op infers, inputs are Input nodes listed once, outputs
    are defined, and no tensor is larger than the memory budget (`knopt.ir.memory`).

    Raises:
        InvalidGraphError: On the first broken invariant, naming the node.
        MemoryLimitError: If a tensor is larger than the memory budget, naming its node.
    """
    defined: set[Value] = set()
    for node in graph.nodes:
        for value in node.inputs:
            if value not in defined:
                raise InvalidGraphError(
                    f"{node.describe()}: reads a value that is not defined before it "
                    "(a cycle or a dangling input)"
                )
        expected = node.op.infer([v.type for v in node.inputs], node.describe())
        if expected != node.output.type:
            raise InvalidGraphError(
                f"{node.describe()}: has type {node.output.type} but its op gives {expected}"
            )
        check_value(node.output, node.describe())
        defined.add(node.output)
    seen_inputs: set[Value] = set()
    for value in graph.inputs:
        if not isinstance(value.producer.op, Input) or value in seen_inputs:
            raise InvalidGraphError(f"graph input {value} is not a unique Input node")
        if value not in defined:
            raise InvalidGraphError(f"graph input {value} is missing from the node list")
        seen_inputs.add(value)
    if len(graph.outputs) != len(graph.output_names) or not graph.outputs:
        raise InvalidGraphError("graph outputs and output names do not match")
    for name, value in zip(graph.output_names, graph.outputs, strict=True):
        if value not in defined:
            raise InvalidGraphError(f"graph output '{name}' is not defined by any node")
