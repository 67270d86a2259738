"""Run a static graph on numpy, freeing each intermediate after its last use."""

from __future__ import annotations

import time
import weakref
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from knopt.cpu.kernels import KERNELS, Kernel
from knopt.errors import InputError, MemoryLimitError, RunError
from knopt.ir import op as ops
from knopt.ir.dtype import COMPUTE_TYPE
from knopt.ir.graph import Graph, Node, Value
from knopt.ir.memory import check_value
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
    ops.Int4MatMul,
)


def run_graph(
    graph: Graph,
    feeds: Mapping[str, np.ndarray],
    timings: MutableMapping[str, float] | None = None,
) -> list[np.ndarray]:
    """Evaluate a graph whose shapes are all static.

    Args:
        graph: The graph; bind symbolic sizes first (`knopt.ir.bind_symbols`).
        feeds: One array per graph input, by name, of exactly the declared shape and dtype.
        timings: If given, the seconds spent in each op (by `Op.name`) are added to it.

    Returns:
        The outputs in the graph's order.

    Raises:
        InputError: If a feed is missing or has the wrong shape or dtype.
        RunError: If a node fails on the values it gets (an index out of range), naming it.
        MemoryLimitError: If a node's kernel would need more than the memory budget.
    """
    steps = _STEPS.get(graph)
    if steps is None:
        steps = _STEPS[graph] = _Steps(graph)
    env: list[np.ndarray | None] = [None] * len(graph.nodes)
    for slot, op in steps.inputs:
        env[slot] = _feed(op, feeds)
    for slot, array in steps.leaves:
        env[slot] = array
    with np.errstate(all="ignore"):  # IEEE results (inf, nan) are the answer, not an error
        for step in steps.steps:
            args = [env[i] for i in step.args]
            if timings is None:
                env[step.out] = _evaluate(step, args)  # type: ignore[arg-type]
            else:
                start = time.perf_counter()
                env[step.out] = _evaluate(step, args)  # type: ignore[arg-type]
                name = step.node.op.name
                timings[name] = timings.get(name, 0.0) + time.perf_counter() - start
            for slot in step.free:
                env[slot] = None
    return [np.asarray(env[slot]) for slot in steps.outputs]


def run_node(node: Node, args: list[np.ndarray]) -> np.ndarray:
    """Evaluate one node on its input arrays.

    Raises:
        MemoryLimitError: If its result would be larger than the memory budget.
    """
    check_value(node.output, node.describe())
    narrow = isinstance(node.op, _COMPUTE_OPS) and any(a.dtype in _WIDER for a in args)
    with np.errstate(all="ignore"):
        return _evaluate(_Step.of(node, (), narrow), args)


def _evaluate(step: _Step, args: list[np.ndarray]) -> np.ndarray:
    if step.narrow:
        args = [a.astype(_WIDER[a.dtype]) if a.dtype in _WIDER else a for a in args]
    try:
        result = np.asarray(step.kernel(step.node.op, *args))
    except (RunError, MemoryLimitError) as err:  # the kernel cannot name its node
        raise type(err)(f"{step.node.describe()}: {err}") from err
    if step.narrow or result.dtype != step.dtype:
        result = result.astype(step.dtype)
    if result.shape != step.shape:
        # An elementwise step that read broadcasts away (see _Steps) can come out smaller.
        assert isinstance(step.node.op, _IMPLICIT_BROADCAST), (
            f"{step.node.describe()}: CPU kernel gave shape {result.shape}, "
            f"IR says {step.node.output.type}"
        )
        result = np.broadcast_to(result, step.shape)
    return result


# Elementwise ops whose kernels broadcast like numpy: they may read a Broadcast's input instead
# of its output, since numpy broadcasts operands of equal rank exactly as Broadcast does.
_IMPLICIT_BROADCAST = (ops.BinaryOp, ops.Where)


@dataclass(frozen=True)
class _Step:
    """One node to run: its kernel, the slots it reads and writes, and the slots dead after it."""

    node: Node
    kernel: Kernel
    args: tuple[int, ...]
    out: int
    free: tuple[int, ...]
    narrow: bool  # computed in a wider type and rounded back
    dtype: np.dtype
    shape: tuple[Any, ...]

    @staticmethod
    def of(
        node: Node, args: tuple[int, ...], narrow: bool, out: int = -1, free: tuple[int, ...] = ()
    ) -> _Step:
        """The step running `node`; the slots matter only inside `_Steps`."""
        kernel = KERNELS[type(node.op)]
        shape: tuple[Any, ...] = tuple(node.output.shape)
        return _Step(node, kernel, args, out, free, narrow, node.output.dtype.numpy, shape)


class _Steps:
    """What `run_graph` does for one graph, worked out once.

    Values live in slots (node indices). Leaves (constants, iotas, sizes) are computed once;
    Broadcasts that only feed elementwise ops are skipped; each slot is freed after its last
    reader, unless it is an output.
    """

    def __init__(self, graph: Graph) -> None:
        slot = {node.output: i for i, node in enumerate(graph.nodes)}
        self.inputs: list[tuple[int, ops.Input]] = []
        self.leaves: list[tuple[int, np.ndarray]] = []
        self.outputs = [slot[v] for v in graph.outputs]
        reads: list[tuple[Node, tuple[int, ...]]] = []
        for i, node in enumerate(graph.nodes):
            if isinstance(node.op, ops.Input):
                self.inputs.append((i, node.op))
            elif not node.inputs and not isinstance(node.op, ops.Opaque):
                # (An opaque op may give another value at every run: a random op.)
                leaf = run_node(node, [])
                leaf.flags.writeable = False  # shared by every run
                self.leaves.append((i, leaf))
            else:
                reads.append((node, tuple(slot[_unbroadcast(node, v)] for v in node.inputs)))
        needed = set(self.outputs)
        kept: list[tuple[Node, tuple[int, ...]]] = []
        for node, args in reversed(reads):
            if slot[node.output] in needed:
                needed.update(args)
                kept.append((node, args))
        freed = set(self.outputs)
        self.steps: list[_Step] = []
        for node, args in kept:  # last first, so a slot's first sighting is its last read
            dead = tuple(sorted({a for a in args if a not in freed}))
            freed.update(dead)
            narrow = isinstance(node.op, _COMPUTE_OPS) and any(
                v.dtype.numpy in _WIDER for v in node.inputs
            )
            self.steps.append(_Step.of(node, args, narrow, slot[node.output], dead))
        self.steps.reverse()


def _unbroadcast(node: Node, value: Value) -> Value:
    """The value an input of `node` may be read from: a Broadcast's own input where allowed."""
    producer = value.producer
    if isinstance(node.op, _IMPLICIT_BROADCAST) and isinstance(producer.op, ops.Broadcast):
        return producer.inputs[0]
    return value


_STEPS: weakref.WeakKeyDictionary[Graph, _Steps] = weakref.WeakKeyDictionary()


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
