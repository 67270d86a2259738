"""Single-node ONNX models, and checks of knopt's importers against an oracle runtime."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from knopt.onnx_backend import KnoptBackend
from tests.oracle import run_onnxruntime, run_reference


def node_model(
    op_type: str,
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[str],
    *,
    opset: int,
    constants: Mapping[str, np.ndarray] | None = None,
    domain: str = "",
    **attributes: Any,
) -> onnx.ModelProto:
    """A model of one `op_type` node; `inputs` become graph inputs, `constants` initializers.

    The node's inputs are `inputs` then `constants`, in that order; pass '' names through
    `constants` order to skip an optional input.
    """
    constants = constants or {}
    names = [*inputs, *constants]
    node = helper.make_node(op_type, names, list(outputs), domain=domain, **attributes)
    graph = helper.make_graph(
        [node],
        op_type.lower(),
        [
            helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for n, a in inputs.items()
        ],
        [onnx.ValueInfoProto(name=n) for n in outputs],
        [numpy_helper.from_array(a, n) for n, a in constants.items()],
    )
    imports = [helper.make_opsetid("", opset)]
    if domain:
        imports.append(helper.make_opsetid(domain, 1))
    model = helper.make_model(graph, opset_imports=imports, ir_version=10)
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type for v in inferred.graph.value_info}
    for output in model.graph.output:
        if output.name in types:
            output.type.CopyFrom(types[output.name])
    return model


def assert_matches(
    model: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    *,
    oracle: str = "onnxruntime",
    rtol: float = 1e-5,
    atol: float = 1e-6,
) -> None:
    """knopt's outputs for `feeds` equal the oracle's in shape, dtype and value."""
    ours = KnoptBackend.run_model(model, dict(feeds))
    run = run_onnxruntime if oracle == "onnxruntime" else run_reference
    theirs = run(model, feeds)
    assert len(ours) == len(theirs)
    for mine, expected in zip(ours, theirs, strict=True):
        assert mine.shape == expected.shape
        assert mine.dtype == expected.dtype
        np.testing.assert_allclose(mine, expected, rtol=rtol, atol=atol)
