"""Last steps of writing a model: drop what no output needs.

Handlers of fused ops write the fused node and leave the nodes it replaces unread; the
writer also writes constants and size arithmetic only some of whose readers survive.
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx


def without_unused(
    nodes: list[onnx.NodeProto], initializers: list[onnx.TensorProto], outputs: Iterable[str]
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """The nodes and initializers that the graph outputs depend on, in their order."""
    needed = set(outputs)
    kept: list[onnx.NodeProto] = []
    for node in reversed(nodes):
        if any(name in needed for name in node.output):
            kept.append(node)
            needed.update(name for name in node.input if name)
    kept.reverse()
    return kept, [t for t in initializers if t.name in needed]
