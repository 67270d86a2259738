"""Opaque ops for random graphs and rule instances: ONNX nodes kept as they are.

An opaque op stands for a node of an op knopt has no importer for; these are standard ops that
onnx's reference evaluator runs, so the CPU oracle can run the graphs that hold them. What
they compute does not matter to the optimizer, which must never look inside them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from knopt.ir.builder import GraphBuilder
from knopt.ir.dtype import DType
from knopt.ir.graph import Value
from knopt.ir.op import Opaque, TensorType
from knopt.onnx.opaque import opaque_call

OPSET = 18  # the version of the default domain the nodes are kept at


def kept_node(
    builder: GraphBuilder,
    op_type: str,
    inputs: Sequence[Value],
    outputs: Sequence[TensorType],
    **attributes: Any,
) -> list[Value]:
    """The outputs of a default-domain ONNX node, added to `builder` as opaque ops."""
    node = onnx.helper.make_node(
        op_type,
        [f"in{i}" for i in range(len(inputs))],
        [f"out{i}" for i in range(len(outputs))],
        name=f"kept_{op_type.lower()}",
        **attributes,
    )
    call = opaque_call(node, "", OPSET)
    return [builder.apply(Opaque(call, i, t), inputs) for i, t in enumerate(outputs)]


def kept_constant(builder: GraphBuilder, array: np.ndarray) -> Value:
    """An opaque op without inputs whose value is `array` (an ONNX Constant node)."""
    value = onnx.numpy_helper.from_array(np.asarray(array), "value")
    tensor_type = TensorType(tuple(array.shape), DType.from_numpy(array.dtype))
    (kept,) = kept_node(builder, "Constant", [], [tensor_type], value=value)
    return kept
