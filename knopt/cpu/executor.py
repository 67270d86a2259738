"""Run a static graph on numpy, freeing each intermediate after its last use."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from knopt.cpu.kernels import KERNELS
from knopt.errors import InputError
from knopt.ir import op as ops
from knopt.ir.dtype import COMPUTE_TYPE
from knopt.ir.graph import Graph, Node
from knopt.ir.shape import format_shape, is_static

# numpy dtypes (bfloat16, float8, int4...) computed in a wider type by the ops below.
_WIDER = {dtype.numpy: wide for dtype, wide in COMPUTE_TYPE.items()}

# Ops whose arithmetic numpy cannot do in the narrow types directly: computed wider, rounded back.
_COMPUTE_OPS = (
    ops.UnaryOp,
    ops.BinaryOp,
    ops.Clamp,
    ops.Reduce,
    ops.CumSum,
    ops.MatMul,
    ops.Conv,
    ops.Pool,
    ops.Softmax,
    ops.LayerNorm,
    ops.RmsNorm,
    ops.Attention,
)


def run_graph(graph: Graph, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Evaluate a graph whose shapes are all static.

    Args:
        graph: The graph; bind symbolic sizes first (`knopt.ir.bind_symbols`).
        feeds: One array per graph input, by name, of exactly the declared shape and dtype.

    Returns:
        The outputs in the graph's order.

    Raises:
        InputError: If a feed is missing or has the wrong shape or dtype.
    """
    last_use: dict[int, int] = {}
    for index, node in enumerate(graph.nodes):
        for value in node.inputs:
            last_use[id(value)] = index
    keep = {id(v) for v in graph.outputs}
    env: dict[int, np.ndarray] = {}
    for index, node in enumerate(graph.nodes):
        if isinstance(node.op, ops.Input):
            result = _feed(node.op, feeds)
        else:
            result = run_node(node, [env[id(v)] for v in node.inputs])
        env[id(node.output)] = result
        for key in {id(v) for v in node.inputs}:
            if last_use[key] == index and key not in keep:
                del env[key]
    return [np.asarray(env[id(v)]) for v in graph.outputs]


def run_node(node: Node, args: list[np.ndarray]) -> np.ndarray:
    """Evaluate one node on its input arrays."""
    op = node.op
    narrow = isinstance(op, _COMPUTE_OPS) and any(a.dtype in _WIDER for a in args)
    if narrow:
        args = [a.astype(_WIDER[a.dtype]) if a.dtype in _WIDER else a for a in args]
    result = np.asarray(KERNELS[type(op)](op, *args))
    expected = node.output.type
    if narrow or result.dtype != expected.dtype.numpy:
        result = result.astype(expected.dtype.numpy)
    assert result.shape == expected.shape, (
        f"{node.describe()}: CPU kernel gave shape {result.shape}, IR says {expected}"
    )
    return result


def _feed(op: ops.Input, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
    if op.input_name not in feeds:
        raise InputError(f"input '{op.input_name}' is missing (expected {op.tensor_type})")
    array = np.asarray(feeds[op.input_name])
    expected = op.tensor_type
    assert is_static(expected.shape), "bind symbolic sizes before running"
    if array.shape != expected.shape:
        raise InputError(
            f"input '{op.input_name}' has shape {list(array.shape)}, "
            f"expected {format_shape(expected.shape)}"
        )
    if array.dtype != expected.dtype.numpy:
        raise InputError(
            f"input '{op.input_name}' has dtype {array.dtype}, expected {expected.dtype.numpy}"
        )
    return array
