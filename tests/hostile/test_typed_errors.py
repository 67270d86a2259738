"""Careless and hostile models give one typed knopt error naming the culprit, never a traceback.

Where a model is valid (extreme but legal slice bounds), knopt must instead give onnxruntime's
answer.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import knopt
from knopt.errors import (
    InvalidGraphError,
    InvalidModelError,
    MemoryLimitError,
    RunError,
    UnsupportedModelError,
)
from tests.hostile.builders import I64, LOCAL, F, function, info, ints, model
from tests.oracle import run_onnxruntime

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _load(proto: onnx.ModelProto | bytes) -> knopt.Graph:
    data = proto if isinstance(proto, bytes) else proto.SerializeToString()
    return knopt.load(data)


# ---- tensors whose data or shape cannot be ------------------------------------------------


@pytest.mark.parametrize(
    "tensor",
    [
        TensorProto(name="v", data_type=F, dims=[3], raw_data=b"\0\0\0\0"),
        TensorProto(name="v", data_type=F, dims=[3], float_data=[1.0]),
        TensorProto(name="v", data_type=I64, dims=[2, 2], int64_data=[1, 2, 3, 4, 5]),
        TensorProto(name="v", data_type=F, dims=[-1], float_data=[1.0]),
    ],
    ids=["raw", "typed", "too_much", "negative"],
)
def test_a_constant_whose_data_does_not_fill_its_shape_names_the_node(
    tensor: TensorProto,
) -> None:
    node = helper.make_node("Constant", [], ["y"], value=tensor, name="const")
    with pytest.raises(InvalidModelError, match=r"node 'const' \(Constant\): attribute 'value'"):
        _load(model([node], [], [info("y", None)]))


SHAPE = [2**32, 2**32, 0]
EMPTY_BUT_UNREPRESENTABLE = {
    "input": model([helper.make_node("Relu", ["x"], ["y"])], [info("x", SHAPE)], [info("y", None)]),
    "initializer": model(
        [helper.make_node("Relu", ["w"], ["y"])],
        [],
        [info("y", None)],
        [TensorProto(name="w", data_type=F, dims=SHAPE)],
    ),
    "constant_of_shape": model(
        [helper.make_node("ConstantOfShape", ["s"], ["y"], name="fill")],
        [],
        [info("y", None)],
        [ints("s", SHAPE)],
    ),
    "reshape": model(
        [helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape", allowzero=1)],
        [info("x", [0])],
        [info("y", None)],
        [ints("s", SHAPE)],
    ),
}


@pytest.mark.parametrize("case", sorted(EMPTY_BUT_UNREPRESENTABLE))
def test_an_empty_shape_too_large_for_any_array_is_refused(case: str) -> None:
    with pytest.raises(MemoryLimitError, match=r"\[4294967296, 4294967296, 0\].*can index"):
        _load(EMPTY_BUT_UNREPRESENTABLE[case])


# ---- extreme but valid slice bounds: onnxruntime's answer -------------------------------------


@pytest.mark.parametrize(
    ("start", "end", "step"),
    [
        (INT64_MIN, INT64_MAX, 1),
        (INT64_MAX, INT64_MIN, -1),
        (4, INT64_MIN, INT64_MIN),
        (0, 5, INT64_MIN),
        (0, 5, INT64_MAX),
        (-1, INT64_MIN, -(2**62)),
        (INT64_MIN, INT64_MIN, 1),
    ],
)
def test_slice_bounds_at_the_int64_limits_optimize_to_onnxruntimes_answer(
    start: int, end: int, step: int
) -> None:
    initializers = [ints("st", [start]), ints("en", [end]), ints("ax", [1]), ints("sp", [step])]
    slicer = helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["y"], name="slice")
    proto = model([slicer], [info("x", [3, 5])], [info("y", None)], initializers)
    x = np.arange(1, 16, dtype=np.float32).reshape(3, 5)
    (expected,) = run_onnxruntime(proto, {"x": x})
    optimized = knopt.optimize(_load(proto), ilp=False).graph
    (got,) = knopt.compile(optimized).run(None, {"x": x})
    np.testing.assert_array_equal(got, expected)


def test_slice_from_int64_min_on_a_symbolic_axis_keeps_the_whole_axis() -> None:
    initializers = [ints("st", [INT64_MIN]), ints("en", [INT64_MAX]), ints("ax", [0])]
    slicer = helper.make_node("Slice", ["x", "st", "en", "ax"], ["y"], name="slice")
    proto = model([slicer], [info("x", ["n", 5])], [info("y", None)], initializers)
    optimized = knopt.optimize(_load(proto), ilp=False).graph
    x = np.arange(1, 21, dtype=np.float32).reshape(4, 5)
    (got,) = knopt.compile(optimized).run(None, {"x": x})
    np.testing.assert_array_equal(got, x)


def test_pads_cutting_more_than_the_axis_has_are_refused_by_name() -> None:
    pad = helper.make_node("Pad", ["x", "p"], ["y"], name="pad")
    proto = model([pad], [info("x", [3, 5])], [info("y", None)], [ints("p", [0, INT64_MIN, 0, 0])])
    with pytest.raises(UnsupportedModelError, match=r"node 'pad'.*cut more than axis 1 has"):
        _load(proto)


@pytest.mark.parametrize(
    ("node", "initializers", "fragment"),
    [
        (
            helper.make_node("Range", ["a", "b", "c"], ["y"], name="r"),
            [ints("a", 0), ints("b", 9), ints("c", 0)],
            "delta 0",
        ),
        (
            helper.make_node(
                "ConstantOfShape",
                ["s"],
                ["y"],
                name="r",
                value=helper.make_tensor("v", F, [2], [1, 2]),
            ),
            [ints("s", [3])],
            "one element",
        ),
    ],
    ids=["range_without_step", "fill_of_two_values"],
)
def test_impossible_constants_are_refused_by_name(
    node: onnx.NodeProto, initializers: list[TensorProto], fragment: str
) -> None:
    with pytest.raises(UnsupportedModelError, match=f"node 'r'.*{fragment}"):
        _load(model([node], [], [info("y", None)], initializers))


# ---- saving --------------------------------------------------------------------------------


@pytest.mark.parametrize("kernels", [True, False])
@pytest.mark.parametrize("opset", [99, 5, -1])
def test_saving_at_an_opset_onnx_does_not_know_is_a_typed_error(kernels: bool, opset: int) -> None:
    proto = model([helper.make_node("Relu", ["x"], ["y"])], [info("x", [2])], [info("y", [2])])
    result = knopt.optimize(_load(proto), ilp=False)
    with pytest.raises(UnsupportedModelError, match=f"cannot export at opset {opset}"):
        knopt.save(result, None, kernels=kernels, opset=opset)


# ---- text that is not UTF-8 ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("placeholder", "field"),
    [
        (b"alph", "graph.node[0].attribute[0].name"),
        (b"ooooo", "graph.node[0].output[0]"),
        (b"renamed", "graph.node[0].name"),
        (b"Relu", "graph.node[0].op_type"),
    ],
)
def test_text_that_is_not_utf8_is_refused_naming_the_field(placeholder: bytes, field: str) -> None:
    node = helper.make_node("Relu", ["x"], ["ooooo"], name="renamed", alph=1.0)
    proto = model([node], [info("x", [2])], [info("y", [2])])
    data = proto.SerializeToString()
    assert data.count(placeholder) >= 1
    corrupt = data.replace(placeholder, b"\xff\xfe" + placeholder[2:], 1)
    with pytest.raises(
        InvalidModelError,
        match=re.escape(f"model.{field} is not UTF-8"),
    ):
        _load(corrupt)


# ---- indices out of range: an error at run time, as in onnxruntime -------------------------


@pytest.mark.parametrize("index", [4, -5, 2**40])
def test_gather_indices_out_of_range_fail_at_run_time_naming_the_node(index: int) -> None:
    gather = helper.make_node("Gather", ["x", "i"], ["y"], name="lookup")
    proto = model([gather], [info("x", [4, 5]), info("i", [2], I64)], [info("y", None)])
    session = knopt.compile(_load(proto))
    x = np.ones((4, 5), np.float32)
    (inside,) = session.run(None, {"x": x, "i": np.array([3, -4])})
    assert inside.shape == (2, 5)
    with pytest.raises(RunError, match=rf"node 'lookup' \(Gather\): index {index} is out of range"):
        session.run(None, {"x": x, "i": np.array([0, index])})


def test_constant_gather_indices_out_of_range_fail_naming_the_node() -> None:
    gather = helper.make_node("Gather", ["x", "i"], ["y"], name="lookup")
    proto = model([gather], [info("x", [4, 5])], [info("y", None)], [ints("i", [7])])
    session = knopt.compile(_load(proto))
    with pytest.raises(RunError, match=r"node 'lookup'.*index 7"):
        session.run(None, {"x": np.ones((4, 5), np.float32)})


def test_scatter_indices_out_of_range_fail_naming_the_node() -> None:
    scatter = helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], name="write")
    inputs = [info("x", [4]), info("i", [1], I64), info("u", [1])]
    session = knopt.compile(_load(model([scatter], inputs, [info("y", None)])))
    feeds = {"x": np.ones(4, np.float32), "i": np.array([9]), "u": np.ones(1, np.float32)}
    with pytest.raises(RunError, match=r"node 'write'.*index 9"):
        session.run(None, feeds)


# ---- names defined twice: refused, as onnxruntime refuses them ------------------------------


def _relu(source: str, target: str, name: str) -> onnx.NodeProto:
    return helper.make_node("Relu", [source], [target], name=name)


DUPLICATES = {
    "two_nodes": (
        model([_relu("x", "y", "a"), _relu("x", "y", "b")], [info("x", [2])], [info("y", None)]),
        "node 'b'.*'y'",
    ),
    "node_and_input": (
        model([_relu("x", "x", "a"), _relu("x", "y", "b")], [info("x", [2])], [info("y", None)]),
        "node 'a'.*'x'",
    ),
    "node_and_initializer": (
        model(
            [_relu("x", "w", "a"), _relu("w", "y", "b")],
            [info("x", [2])],
            [info("y", None)],
            [ints("w", [1, 2])],
        ),
        "node 'a'.*'w'",
    ),
    "two_initializers": (
        model([_relu("w", "y", "a")], [], [info("y", None)], [ints("w", [1]), ints("w", [2])]),
        "initializer 'w' is defined twice",
    ),
    "in_a_function": (
        model(
            [helper.make_node("F", ["x"], ["y"], domain=LOCAL, name="call")],
            [info("x", [2])],
            [info("y", None)],
            functions=[function("F", ["a"], ["b"], [_relu("a", "b", "p"), _relu("a", "b", "q")])],
        ),
        "node 'q'.*'b'",
    ),
}


@pytest.mark.parametrize("case", sorted(DUPLICATES))
def test_a_value_defined_twice_is_refused_naming_it(case: str) -> None:
    proto, fragment = DUPLICATES[case]
    with pytest.raises(InvalidGraphError, match=fragment):
        _load(proto)
