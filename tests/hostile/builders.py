"""Small ONNX models built in code for the hostile-input corpus."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT
I64 = TensorProto.INT64
OPSET = 18
LOCAL = "local"  # the domain of model-local functions


def info(name: str, shape: Sequence[int | str] | None, dtype: int = F) -> onnx.ValueInfoProto:
    """A tensor value info."""
    return helper.make_tensor_value_info(name, dtype, shape)


def ints(name: str, values: object) -> TensorProto:
    """An int64 initializer."""
    return numpy_helper.from_array(np.array(values, np.int64), name)


def model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    initializers: Sequence[TensorProto] = (),
    functions: Sequence[onnx.FunctionProto] = (),
    opset: int = OPSET,
) -> onnx.ModelProto:
    """A model of one graph; model-local functions live in the `local` domain."""
    graph = helper.make_graph(list(nodes), "hostile", list(inputs), list(outputs))
    graph.initializer.extend(initializers)
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid(LOCAL, 1)]
    return helper.make_model(graph, opset_imports=opsets, functions=list(functions))


def function(
    name: str, inputs: Sequence[str], outputs: Sequence[str], nodes: Sequence[onnx.NodeProto]
) -> onnx.FunctionProto:
    """A model-local function in the `local` domain."""
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid(LOCAL, 1)]
    return helper.make_function(LOCAL, name, list(inputs), list(outputs), list(nodes), opsets)


def external(name: str, location: str, dims: Sequence[int], dtype: int = F) -> TensorProto:
    """A tensor whose data lives in the file `location`, relative to the model's folder."""
    tensor = TensorProto(name=name, data_type=dtype, dims=list(dims))
    tensor.data_location = TensorProto.EXTERNAL
    tensor.external_data.append(onnx.StringStringEntryProto(key="location", value=location))
    return tensor
