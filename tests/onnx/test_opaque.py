"""Nodes of ops knopt lacks, kept as they are: imported, optimized around, written back, run."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import knopt
from knopt.errors import UnsupportedModelError, UnsupportedOpError
from knopt.ir.op import Opaque
from knopt.ir.program import OPAQUE
from knopt.ir.shape import Sym, sym
from knopt.onnx.load import import_model
from tests.cpu.test_opaque import bitcast_model
from tests.oracle import run_onnxruntime

F32 = TensorProto.FLOAT


def _weight(rng: np.random.Generator, name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array(rng.uniform(-1, 1, shape).astype(np.float32), name)


def _fast_gelu_model(declare: bool = True) -> onnx.ModelProto:
    """A residual MLP block whose activation is onnxruntime's contrib op FastGelu."""
    rng = np.random.default_rng(7)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="up"),
        helper.make_node("Add", ["h", "b1"], ["hb"], name="up_bias"),
        helper.make_node("FastGelu", ["hb"], ["g"], name="gelu", domain="com.microsoft"),
        helper.make_node("MatMul", ["g", "w2"], ["d"], name="down"),
        helper.make_node("Add", ["d", "b2"], ["db"], name="down_bias"),
        helper.make_node("Relu", ["db"], ["r"], name="relu"),
        helper.make_node("Add", ["r", "x"], ["y"], name="residual"),
    ]
    weights = [
        _weight(rng, "w1", 16, 32),
        _weight(rng, "b1", 32),
        _weight(rng, "w2", 32, 16),
        _weight(rng, "b2", 16),
    ]
    declared = [helper.make_tensor_value_info("g", F32, ["batch", 32])] if declare else []
    graph = helper.make_graph(
        nodes,
        "fast_gelu",
        [helper.make_tensor_value_info("x", F32, ["batch", 16])],
        [helper.make_tensor_value_info("y", F32, ["batch", 16])],
        weights,
        value_info=declared,
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def _opaque_nodes(graph: knopt.Graph) -> list[Opaque]:
    return [n.op for n in graph.nodes if isinstance(n.op, Opaque)]


def test_a_contrib_op_is_kept_and_optimized_around(rng: np.random.Generator) -> None:
    model = _fast_gelu_model()
    graph = knopt.load(model.SerializeToString())
    (kept,) = _opaque_nodes(graph)
    assert (kept.call.domain, kept.call.op_type, kept.call.node_name) == (
        "com.microsoft",
        "FastGelu",
        "gelu",
    )
    assert str(kept.tensor_type) == "f32[batch, 32]"
    result = knopt.optimize(graph)
    assert len(_opaque_nodes(result.graph)) == 1
    launches = result.program.launches()
    at = [k.kind for k in launches].index(OPAQUE)
    # Fused before it (the bias as the product's epilogue) and after it (bias, ReLU, residual).
    assert launches[at - 1].kind == "matmul" and launches[at - 1].epilogue is not None
    assert set(launches[-1].names) == {"down_bias", "relu", "residual"}
    assert launches[at].names == ("gelu",)
    saved = knopt.save(result)
    onnx.checker.check_model(saved, full_check=True)
    (written,) = [n for n in saved.graph.node if n.op_type == "FastGelu"]
    assert (written.domain, written.name) == ("com.microsoft", "gelu")
    assert {(o.domain, o.version) for o in saved.opset_import} >= {("com.microsoft", 1)}
    for batch in (1, 3):
        feeds = {"x": rng.uniform(-2, 2, (batch, 16)).astype(np.float32)}
        (expected,) = run_onnxruntime(model, feeds)
        (actual,) = run_onnxruntime(saved, feeds)
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


def test_the_written_model_declares_the_kept_output_and_loads_again() -> None:
    saved = knopt.save(knopt.optimize(knopt.load(_fast_gelu_model().SerializeToString())))
    again = knopt.load(saved.SerializeToString())
    (kept,) = _opaque_nodes(again)
    assert str(kept.tensor_type) == "f32[batch, 32]"


def _custom_model() -> onnx.ModelProto:
    """A made-up op of a user's domain: attributes, an absent optional input, two outputs."""
    attributes: dict[str, Any] = {
        "alpha": 0.5,
        "mode": "fast",
        "sizes": [2, 3],
        "table": numpy_helper.from_array(np.arange(3, dtype=np.int64), "table"),
    }
    nodes = [
        helper.make_node("Neg", ["x"], ["n"], name="neg"),
        helper.make_node(
            "Foo", ["n", "", "x"], ["f", "unused"], name="foo", domain="com.example", **attributes
        ),
        helper.make_node("Neg", ["f"], ["m"], name="neg2"),
        helper.make_node("Neg", ["m"], ["y"], name="neg3"),
    ]
    graph = helper.make_graph(
        nodes,
        "custom",
        [helper.make_tensor_value_info("x", F32, [2, 3])],
        [helper.make_tensor_value_info("y", F32, [2, 3])],
        value_info=[helper.make_tensor_value_info("f", F32, [2, 3])],
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.example", 3)]
    return helper.make_model(graph, opset_imports=opsets)


def test_a_custom_op_is_written_back_unchanged() -> None:
    model = _custom_model()
    result = knopt.optimize(knopt.load(model.SerializeToString()))
    # The double negation around the kept node cancels; the negation into it does not.
    assert result.graph.op_histogram().get("NEG") == 1
    saved = knopt.save(result)
    onnx.checker.check_model(saved, full_check=True)
    (written,) = [n for n in saved.graph.node if n.op_type == "Foo"]
    (original,) = [n for n in model.graph.node if n.op_type == "Foo"]
    assert written.domain == "com.example"
    assert list(written.attribute) == list(original.attribute)
    assert written.input[1] == "" and len(written.output) == 2
    assert {(o.domain, o.version) for o in saved.opset_import} >= {("com.example", 3)}


def test_strict_refuses_an_op_knopt_lacks() -> None:
    model = _fast_gelu_model()
    with pytest.raises(UnsupportedModelError, match=r"node 'gelu'.*com\.microsoft\.FastGelu"):
        import_model(model, strict=True)
    graph = knopt.load(model.SerializeToString())
    with pytest.raises(UnsupportedOpError, match=r"'gelu' \(com\.microsoft\.FastGelu\)"):
        knopt.optimize(graph, strict=True)


def _single_node_model(node: onnx.NodeProto, opsets: list[onnx.OperatorSetIdProto]) -> bytes:
    graph = helper.make_graph(
        [node],
        "one",
        [helper.make_tensor_value_info("x", F32, [2, 3])],
        [helper.make_tensor_value_info("y", F32, None)],
    )
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


def test_an_op_that_onnx_does_not_define_is_refused() -> None:
    node = helper.make_node("NoSuchOp", ["x"], ["y"], name="bad")
    with pytest.raises(UnsupportedModelError, match="not an ONNX op at opset 18"):
        knopt.load(_single_node_model(node, [helper.make_opsetid("", 18)]))


def test_a_node_with_a_subgraph_cannot_be_kept() -> None:
    body = helper.make_graph([], "body", [], [helper.make_tensor_value_info("x", F32, [2, 3])])
    node = helper.make_node("Scanny", ["x"], ["y"], name="loopy", domain="com.example", body=body)
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.example", 1)]
    with pytest.raises(UnsupportedModelError, match="node with a subgraph"):
        knopt.load(_single_node_model(node, opsets))


def test_an_output_of_unknown_type_that_is_read_is_an_error_naming_it() -> None:
    with pytest.raises(UnsupportedModelError, match=r"output 'g'.*element type.*value_info"):
        knopt.load(_fast_gelu_model(declare=False).SerializeToString())


def test_sizes_no_source_gives_become_sizes_of_their_own() -> None:
    # Compress (an op knopt lacks) keeps the columns its condition selects: how many, onnx's
    # shape inference cannot say.
    nodes = [
        helper.make_node("Compress", ["x", "keep"], ["c"], name="compress", axis=1),
        helper.make_node("Neg", ["c"], ["y"], name="neg"),
    ]
    graph = helper.make_graph(
        nodes,
        "compress",
        [
            helper.make_tensor_value_info("x", F32, [2, 3]),
            helper.make_tensor_value_info("keep", TensorProto.BOOL, [3]),
        ],
        [helper.make_tensor_value_info("y", F32, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    loaded = knopt.load(model.SerializeToString())
    (kept,) = _opaque_nodes(loaded)
    rows, columns = kept.tensor_type.shape
    assert rows == 2 and isinstance(columns, Sym)  # named by shape inference (unk__0)
    saved = knopt.save(knopt.optimize(loaded))
    onnx.checker.check_model(saved, full_check=True)
    assert [d.dim_param for d in saved.graph.output[0].type.tensor_type.shape.dim] == [
        "",
        str(columns),
    ]
    with pytest.raises(UnsupportedOpError, match=rf"'compress'.*{columns}.*value_info"):
        knopt.compile(loaded)
    # Where neither the model nor shape inference names a size, the value's name does.
    model.graph.value_info.append(helper.make_tensor_value_info("c", F32, [2, None]))
    model.graph.node[0].domain = "com.example"
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    (kept,) = _opaque_nodes(knopt.load(model.SerializeToString()))
    assert kept.tensor_type.shape == (2, sym("c_dim1"))


def test_an_unused_output_needs_no_type() -> None:
    model = _custom_model()
    graph = knopt.load(model.SerializeToString())
    assert [op.output for op in _opaque_nodes(graph)] == [0]


def test_a_kept_op_at_a_newer_opset_than_written_is_refused() -> None:
    graph = knopt.load(bitcast_model().SerializeToString())
    with pytest.raises(UnsupportedModelError, match=r"'bitcast'.*write opset 26"):
        knopt.save(graph, opset=18)
    saved = knopt.save(graph, opset=26)
    onnx.checker.check_model(saved, full_check=True)
