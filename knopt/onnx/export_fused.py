"""Recognised patterns written as the fused standard op of the target opset.

Each pattern is a function `(writer, node) -> Rep | None` keyed by the op class of the node
where the pattern ends; it returns None when the node is not the end of its pattern.
"""

from __future__ import annotations

from collections.abc import Callable

from knopt.ir import op as ops
from knopt.ir.graph import Node
from knopt.onnx.writer import Rep, Target, Writer

Pattern = Callable[[Writer, Node], "Rep | None"]
Patterns = dict[type[ops.Op], list[Pattern]]


def patterns_for(target: Target, opset: int) -> Patterns:
    """The patterns to try, by the op class of the node they end at, most specific first."""
    return {}
