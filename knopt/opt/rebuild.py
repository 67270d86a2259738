"""From an extraction back to an IR graph: one builder call per chosen e-node.

Folded classes (in `folds`, with every child folded too) are computed here on the CPU executor
and become constants; views of folded values stay views, so a broadcast constant is never
materialized at full size. Every node is re-typed by the IR's own `Op.infer`, and its type
must equal what typing.egg said of its class: a mismatch means an unsound rule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from knopt.cpu.executor import run_node
from knopt.errors import InvalidGraphError, OptimizeError
from knopt.ir import op as ops
from knopt.ir.builder import GraphBuilder
from knopt.ir.dtype import DType
from knopt.ir.graph import Graph, Node, Value
from knopt.ir.op import Binary, PadMode, PoolKind, Reduction, ScatterReduction, TensorType, Unary
from knopt.ir.shape import Dim
from knopt.opt.serialized import EGraphData, ENode
from knopt.opt.terms import ENUM_PREFIX, TermTables

_VIEWS = frozenset({"View", "Broadcast", "Permute", "Slice", "Flip"})
KERNEL_OPS = frozenset(
    {"KElem", "KReduce", "KSoftmax", "KLayerNorm", "KRmsNorm", "KMatMul", "KConv"}
)


def _enum(kind: type[Any], name: str) -> Any:
    return kind[name[len(ENUM_PREFIX[kind]) :]]


def _pairs(flat: Sequence[int]) -> tuple[tuple[int, int], ...]:
    return tuple((flat[i], flat[i + 1]) for i in range(0, len(flat), 2))


Decoder = Callable[["_Rebuilder", tuple[Any, ...]], ops.Op]


class _Rebuilder:
    def __init__(
        self, data: EGraphData, tables: TermTables, choice: dict[int, ENode], original: Graph
    ) -> None:
        self.data = data
        self.tables = tables
        self.choice = choice
        self.builder = GraphBuilder(original.name)
        self.values: dict[int, Value] = {}
        self.constant: set[int] = set()  # classes whose built value is known while compiling
        self.inputs: dict[str, Value] = {}
        for value in original.inputs:
            op = value.producer.op
            assert isinstance(op, ops.Input)
            t = op.tensor_type
            self.inputs[op.input_name] = self.builder.input(op.input_name, t.shape, t.dtype)

    def size(self, code: int) -> Dim:
        return self.tables.size(code)

    def shape(self, codes: Sequence[int]) -> tuple[Dim, ...]:
        return tuple(self.size(c) for c in codes)

    def build(self, cls: int) -> Value:
        """The value of a class, building what it needs first (iteratively)."""
        stack = [(cls, False)]
        while stack:
            c, ready = stack.pop()
            if c in self.values:
                continue
            node = self.choice[c]
            kids = [k for k in self.data.children(node) if k not in self.values]
            if ready or not kids:
                self.values[c] = self._make(c, node)
            else:
                stack.append((c, True))
                stack.extend((k, False) for k in kids)
        return self.values[cls]

    def _make(self, cls: int, node: ENode) -> Value:
        builder = self.builder
        if node.op == "Input":
            return self.inputs[node.args[0]]
        if node.op in ("Splat", "Constant"):
            self.constant.add(cls)
            if node.op == "Constant":
                return builder.constant(self.tables.constants[node.args[0]])
            value, shape, dtype = node.args
            return _splat(builder, value, self.shape(shape), DType[dtype])
        if node.op in KERNEL_OPS:
            builder.scope = cls
            try:
                result = self._expand_kernel(cls, node)
            finally:
                builder.scope = None
            self._check_type(cls, node, result)
            return result
        op = DECODERS[node.op](self, node.args)
        inputs = [self.values[k] for k in node.children()]
        folded = cls in self.data.folds and all(k in self.constant for k in node.children())
        if folded:
            self.constant.add(cls)
        try:
            if folded and node.op not in _VIEWS:
                result = self._fold(op, inputs)
            else:
                result = builder.apply(op, inputs)
        except InvalidGraphError as err:
            raise OptimizeError(
                f"e-class {cls}: the chosen {node.op} node does not type-check ({err}); a rule "
                "that made it is unsound"
            ) from err
        self._check_type(cls, node, result)
        return result

    def _expand_kernel(self, cls: int, node: ENode) -> Value:
        """A fused kernel written out as IR ops (built in the kernel's own builder scope)."""
        b = self.builder
        shape = self.shape(self.data.shapes[cls])
        a = node.args
        if node.op == "KElem":
            return self._expand(a[0].id, shape, None)
        if node.op == "KMatMul":
            acc = b.matmul(self.values[a[0].id], self.values[a[1].id])
            return self._expand(a[2].id, shape, acc)
        if node.op == "KConv":
            conv = DECODERS["Conv"](self, a[:7])
            acc = b.apply(conv, [self.values[a[0].id], self.values[a[1].id]])
            return self._expand(a[7].id, shape, acc)
        prologue, epilogue = a[1 if node.op == "KReduce" else 0], a[-1]
        loads = self.data.loads(prologue.id)
        source = self.values[min(loads)].shape if loads else shape
        x = self._expand(prologue.id, source, None)
        main: ops.Op
        if node.op == "KReduce":
            main = ops.Reduce(_enum(Reduction, a[0]), tuple(a[2]))
        elif node.op == "KSoftmax":
            main = ops.Softmax(a[1])
        elif node.op == "KLayerNorm":
            main = ops.LayerNorm(a[1], a[2])
        else:
            main = ops.RmsNorm(a[1], a[2])
        return self._expand(epilogue.id, shape, b.apply(main, [x]))

    def _expand(self, sid: int, shape: tuple[Dim, ...], acc: Value | None) -> Value:
        """A scalar body as IR ops over tensors of `shape` (`acc` stands for SAcc)."""
        node = self.data.body(sid)
        a, b = node.args, self.builder
        if node.op == "SLoad":
            return self.values[a[0].id]
        if node.op == "SAcc":
            assert acc is not None, "SAcc outside an epilogue"
            return acc
        if node.op == "SConst":
            return _splat(b, a[0], shape, DType[a[1]])
        if node.op == "SUnary":
            return b.unary(_enum(Unary, a[0]), self._expand(a[1].id, shape, acc))
        if node.op == "SBinary":
            left, right = (self._expand(x.id, shape, acc) for x in a[1:])
            return b.apply(ops.BinaryOp(_enum(Binary, a[0])), [left, right])
        if node.op == "SClamp":
            return b.apply(ops.Clamp(a[1], a[2]), [self._expand(a[0].id, shape, acc)])
        if node.op == "SCast":
            return b.cast(self._expand(a[0].id, shape, acc), DType[a[1]])
        assert node.op == "SWhere", node.op
        parts = [self._expand(x.id, shape, acc) for x in a]
        return b.apply(ops.Where(), parts)

    def _fold(self, op: ops.Op, inputs: list[Value]) -> Value:
        arrays = [_constant_array(v) for v in inputs]
        scratch = Node(op, tuple(inputs))
        scratch.output = Value(op.infer([v.type for v in inputs], op.name), scratch)
        return self.builder.constant(run_node(scratch, arrays))

    def _check_type(self, cls: int, node: ENode, value: Value) -> None:
        shape = self.data.shapes.get(cls)
        dtype = self.data.dtypes.get(cls)
        if shape is None or dtype is None:
            return
        expected = TensorType(self.shape(shape), DType[dtype])
        if value.type != expected:
            raise OptimizeError(
                f"e-class {cls}: its {node.op} node computes {value.type} but the class was "
                f"typed {expected}; a rule that merged them is unsound"
            )


def _constant_array(value: Value) -> np.ndarray:
    """The array of a value that is a constant, possibly seen through views (iteratively)."""
    views: list[Node] = []
    while not isinstance(value.producer.op, ops.Constant):
        views.append(value.producer)
        (value,) = value.producer.inputs
    array = value.producer.op.data.array
    for view in reversed(views):
        array = run_node(view, [array])
    return array


def _splat(builder: GraphBuilder, value: float, shape: tuple[Dim, ...], dtype: DType) -> Value:
    with np.errstate(over="ignore"):  # a float beyond a narrow type is inf, as when computed
        one = builder.constant(np.array(value).astype(dtype.numpy).reshape((1,) * len(shape)))
    return builder.broadcast(one, shape) if shape != (1,) * len(shape) else one


DECODERS: dict[str, Decoder] = {
    "Iota": lambda r, a: ops.Iota(r.size(a[0]), DType[a[1]]),
    "Sizes": lambda r, a: ops.Sizes(r.shape(a[0]), DType[a[1]]),
    "View": lambda r, a: ops.View(r.shape(a[1])),
    "Broadcast": lambda r, a: ops.Broadcast(r.shape(a[1])),
    "Permute": lambda r, a: ops.Permute(tuple(a[1])),
    "Slice": lambda r, a: ops.Slice(a[1], r.size(a[2]), r.size(a[3]), a[4]),
    "Flip": lambda r, a: ops.Flip(a[1]),
    "Pad": lambda r, a: ops.Pad(_pairs(a[1]), _enum(PadMode, a[2]), a[3]),
    "Concat": lambda r, a: ops.Concat(a[1]),
    "Gather": lambda r, a: ops.Gather(a[2]),
    "Scatter": lambda r, a: ops.Scatter(a[3], _enum(ScatterReduction, a[4])),
    "Cast": lambda r, a: ops.Cast(DType[a[1]]),
    "UnaryOp": lambda r, a: ops.UnaryOp(_enum(Unary, a[0])),
    "BinaryOp": lambda r, a: ops.BinaryOp(_enum(Binary, a[0])),
    "Clamp": lambda r, a: ops.Clamp(a[1], a[2]),
    "Where": lambda r, a: ops.Where(),
    "Reduce": lambda r, a: ops.Reduce(_enum(Reduction, a[0]), tuple(a[2])),
    "ArgReduce": lambda r, a: ops.ArgReduce(a[1], a[2], a[3]),
    "ArgSort": lambda r, a: ops.ArgSort(a[1], a[2]),
    "CumSum": lambda r, a: ops.CumSum(a[1], a[2], a[3]),
    "MatMul": lambda r, a: ops.MatMul(),
    "Conv": lambda r, a: ops.Conv(tuple(a[2]), _pairs(a[3]), tuple(a[4]), a[5]),
    "Pool": lambda r, a: ops.Pool(
        _enum(PoolKind, a[0]), tuple(a[2]), tuple(a[3]), _pairs(a[4]), tuple(a[5]), a[6], a[7]
    ),
    "Softmax": lambda r, a: ops.Softmax(a[1]),
    "LayerNorm": lambda r, a: ops.LayerNorm(a[1], a[2]),
    "RmsNorm": lambda r, a: ops.RmsNorm(a[1], a[2]),
    "Attention": lambda r, a: ops.Attention(a[4]),
}


@dataclass
class Rebuilt:
    """An extraction as an IR graph.

    Attributes:
        graph: The graph, with the original's inputs and output names.
        kernel_of: For nodes a fused kernel was written out into: that kernel's class.
        class_of: Each node's e-class where it is the chosen node's own op.
    """

    graph: Graph
    kernel_of: dict[int, int]
    class_of: dict[int, int]


def rebuild_graph(
    data: EGraphData,
    tables: TermTables,
    choice: dict[int, ENode],
    roots: Sequence[int],
    original: Graph,
) -> Rebuilt:
    """The IR graph of an extraction; fused kernels are written out as their ops.

    Raises:
        OptimizeError: If a chosen node does not type-check as its class says (an unsound
            rule).
    """
    rebuilder = _Rebuilder(data, tables, choice, original)
    for name, root in zip(original.output_names, roots, strict=True):
        rebuilder.builder.output(rebuilder.build(root), name)
    graph = rebuilder.builder.build()
    for before, after in zip(original.outputs, graph.outputs, strict=True):
        if before.type != after.type:
            raise OptimizeError(f"optimized output has type {after.type}, not {before.type}")
    class_of = {id(v.producer): c for c, v in rebuilder.values.items()}
    kernel_of = {k: int(v) for k, v in rebuilder.builder.scopes.items()}  # type: ignore[call-overload]
    return Rebuilt(graph, kernel_of, class_of)
