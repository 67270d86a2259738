"""The values of e-classes on the CPU executor, for comparing the two sides of a rule.

A class is computed by extracting a graph for it (`rebuild_graph`, with a choice that
prefers each class's original IR node, so the left side is the instance as it was built) and
running that graph. Scalar bodies (sort `S`) are evaluated elementwise over the values of the
tensors they load.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from knopt.cpu.elementwise import NUMPY_BINARY, NUMPY_UNARY
from knopt.cpu.executor import run_graph
from knopt.cpu.kernels import KERNELS
from knopt.errors import KnoptError
from knopt.ir import op as ops
from knopt.ir.bind import bind_symbols
from knopt.ir.dtype import DType
from knopt.ir.graph import Graph, Node, Value
from knopt.ir.op import Binary, TensorType, Unary
from knopt.opt.rebuild import rebuild_graph
from knopt.opt.serialized import EGraphData, ENode, Ref, SRef
from knopt.opt.terms import TermTables


class Uncomputable(KnoptError):
    """A class has no acyclic extraction, or no type to check it against."""


class ClassValues:
    """Values of the classes of one e-graph, for one set of inputs."""

    def __init__(
        self,
        data: EGraphData,
        tables: TermTables,
        ir_nodes: Sequence[tuple[int, ENode]],
        graph: Graph,
        feeds: Mapping[str, np.ndarray],
        sizes: Mapping[str, int] | None = None,
    ) -> None:
        self.data = data
        self.tables = tables
        self.graph = graph
        self.feeds = feeds
        self.sizes = dict(sizes or {})  # values of symbolic sizes, for running
        self.original: dict[int, ENode] = {}
        for cls, node in ir_nodes:
            self.original.setdefault(cls, node)
        self._values: dict[int, np.ndarray] = {}

    def choose(self, root: int, avoid: ENode | None = None) -> dict[int, ENode]:
        """One node per class below `root`, original nodes first, without cycles."""
        choice: dict[int, ENode] = {}
        path: set[int] = set()

        def pick(cls: int) -> bool:
            if cls in choice:
                return True
            if cls in path:
                return False
            path.add(cls)
            first = [self.original[cls]] if cls in self.original else []
            for node in first + [n for n in self.data.classes.get(cls, []) if n not in first]:
                if node is not avoid and all(pick(k) for k in self.data.children(node)):
                    choice[cls] = node
                    path.discard(cls)
                    return True
            path.discard(cls)
            return False

        if not pick(root):
            raise Uncomputable(f"e-class {root} has no acyclic extraction")
        return choice

    def type_of(self, cls: int) -> TensorType:
        """A class's type, as typing.egg gave it.

        Raises:
            Uncomputable: If the class has no shape or dtype fact.
        """
        shape, dtype = self.data.shapes.get(cls), self.data.dtypes.get(cls)
        if shape is None or dtype is None:
            raise Uncomputable(f"e-class {cls} has no type")
        return TensorType(tuple(self.tables.size(c) for c in shape), DType[dtype])

    def graph_of(self, cls: int, expected: TensorType | None = None) -> Graph:
        """The graph computing one class, which must have type `expected` if it is untyped.

        (A kernel term a checked rule made is in a class of its own, which no analysis types.)

        Raises:
            Uncomputable: If it has no acyclic extraction or no type.
            OptimizeError: If a chosen node does not type-check as its class says.
        """
        if expected is not None and (cls not in self.data.shapes or cls not in self.data.dtypes):
            # Give it the type it must have; rebuilding checks every node against it.
            self.data.shapes[cls] = tuple(self.tables.dim(d) for d in expected.shape)
            self.data.dtypes[cls] = expected.dtype.name
        t = self.type_of(cls)
        stand_in = Graph([], self.graph.inputs, [Value(t, Node(ops.Input("out", t), ()))], ["out"])
        return rebuild_graph(self.data, self.tables, self.choose(cls), [cls], stand_in).graph

    def value(self, cls: int) -> np.ndarray:
        """A class's value on the inputs."""
        if cls not in self._values:
            graph = self.graph_of(cls)
            if graph.symbols():
                graph = bind_symbols(graph, self.sizes)
            self._values[cls] = run_graph(graph, self.feeds)[0]
        return self._values[cls]

    def body(self, sid: int, shape: tuple[int, ...] | None = None, acc: Any = None) -> np.ndarray:
        """A scalar body evaluated over the tensors it loads (`acc` stands for `SAcc`)."""
        node = self.data.body(sid)
        a = node.args
        if node.op == "SLoad":
            return self.value(a[0].id)
        if node.op == "SAcc":
            if acc is None:
                raise Uncomputable("an epilogue's accumulator outside an epilogue")
            return np.asarray(acc)
        if node.op == "SConst":
            return np.asarray(a[0]).astype(DType[a[1]].numpy)
        parts = [self.body(x.id, shape, acc) for x in a if isinstance(x, SRef)]
        with np.errstate(all="ignore"):
            if node.op == "SUnary":
                return np.asarray(NUMPY_UNARY[Unary[a[0]]](parts[0]))
            if node.op == "SBinary":
                return np.asarray(NUMPY_BINARY[Binary[a[0]]](*_same_type(parts)))
            if node.op == "SClamp":
                return np.asarray(KERNELS[ops.Clamp](ops.Clamp(a[1], a[2]), parts[0]))
            if node.op == "SCast":
                return np.asarray(KERNELS[ops.Cast](ops.Cast(DType[a[1]]), parts[0]))
            return np.where(parts[0], parts[1], parts[2])

    def loads(self, sid: int) -> list[int]:
        """The tensor classes a scalar body reads."""
        return sorted(self.data.loads(sid))


def _same_type(parts: list[np.ndarray]) -> list[np.ndarray]:
    # A scalar constant next to a tensor takes the tensor's dtype, as a kernel would.
    a, b = parts
    if a.ndim == 0 and b.ndim > 0:
        a = a.astype(b.dtype)
    elif b.ndim == 0 and a.ndim > 0:
        b = b.astype(a.dtype)
    return [a, b]


def refs(values: Sequence[Any]) -> list[int]:
    """The tensor class ids among fact arguments."""
    return [v.id for v in values if isinstance(v, Ref)]
