"""Float32 carriers for nodes whose op lacks a 16-bit float type at the export opset."""

from __future__ import annotations

import itertools

from onnx import TensorProto, helper

from knopt.onnx.legalize import carry_narrow_floats


def test_bfloat16_hard_swish_at_opset_18_computes_in_float32() -> None:
    counter = itertools.count()
    types: dict[str, int] = {"x": TensorProto.BFLOAT16}
    node = helper.make_node("HardSwish", ["x"], ["y"], name="hs")
    nodes = carry_narrow_floats(
        [node], types, 18, lambda w: f"{w}{next(counter)}", lambda w: f"{w}{next(counter)}"
    )
    assert [n.op_type for n in nodes] == ["Cast", "HardSwish", "Cast"]
    widen, carried, narrow = nodes
    assert widen.input[0] == "x" and widen.output[0] == carried.input[0]
    assert carried.output[0] == narrow.input[0] and narrow.output[0] == "y"
    assert narrow.attribute[0].i == TensorProto.BFLOAT16
    assert types["y"] == TensorProto.BFLOAT16


def test_supported_types_are_left_alone() -> None:
    types: dict[str, int] = {"x": TensorProto.FLOAT16, "z": TensorProto.BFLOAT16}
    nodes = [
        helper.make_node("HardSwish", ["x"], ["y"]),  # float16 is allowed at 18
        helper.make_node("HardSwish", ["z"], ["w"]),  # bfloat16 is, from 22
    ]
    result = carry_narrow_floats(nodes, types, 22, str, str)
    assert result == nodes
    assert types["y"] == TensorProto.FLOAT16


def test_inputs_of_unknown_type_leave_outputs_unknown() -> None:
    # A float16 BERT exports size arithmetic whose types are not tracked: no KeyError.
    types: dict[str, int] = {"x": TensorProto.FLOAT16}
    nodes = [helper.make_node("Expand", ["x", "sizes"], ["y"])]
    assert carry_narrow_floats(nodes, types, 18, str, str) == nodes
    assert "y" not in types
