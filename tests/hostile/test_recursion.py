"""Long graphs need no deep recursion, and functions that call themselves are refused by name."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

import knopt
from knopt.cli import main
from knopt.errors import InvalidModelError, UnsupportedModelError
from knopt.onnx.function import MAX_NESTING
from tests.hostile.builders import LOCAL, function, info, model

CHAIN = ("Sin", "Neg", "Cos", "Tanh")
NUMPY = {"Sin": np.sin, "Neg": np.negative, "Cos": np.cos, "Tanh": np.tanh}


def _chain(length: int) -> onnx.ModelProto:
    names = ["x", *(f"v{i}" for i in range(length))]
    nodes = [
        helper.make_node(CHAIN[i % len(CHAIN)], [a], [b], name=f"op{i}")
        for i, (a, b) in enumerate(itertools.pairwise(names))
    ]
    return model(nodes, [info("x", [3, 4])], [info(names[-1], [3, 4])])


@pytest.mark.slow
def test_a_chain_of_5000_ops_loads_optimizes_runs_and_saves(tmp_path: Path) -> None:
    x = np.random.default_rng(5).standard_normal((3, 4)).astype(np.float32)
    expected = x
    for i in range(5000):
        expected = NUMPY[CHAIN[i % len(CHAIN)]](expected)
    graph = knopt.load(_chain(5000).SerializeToString())
    (plain,) = knopt.compile(graph).run(None, {"x": x})
    np.testing.assert_allclose(plain, expected, rtol=1e-5, atol=1e-6)
    result = knopt.optimize(graph, ilp=False)
    (optimized,) = knopt.compile(result.graph).run(None, {"x": x})
    np.testing.assert_allclose(optimized, plain, rtol=1e-5, atol=1e-6)
    knopt.save(result, tmp_path / "chain.onnx")
    (reloaded,) = knopt.compile(tmp_path / "chain.onnx").run(None, {"x": x})
    np.testing.assert_allclose(reloaded, plain, rtol=1e-5, atol=1e-6)


def _calls(name: str, callee: str) -> onnx.FunctionProto:
    return function(name, ["a"], ["b"], [helper.make_node(callee, ["a"], ["b"], domain=LOCAL)])


def _with_functions(*functions: onnx.FunctionProto, entry: str = "F") -> onnx.ModelProto:
    call = helper.make_node(entry, ["x"], ["y"], domain=LOCAL, name="call")
    return model([call], [info("x", [2])], [info("y", [2])], functions=functions)


def _in_a_branch(name: str, callee: str) -> onnx.FunctionProto:
    branch = helper.make_graph(
        [helper.make_node(callee, ["a"], ["b"], domain=LOCAL)], "then", [], [info("b", [2])]
    )
    nodes = [
        helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", 9, [], [True])),
        helper.make_node("If", ["c"], ["b"], then_branch=branch, else_branch=branch),
    ]
    return function(name, ["a"], ["b"], nodes)


RECURSIVE = {
    "itself": ([_calls("F", "F")], "local.F -> local.F"),
    "through_another": ([_calls("F", "G"), _calls("G", "F")], "local.F -> local.G -> local.F"),
    "from_a_subgraph": ([_in_a_branch("F", "F")], "local.F -> local.F"),
    "below_the_entry": ([_calls("F", "G"), _calls("G", "G")], "local.G -> local.G"),
}


@pytest.mark.parametrize("case", sorted(RECURSIVE))
def test_recursive_functions_are_refused_naming_the_cycle(case: str) -> None:
    functions, cycle = RECURSIVE[case]
    data = _with_functions(*functions).SerializeToString()
    with pytest.raises(InvalidModelError, match="cannot be recursive") as caught:
        knopt.load(data)
    assert cycle in str(caught.value)


@pytest.mark.parametrize("command", ["info", "optimize", "run"])
def test_every_command_refuses_a_recursive_function_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    path = tmp_path / "recursive.onnx"
    path.write_bytes(_with_functions(_calls("F", "F")).SerializeToString())
    np.savez(tmp_path / "in.npz", x=np.ones(2, np.float32))
    extra = {"run": ["--inputs", str(tmp_path / "in.npz")], "optimize": [], "info": []}
    assert main([command, str(path), *extra[command]]) == 1
    err = capsys.readouterr().err
    assert "calls itself" in err
    assert "Traceback" not in err


def _nested(depth: int) -> onnx.ModelProto:
    functions = [_calls(f"F{i}", f"F{i + 1}") for i in range(depth)]
    functions.append(function(f"F{depth}", ["a"], ["b"], [helper.make_node("Neg", ["a"], ["b"])]))
    return _with_functions(*functions, entry="F0")


def test_functions_nested_within_the_limit_are_inlined() -> None:
    graph = knopt.load(_nested(MAX_NESTING - 2).SerializeToString())
    (y,) = knopt.compile(graph).run(None, {"x": np.array([1.0, -2.0], np.float32)})
    np.testing.assert_array_equal(y, [-1.0, 2.0])


def test_functions_nested_beyond_the_limit_are_refused() -> None:
    with pytest.raises(UnsupportedModelError, match=f"at most {MAX_NESTING} levels"):
        knopt.load(_nested(500).SerializeToString())


def test_a_function_defined_twice_is_refused() -> None:
    data = _with_functions(_calls("F", "G"), _calls("F", "H")).SerializeToString()
    with pytest.raises(InvalidModelError, match=r"'local\.F' is defined twice"):
        knopt.load(data)
