"""Graphs written as JSON plus constant bytes read back as the same graph, and nothing else."""

from __future__ import annotations

import enum
import json
import typing

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import knopt
from knopt.cache.serial import ENUMS, CacheFormatError, dump_graph, graph_digest, load_graph
from knopt.ir import op as ops
from knopt.ir.bind import bind_symbols
from knopt.ir.builder import GraphBuilder
from knopt.ir.dtype import DType
from knopt.ir.text import format_graph
from knopt.testing.opaque import kept_node
from tests.models import MODELS, fixtures


def _enums_in(annotation: object) -> set[type[enum.Enum]]:
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {annotation}
    found: set[type[enum.Enum]] = set()
    for argument in typing.get_args(annotation):
        found |= _enums_in(argument)
    return found


def test_every_enum_an_op_attribute_holds_can_be_read_back() -> None:
    used: set[type[enum.Enum]] = set()
    for cls in ops.OP_CLASSES:
        for annotation in typing.get_type_hints(cls, vars(ops)).values():
            used |= _enums_in(annotation)
    used |= _enums_in(typing.get_type_hints(ops.TensorType, vars(ops))["dtype"])
    assert used <= set(ENUMS.values())


@pytest.mark.parametrize("file", [f.file for f in fixtures() if f.style == "ts14"])
def test_fixture_graphs_read_back_equal(file: str) -> None:
    graph = knopt.load(MODELS / file)
    encoded, arrays = dump_graph(graph)
    again, nodes = load_graph(json.loads(json.dumps(encoded)), arrays)
    assert format_graph(again) == format_graph(graph)
    assert graph_digest(again) == graph_digest(graph)
    assert nodes == again.nodes


def test_optimized_graph_reads_back_and_computes_the_same(rng: np.random.Generator) -> None:
    graph = bind_symbols(knopt.load(MODELS / "mlp_ts14.onnx"), {"batch": 3})
    optimized = knopt.optimize(graph).graph
    encoded, arrays = dump_graph(optimized)
    again, _ = load_graph(json.loads(json.dumps(encoded)), arrays)
    x = rng.standard_normal((3, 16)).astype(np.float32)
    expected = knopt.compile(optimized).run(None, {"input": x})
    np.testing.assert_array_equal(knopt.compile(again).run(None, {"input": x})[0], expected[0])


def test_digest_follows_sizes_and_weights() -> None:
    graph = knopt.load(MODELS / "mlp_ts14.onnx")
    two = graph_digest(bind_symbols(graph, {"batch": 2}))
    assert two == graph_digest(bind_symbols(graph, {"batch": 2}))
    assert two != graph_digest(bind_symbols(graph, {"batch": 4}))
    model = onnx.load(MODELS / "mlp_ts14.onnx")
    weight = model.graph.initializer[0]
    changed = numpy_helper.to_array(weight) * np.float32(1.5)
    weight.CopyFrom(numpy_helper.from_array(changed, weight.name))
    other = knopt.load(model.SerializeToString())
    assert two != graph_digest(bind_symbols(other, {"batch": 2}))


def test_unknown_op_class_is_refused() -> None:
    encoded, arrays = dump_graph(knopt.load(MODELS / "mlp_ts14.onnx"))
    encoded["nodes"][1]["op"] = "os.system"
    with pytest.raises(CacheFormatError, match="KeyError"):
        load_graph(encoded, arrays)


def test_node_whose_type_no_longer_fits_is_refused() -> None:
    encoded, arrays = dump_graph(knopt.load(MODELS / "mlp_ts14.onnx"))
    matmul = next(n for n in encoded["nodes"] if n["op"] == "MatMul")
    matmul["inputs"] = matmul["inputs"][::-1]
    with pytest.raises(CacheFormatError):
        load_graph(encoded, arrays)


def test_reading_an_input_defined_later_is_refused() -> None:
    encoded, arrays = dump_graph(knopt.load(MODELS / "mlp_ts14.onnx"))
    matmul = next(n for n in encoded["nodes"] if n["op"] == "MatMul")
    matmul["inputs"][0] = len(encoded["nodes"]) - 1
    with pytest.raises(CacheFormatError):
        load_graph(encoded, arrays)


def test_an_opaque_op_reads_back_equal() -> None:
    g = GraphBuilder("kept")
    x = g.input("x", (2, 3), DType.F32)
    (kept,) = kept_node(g, "Sin", [x], [ops.TensorType((2, 3), DType.F32)])
    g.output(kept, "y")
    graph = g.build()
    encoded, arrays = dump_graph(graph)
    again, _ = load_graph(json.loads(json.dumps(encoded)), arrays)
    assert [n.op for n in again.nodes] == [n.op for n in graph.nodes]
    assert graph_digest(again) == graph_digest(graph)
