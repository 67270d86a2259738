"""Model-local ONNX functions: checked to terminate before they are inlined (`nodes.py`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import networkx as nx
import onnx

from knopt.errors import InvalidModelError, UnsupportedModelError

MAX_NESTING = 64  # function calls and subgraphs inside each other; real models nest a few


def check_functions(model: onnx.ModelProto) -> None:
    """Check that inlining the model's functions terminates, without deep recursion.

    Functions must be defined once and never call themselves (directly or through others),
    and calls and subgraphs may nest at most `MAX_NESTING` deep.

    Raises:
        InvalidModelError: If a function is defined twice or calls itself (through others).
        UnsupportedModelError: If calls and subgraphs nest deeper than `MAX_NESTING`.
    """
    functions: dict[tuple[str, str], onnx.FunctionProto] = {}
    for f in model.functions:
        key = (f.domain, f.name)
        if key in functions:
            raise InvalidModelError(f"model-local function '{_name(key)}' is defined twice")
        functions[key] = f
    profiles = {key: _profile(f.node, functions) for key, f in functions.items()}
    depths = _depths(profiles)
    depth = _depth(_profile(model.graph.node, functions), depths)
    if depth > MAX_NESTING:
        raise UnsupportedModelError(
            f"the model nests function calls and subgraphs {depth} deep; knopt inlines at "
            f"most {MAX_NESTING} levels"
        )


_Key = tuple[str, str]
_Profile = tuple[int, list[tuple[_Key, int]]]  # deepest subgraph level; calls with their level


def _name(key: _Key) -> str:
    return f"{key[0]}.{key[1]}" if key[0] else key[1]


def _profile(nodes: Sequence[onnx.NodeProto], functions: Mapping[_Key, object]) -> _Profile:
    """How deep the subgraphs of `nodes` go, and which functions they call at which level."""
    deepest, calls = 0, []
    stack = [(node, 0) for node in nodes]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        key = ("" if node.domain == "ai.onnx" else node.domain, node.op_type)
        if key in functions:
            calls.append((key, level))
        for attr in node.attribute:
            for graph in [attr.g] if attr.HasField("g") else list(attr.graphs):
                stack.extend((inner, level + 1) for inner in graph.node)
    return deepest, calls


def _depth(profile: _Profile, depths: Mapping[_Key, int]) -> int:
    deepest, calls = profile
    return max([deepest, *(level + 1 + depths[callee] for callee, level in calls)])


def _depths(profiles: Mapping[_Key, _Profile]) -> dict[_Key, int]:
    """The nesting depth of each function's body, callees first.

    Raises:
        InvalidModelError: If a function calls itself, directly or through others.
    """
    calls = nx.DiGraph()
    calls.add_nodes_from(profiles)
    calls.add_edges_from(
        (key, callee) for key, (_, called) in profiles.items() for callee, _ in called
    )
    try:
        cycle = [caller for caller, _ in nx.find_cycle(calls)]
    except nx.NetworkXNoCycle:
        depths: dict[_Key, int] = {}
        for key in reversed(list(nx.topological_sort(calls))):
            depths[key] = _depth(profiles[key], depths)
        return depths
    path = " -> ".join(_name(k) for k in [*cycle, cycle[0]])
    raise InvalidModelError(
        f"model-local function '{_name(cycle[0])}' calls itself ({path}); ONNX "
        "functions cannot be recursive"
    )
