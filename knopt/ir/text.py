"""A readable text dump of a graph, one node per line.

graph demo(x: f32[batch, 3, 16, 16]) {
  %3 = Conv{strides=(1, 1), ...}(x, %1)  : f32[batch, 8, 16, 16]  # conv1
  return logits = %9
}
"""

from __future__ import annotations

import dataclasses
import enum

from knopt.ir.graph import Graph, Node, Value
from knopt.ir.op import BinaryOp, Constant, Input, Op, UnaryOp


def format_graph(graph: Graph) -> str:
    """The whole graph as text."""
    names: dict[Value, str] = {}
    for value in graph.inputs:
        op = value.producer.op
        assert isinstance(op, Input)
        names[value] = op.input_name
    params = ", ".join(f"{names[v]}: {v.type}" for v in graph.inputs)
    lines = [f"graph {graph.name or 'main'}({params}) {{"]
    for node in graph.nodes:
        if isinstance(node.op, Input):
            continue
        names[node.output] = f"%{len(names)}"
        lines.append("  " + _format_node(node, names))
    outs = ", ".join(
        f"{name} = {names[v]}" for name, v in zip(graph.output_names, graph.outputs, strict=True)
    )
    lines.append(f"  return {outs}")
    lines.append("}")
    return "\n".join(lines)


def _format_node(node: Node, names: dict[Value, str]) -> str:
    args = ", ".join(names[v] for v in node.inputs)
    text = f"{names[node.output]} = {node.op.name}{format_attributes(node.op)}({args})"
    text += f" : {node.output.type}"
    return text + (f"  # {node.name}" if node.name else "")


def format_attributes(op: Op) -> str:
    """An op's attributes as `{a=1, b=2}`, or '' when it has none worth showing."""
    if isinstance(op, Constant):
        array = op.data.array
        if array.size <= 4:
            return "{" + repr(array.tolist()) + "}"
        return f"{{#{op.data.digest[:8]}}}"
    shown = [
        f"{f.name}={_format_attribute(getattr(op, f.name))}"
        for f in dataclasses.fields(op)  # type: ignore[arg-type]
        if not (isinstance(op, UnaryOp | BinaryOp) and f.name == "kind")
    ]
    return "{" + ", ".join(shown) + "}" if shown else ""


def _format_attribute(value: object) -> str:
    if isinstance(value, enum.Enum):
        return value.name.lower()
    if isinstance(value, tuple):
        return (
            "("
            + ", ".join(_format_attribute(v) for v in value)
            + ("," if len(value) == 1 else "")
            + ")"
        )
    return str(value)


def name_of(value: Value) -> str:
    """A short name for a value in messages: the input's name or the producing node's."""
    op = value.producer.op
    if isinstance(op, Input):
        return op.input_name
    return value.producer.name or op.name
