"""One compile serves every batch size: a session optimizes once and binds each new size.

    python examples/dynamic_batch.py

Builds a small MLP with a symbolic batch size with `onnx.helper`, compiles it for batches of 1
to 64 (kernels costed at 8), and runs it at several sizes, checking each against onnxruntime's
reference evaluator (`onnx.reference`).
"""

from __future__ import annotations

from typing import cast

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import knopt


def mlp(rng: np.random.Generator) -> onnx.ModelProto:
    """x[batch, 16] -> Gemm -> Relu -> Gemm -> Softmax -> y[batch, 4]."""
    weights = [
        numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.standard_normal((32, 4)).astype(np.float32), "w2"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b2"),
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["z"]),
        helper.make_node("Softmax", ["z"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def main() -> None:
    """Compile once, run at four batch sizes, compare with the reference evaluator."""
    rng = np.random.default_rng(0)
    model = mlp(rng)
    session = knopt.compile(
        model.SerializeToString(), "cpu", optimize=True, dims={"batch": (1, 8, 64)}
    )
    print(session)
    reference = ReferenceEvaluator(model)
    for batch in (1, 3, 8, 64):
        x = rng.standard_normal((batch, 16)).astype(np.float32)
        (y,) = session.run(None, {"x": x})
        (expected,) = cast(list[np.ndarray], reference.run(None, {"x": x}))
        np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-6)
        print(f"batch {batch:2d}: output {list(y.shape)}, matches the reference")
    print(f"optimizer runs: {session.stats.optimizer_runs}, sizes bound: {session.stats.bindings}")


if __name__ == "__main__":
    main()
