"""Which nodes of an ONNX model knopt has no importer for, found without importing the model.

Importing stops at the first op it cannot handle; this scan names every such node at once, so
that a user sees the whole list (`knopt info`).
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from knopt.onnx import ops as _ops  # noqa: F401  (registers the importers)
from knopt.onnx.context import find_importer


@dataclass(frozen=True)
class UnsupportedNode:
    """One node whose op knopt cannot import.

    Attributes:
        node: The node's name, or `#index` for an unnamed node (as in import errors).
        op_type: The op, prefixed by its domain unless that is the default one.
    """

    node: str
    op_type: str


def find_unsupported(model: onnx.ModelProto, opset: int) -> list[UnsupportedNode]:
    """The nodes whose op has no importer at `opset` and is no model-local function.

    Other domains are looked up at the versions the model imports them at.

    Function bodies and subgraphs are scanned too; nodes come in graph order.
    """
    functions = {(f.domain, f.name): f for f in model.functions}
    versions = {entry.domain: int(entry.version) for entry in model.opset_import}
    versions[""] = opset
    found: list[UnsupportedNode] = []
    scanned: set[tuple[str, str]] = set()
    # Iterative, in graph order: a function's body and a node's subgraphs come right after it.
    stack: list[tuple[int, onnx.NodeProto]] = list(enumerate(model.graph.node))[::-1]
    while stack:
        index, node = stack.pop()
        domain = "" if node.domain == "ai.onnx" else node.domain
        key = (domain, node.op_type)
        inner: list[onnx.NodeProto] = []
        if key in functions:
            if key not in scanned:
                scanned.add(key)
                inner.extend(functions[key].node)
        elif find_importer(domain, node.op_type, versions.get(domain, opset)) is None:
            op_type = f"{domain}.{node.op_type}" if domain else node.op_type
            found.append(UnsupportedNode(node.name or f"#{index}", op_type))
        for attr in node.attribute:
            for graph in [attr.g] if attr.HasField("g") else list(attr.graphs):
                inner.extend(graph.node)
        stack.extend(reversed(list(enumerate(inner))))
    return found
