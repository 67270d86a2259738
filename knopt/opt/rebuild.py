"""From an extraction back to an IR graph: one builder call per chosen e-node.

Folded classes (in `folds`, with every child folded too) are computed here on the CPU executor
and become constants; views of folded values stay views, so a broadcast constant is never
materialized at full size, and an elementwise op (or a Gather of broadcast indices) over
broadcast constants folds at their sources' size and is broadcast after. Every node is
re-typed by the IR's own `Op.infer`, and its type must equal what typing.egg said of its
class: a mismatch means an unsound rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from knopt.cpu.executor import run_node
from knopt.errors import InvalidGraphError, OptimizeError
from knopt.ir import op as ops
from knopt.ir.builder import GraphBuilder
from knopt.ir.dtype import DType
from knopt.ir.graph import Graph, Node, Value
from knopt.ir.kernel import KERNEL_CONSTRUCTORS, KernelKind
from knopt.ir.op import Binary, TensorType, Unary
from knopt.ir.shape import Dim
from knopt.opt.serialized import EGraphData, ENode
from knopt.opt.terms import DECODERS, TermTables, decode_main_op, enum_member, prologue_of

_VIEWS = frozenset(cls.__name__ for cls in ops.VIEW_OPS)


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
        if node.op in KERNEL_CONSTRUCTORS:
            builder.scope = cls
            try:
                result = self._expand_kernel(cls, node)
            finally:
                builder.scope = None
            self._check_type(cls, node, result)
            return result
        if node.op == "Opaque":  # from its table, as a constant: nothing to decode
            opaque = self.tables.opaques[node.args[0]]
            result = builder.apply(opaque, [self.values[k] for k in node.children()])
            self._check_type(cls, node, result)
            return result
        decode = DECODERS.get(node.op)
        if decode is None:
            raise OptimizeError(
                f"e-class {cls}: {node.op} has no IR op to rebuild; add its decoder to "
                "DECODERS in knopt/opt/terms.py"
            )
        op = decode(self, node.args)
        inputs = [self.values[k] for k in node.children()]
        folded = (
            cls in self.data.folds
            and all(k in self.constant for k in node.children())
            and (node.op in _VIEWS or all(_static(v) for v in inputs))
        )
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
        shape = self.shape(self.data.shapes[cls])
        kind = KernelKind.of_constructor(node.op)
        main = decode_main_op(self, node)
        epilogue = node.args[-1]
        if kind is None or main is None:
            return self._expand(node.args[0].id, shape, None)
        if kind.has_prologue:
            prologue = prologue_of(node)
            loads = self.data.loads(prologue.id)
            source = self.values[min(loads)].shape if loads else shape
            operands = [self._expand(prologue.id, source, None)]
        else:
            operands = [self.values[k] for k in node.children()]
        return self._expand(epilogue.id, shape, self.builder.apply(main, operands))

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
            return b.unary(enum_member(Unary, a[0]), self._expand(a[1].id, shape, acc))
        if node.op == "SBinary":
            left, right = (self._expand(x.id, shape, acc) for x in a[1:])
            return b.apply(ops.BinaryOp(enum_member(Binary, a[0])), [left, right])
        if node.op == "SClamp":
            return b.apply(ops.Clamp(a[1], a[2]), [self._expand(a[0].id, shape, acc)])
        if node.op == "SCast":
            return b.cast(self._expand(a[0].id, shape, acc), DType[a[1]])
        assert node.op == "SWhere", node.op
        parts = [self._expand(x.id, shape, acc) for x in a]
        return b.apply(ops.Where(), parts)

    def _fold(self, op: ops.Op, inputs: list[Value]) -> Value:
        narrow = _narrow_fold(op, inputs)
        if narrow is not None:
            small, shape = narrow
            return self.builder.broadcast(self.builder.constant(small), shape)
        return self.builder.constant(_evaluate(op, inputs, [v.type for v in inputs]))

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


def _evaluate(op: ops.Op, inputs: list[Value], types: list[TensorType]) -> np.ndarray:
    """`op` run on the CPU executor over its constant inputs, each read as of `types`.

    A type smaller than its input's value (the source of a broadcast) reads the value's
    first element along each axis it lacks; the values there are all equal.
    """
    arrays = []
    for value, kind in zip(inputs, types, strict=True):
        array = _constant_array(value)
        arrays.append(array[tuple(slice(0, n) for n in kind.shape)])
    scratch = Node(op, tuple(inputs))
    scratch.output = Value(op.infer(types, op.name), scratch)
    return run_node(scratch, arrays)


def _narrow_fold(op: ops.Op, inputs: list[Value]) -> tuple[np.ndarray, tuple[int, ...]] | None:
    """Fold an op over broadcast constants at the size of what they broadcast, if smaller.

    An elementwise op commutes with broadcasting: over broadcasts of constants it is the
    broadcast of the op over their sources, at the shape that joins theirs. A Gather whose
    indices are a broadcast is the broadcast of the Gather of their source. Returns the small
    result and the shape to broadcast it to, or None where that is not smaller.
    """
    sources = [
        v.producer.inputs[0] if isinstance(v.producer.op, ops.Broadcast) else v for v in inputs
    ]
    if type(op) in ops.ELEMENTWISE_OPS:
        joint = tuple(max(sizes) for sizes in zip(*(v.type.shape for v in sources), strict=True))
        types = [TensorType(joint, v.type.dtype) for v in inputs]
    elif isinstance(op, ops.Gather):
        types = [inputs[0].type, sources[1].type]
    else:
        return None
    full = op.infer([v.type for v in inputs], op.name).shape
    small = op.infer(types, op.name).shape
    if _count(small) >= _count(full):
        return None
    return _evaluate(op, inputs, types), _sizes(full)


def _sizes(shape: Sequence[Dim]) -> tuple[int, ...]:
    """A folded value's shape (all numbers: only static values fold)."""
    assert all(isinstance(n, int) for n in shape), shape
    return tuple(int(n) for n in shape)  # type: ignore[arg-type]


def _count(shape: Sequence[Dim]) -> int:
    return int(np.prod(_sizes(shape), dtype=np.int64))


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


@dataclass
class Rebuilt:
    """An extraction as an IR graph.

    Attributes:
        graph: The graph, with the original's inputs and output names.
        kernel_of: For nodes a fused kernel was written out into: that kernel's class.
        class_of: Each node's e-class where it is the chosen node's own op.
    """

    graph: Graph
    kernel_of: dict[Node, int]
    class_of: dict[Node, int]


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
    class_of = {v.producer: c for c, v in rebuilder.values.items()}
    kernel_of = {node: int(cls) for node, cls in rebuilder.builder.scopes.items()}  # type: ignore[call-overload]
    return Rebuilt(graph, kernel_of, class_of)


def _static(value: Value) -> bool:
    """Whether `value`'s shape is all numbers: only such values fold into constants.

    A constant splatted to a symbolic size (a scale broadcast over the batch) is a view of a
    constant, but an op over it has no array to compute until the size is known.
    """
    return all(isinstance(d, int) for d in value.type.shape)
