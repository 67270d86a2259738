"""Small models of what the fixtures lack (functions, If, Loop, Scan, shape arithmetic on
symbolic sizes), built in code, for the mutation fuzzer to start from as well.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.hostile.builders import I64, LOCAL, function, info, ints, model

BOOL = TensorProto.BOOL


def _functions() -> onnx.ModelProto:
    half = numpy_helper.from_array(np.array(0.5, np.float32), "h")
    gelu = function(
        "Gelu",
        ["a"],
        ["b"],
        [
            helper.make_node("Constant", [], ["h"], value=half),
            helper.make_node("Mul", ["a", "h"], ["m"]),
            helper.make_node("Erf", ["m"], ["e"]),
            helper.make_node("Add", ["e", "m"], ["b"]),
        ],
    )
    twice = function(
        "Twice",
        ["a"],
        ["b"],
        [
            helper.make_node("Gelu", ["a"], ["t"], domain=LOCAL),
            helper.make_node("Gelu", ["t"], ["b"], domain=LOCAL),
        ],
    )
    nodes = [
        helper.make_node("Twice", ["x"], ["t"], domain=LOCAL, name="twice"),
        helper.make_node("Gelu", ["t"], ["y"], domain=LOCAL, name="gelu"),
    ]
    return model(nodes, [info("x", ["n", 8])], [info("y", ["n", 8])], functions=[twice, gelu])


def _branches() -> onnx.ModelProto:
    then = helper.make_graph([helper.make_node("Neg", ["x"], ["a"])], "then", [], [info("a", None)])
    other = helper.make_graph(
        [helper.make_node("Mul", ["x", "x"], ["b"])], "else", [], [info("b", None)]
    )
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0, name="sum"),
        helper.make_node("Greater", ["s", "zero"], ["c"], name="positive"),
        helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="if"),
    ]
    zero = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
    return model(nodes, [info("x", [3, 4])], [info("y", [3, 4])], [zero])


def _loop() -> onnx.ModelProto:
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond"], ["cond_out"]),
            helper.make_node("Add", ["acc", "x"], ["acc_out"]),
            helper.make_node("Relu", ["acc_out"], ["scan_out"]),
        ],
        "body",
        [info("i", [], I64), info("cond", [], BOOL), info("acc", [2, 3])],
        [info("cond_out", [], BOOL), info("acc_out", [2, 3]), info("scan_out", [2, 3])],
    )
    loop = helper.make_node("Loop", ["trips", "", "x"], ["y", "steps"], body=body, name="loop")
    return model(
        [loop], [info("x", [2, 3])], [info("y", [2, 3]), info("steps", None)], [ints("trips", 4)]
    )


def _scan() -> onnx.ModelProto:
    body = helper.make_graph(
        [
            helper.make_node("Add", ["total", "row"], ["next"]),
            helper.make_node("Identity", ["next"], ["out"]),
        ],
        "body",
        [info("total", [4]), info("row", [4])],
        [info("next", [4]), info("out", [4])],
    )
    scan = helper.make_node(
        "Scan", ["init", "x"], ["y", "rows"], body=body, num_scan_inputs=1, name="scan"
    )
    init = numpy_helper.from_array(np.zeros(4, np.float32), "init")
    return model([scan], [info("x", [5, 4])], [info("y", [4]), info("rows", [5, 4])], [init])


def _shapes() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0, name="batch"),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"], name="unsqueeze"),
        helper.make_node("Concat", ["n1", "minus"], ["target"], axis=0, name="target"),
        helper.make_node("Reshape", ["x", "target"], ["flat"], name="flatten"),
        helper.make_node("Slice", ["flat", "start", "stop", "one"], ["part"], name="slice"),
        helper.make_node("Pad", ["part", "pads"], ["padded"], name="pad"),
        helper.make_node("Resize", ["padded", "", "scales"], ["y"], mode="linear", name="resize"),
    ]
    scales = numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "scales")
    initializers = [
        ints("zero", 0),
        ints("axes", [0]),
        ints("minus", [-1]),
        ints("start", [1]),
        ints("stop", [7]),
        ints("one", [1]),
        ints("pads", [0, 1, 0, 2]),
        scales,
    ]
    return model(nodes, [info("x", ["n", 2, 4])], [info("y", None)], initializers)


def corpus() -> list[tuple[str, bytes]]:
    """(name, serialized model) of each model here."""
    made = {
        "functions": _functions(),
        "branches": _branches(),
        "loop": _loop(),
        "scan": _scan(),
        "shapes": _shapes(),
    }
    return [(f"{name}.onnx", proto.SerializeToString()) for name, proto in made.items()]
