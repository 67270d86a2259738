"""A small ONNX model built node by node, for tests and the rule checker's seed instances."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MS = "com.microsoft"


class OnnxBuilder:
    """Float inputs, initializers and nodes, each node writing one fresh value.

    Args:
        opset: The default domain's opset (com.microsoft's is 1).
    """

    def __init__(self, opset: int = 13) -> None:
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []

    def input(self, name: str, shape: Sequence[int | str]) -> str:
        """A float32 graph input of `shape` (strings are symbolic sizes)."""
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))
        return name

    def const(self, array: Any) -> str:
        """An initializer holding `array`."""
        name = f"c{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def node(self, op_type: str, inputs: Sequence[str], domain: str = "", **attrs: Any) -> str:
        """A node of `op_type` over `inputs`; its one output's name."""
        out = f"t{len(self.nodes)}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], domain=domain, **attrs))
        return out

    def model(self, outputs: Sequence[str], name: str = "model") -> onnx.ModelProto:
        """The model whose outputs are these values (their types left to inference)."""
        infos = [onnx.ValueInfoProto(name=output) for output in outputs]
        graph = helper.make_graph(self.nodes, name, self.inputs, infos, self.inits)
        opsets = [helper.make_opsetid("", self.opset), helper.make_opsetid(MS, 1)]
        return helper.make_model(graph, opset_imports=opsets)
