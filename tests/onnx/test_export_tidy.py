"""Dropping what no output needs from a written graph."""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from knopt.onnx.export_tidy import without_unused


def test_nodes_and_initializers_no_output_needs_are_dropped() -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Add", ["x", "w_dead"], ["dead"]),
        helper.make_node("Mul", ["a", "w"], ["y"]),
        helper.make_node("Neg", ["dead"], ["dead_too"]),
    ]
    initializers = [numpy_helper.from_array(np.ones(2, np.float32), n) for n in ("w", "w_dead")]
    kept, weights = without_unused(nodes, initializers, ["y"])
    assert [n.op_type for n in kept] == ["Relu", "Mul"]
    assert [t.name for t in weights] == ["w"]
