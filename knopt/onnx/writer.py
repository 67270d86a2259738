"""`Writer`: the state of one ONNX export of an optimized graph, and how it holds IR values.

The IR makes broadcasting explicit (`Broadcast`) and keeps constants at their full shape; ONNX
ops broadcast by themselves (numpy's rules, ranks aligned on the right). So the writer holds
each IR value as a `Rep`: an ONNX value that *broadcasts* to the IR value, possibly smaller.
Elementwise consumers read reps as they are; only a consumer that needs the exact shape
(`Writer.exact`) pays for an `Expand`, and a constant only ever needs its smallest form.

Handlers (`knopt.onnx.export_layout`, `export_fused`, `export_ort`) turn IR nodes into ONNX
nodes through the writer; `knopt.onnx.export` runs them over a graph. A handler may leave
earlier ONNX nodes unread (a fused op replaces the nodes it covers): the export removes
what no output needs at the end (`knopt.onnx.export_tidy`).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from knopt.ir.graph import Graph, Node, Value
from knopt.ir.shape import Dim, Shape, is_static
from knopt.onnx.emitter import Emitter

MINIMIZE_MAX_ELEMENTS = 1 << 16  # constants above this keep their axes (the scan costs time)


class Target(enum.Enum):
    """The runtime the written file is for."""

    ONNX = "onnx"  # standard ops only: any ONNX runtime
    ONNXRUNTIME = "onnxruntime"  # also onnxruntime's documented com.microsoft fused ops


@dataclass(eq=False)
class Rep:
    """An ONNX value standing for an IR value: it broadcasts (numpy's rules) to that value.

    Attributes:
        shape: The ONNX value's shape; aligned on the right, each axis is 1 or the IR value's.
        name: The ONNX value's name; None for a constant not written yet.
        array: The contents, for a constant (of shape `shape`).
    """

    shape: Shape
    name: str | None = None
    array: np.ndarray | None = None


def broadcasts_to(small: Shape, big: Shape) -> bool:
    """True if `small` broadcasts to `big` by numpy's rules, ranks aligned on the right."""
    if len(small) > len(big):
        return False
    return all(s in (1, b) for s, b in zip(reversed(small), reversed(big), strict=False))


def joined_shape(shapes: Sequence[Shape], full: Shape) -> Shape:
    """The numpy broadcast of `shapes`, each of which broadcasts to `full`."""
    rank = max((len(s) for s in shapes), default=0)
    dims: list[Dim] = []
    for axis in range(-rank, 0):
        stretched = all(len(s) < -axis or s[axis] == 1 for s in shapes)
        dims.append(1 if stretched else full[axis])
    return tuple(dims)


def minimal_array(array: np.ndarray) -> np.ndarray:
    """The smallest array that broadcasts to `array` with the same values everywhere.

    Leading axes of size 1 go, a single repeated value becomes a 0-d array, and (for arrays
    small enough to scan) every axis along which nothing changes shrinks to size 1.
    """
    if array.size == 0:
        return array
    bits = _bits(array)
    if bool(np.all(bits == bits.reshape(-1)[0])):
        return array.reshape(-1)[:1].reshape(())
    if array.size <= MINIMIZE_MAX_ELEMENTS:
        for axis in range(array.ndim):
            first = np.take(bits, [0], axis=axis)
            if array.shape[axis] > 1 and bool(np.all(bits == first)):
                array = np.take(array, [0], axis=axis)
                bits = np.take(bits, [0], axis=axis)
    ones = 0
    while ones < array.ndim and array.shape[ones] == 1:
        ones += 1
    return array.reshape(array.shape[ones:])


def _bits(array: np.ndarray) -> np.ndarray:
    """The elements as unsigned integers of their width: equal bits, equal values (NaN too)."""
    return np.ascontiguousarray(array).view(np.dtype(f"u{array.dtype.itemsize}"))


class Writer:
    """Holds the rep of every IR value written so far, and writes what handlers ask for.

    Attributes:
        graph: The graph being written.
        em: The ONNX nodes and initializers so far.
        target: The runtime the file is for.
    """

    def __init__(self, graph: Graph, *, opset: int, target: Target) -> None:
        self.graph = graph
        self.em = Emitter(graph, opset=opset)
        self.target = target
        self._reps: dict[Value, Rep] = {}
        self._outputs = set(graph.outputs)

    @property
    def opset(self) -> int:
        """The version of the default ONNX domain being written."""
        return self.em.opset

    def only_read_by(self, value: Value, node: Node) -> bool:
        """True if `node` is the only reader of `value` (a fused op may then absorb it)."""
        return value not in self._outputs and all(user is node for user in value.users())

    def set(self, value: Value, rep: Rep) -> None:
        """Record how `value` is held."""
        self._reps[value] = rep

    def has(self, value: Value) -> bool:
        """True once `value` is held (a pattern may write a later node's value with its own)."""
        return value in self._reps

    def rep(self, value: Value) -> Rep:
        """How `value` is held."""
        return self._reps[value]

    def name(self, value: Value) -> str:
        """An ONNX value that broadcasts to `value`."""
        return self.rep_name(self._reps[value])

    def rep_name(self, rep: Rep) -> str:
        """The ONNX name of `rep`, writing its constant the first time it is needed."""
        if rep.name is None:
            assert rep.array is not None
            rep.name = self.em.constant(rep.array)
        return rep.name

    def array(self, value: Value) -> np.ndarray | None:
        """The contents of `value` at its full shape, if it is a constant."""
        rep = self._reps[value]
        if rep.array is None or not is_static(value.shape):
            return None
        return np.broadcast_to(rep.array, value.shape)  # type: ignore[arg-type]

    def exact(self, value: Value) -> str:
        """An ONNX value of exactly `value`'s shape (expanded if its rep is smaller)."""
        return self.expanded(self._reps[value], value.shape)

    def expanded(self, rep: Rep, shape: Shape) -> str:
        """`rep` expanded to `shape`, which it broadcasts to."""
        if rep.shape == shape:
            return self.rep_name(rep)
        if rep.array is not None and is_static(shape):
            full = np.broadcast_to(rep.array, shape)  # type: ignore[arg-type]
            return self.em.constant(np.array(full))
        missing = len(shape) - len(rep.shape)
        if tuple(shape[missing:]) == tuple(rep.shape) and all(d == 1 for d in shape[:missing]):
            axes = self.em.ints(list(range(missing)))  # only leading axes of size 1 are missing
            return self.em.op("Unsqueeze", [self.rep_name(rep), axes])
        # Expand keeps an axis the rep already has when asked for 1 there (it broadcasts both
        # ways), so only the stretched axes need their sizes, often none of them symbolic.
        padded = (1,) * (len(shape) - len(rep.shape)) + tuple(rep.shape)
        dims = [1 if have == want else want for have, want in zip(padded, shape, strict=True)]
        return self.em.op("Expand", [self.rep_name(rep), self.em.sizes(dims)])

    def constant_rep(self, array: np.ndarray) -> Rep:
        """The rep of a constant: its smallest form, written only once some node reads it."""
        small = minimal_array(np.asarray(array))
        return Rep(tuple(small.shape), array=small)

    def output(self, node: Node, name: str) -> Rep:
        """The rep of a node's result computed as the ONNX value `name` of its exact shape."""
        return Rep(node.output.shape, name)
