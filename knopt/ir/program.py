"""The kernel Program: what extraction chooses, what the CPU executor and the GPU backend run.

A `Program` is a topologically ordered list of `Kernel`s over numbered `Tensor`s, plus the
constant table. A kernel is one of:

- a single IR op run as its own kernel (`kind` is the op's name, `op` the op);
- a view (`kind="view"`, op View/Broadcast/Permute/Slice/Flip): no work, the backend aliases
  the input through strides;
- an opaque op (`kind="opaque"`, op `Opaque`): an ONNX node knopt keeps without knowing it;
- `kind="elementwise"`: a fused scalar `body` over loads of its inputs, all of the output's
  shape (views of other tensors are loaded through their strides);
- a main op with a fused elementwise `prologue` (computing the main op's input from the
  kernel's inputs) and/or `epilogue` (computing the result from the main op's value, `Acc`,
  and further inputs of the output's shape): `kind` is "reduce", "softmax", "layer_norm",
  "rms_norm", "matmul" or "conv".

Scalar bodies are `Expr` trees: `Load(i)` reads input i at the current output index, `Acc()`
is the main op's value there, `Const` a splat value; the rest mirror the elementwise IR ops.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np

from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.graph import Graph, Node, Value
from knopt.ir.kernel import KernelKind
from knopt.ir.op import VIEW_OPS, Binary, TensorType, Unary

# ---- scalar bodies ------------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    """Input `index` of the kernel at the current output index."""

    index: int


@dataclass(frozen=True)
class Acc:
    """The kernel's main op result at the current output index (epilogues only)."""


@dataclass(frozen=True)
class Const:
    """A constant."""

    value: float
    dtype: DType


@dataclass(frozen=True)
class UnaryE:
    """An elementwise unary function of a scalar."""

    kind: Unary
    x: Expr


@dataclass(frozen=True)
class BinaryE:
    """An elementwise binary function of two scalars."""

    kind: Binary
    a: Expr
    b: Expr


@dataclass(frozen=True)
class ClampE:
    """`min(max(x, lo), hi)`."""

    x: Expr
    lo: float
    hi: float


@dataclass(frozen=True)
class CastE:
    """Conversion to `dtype`."""

    x: Expr
    dtype: DType


@dataclass(frozen=True)
class WhereE:
    """`a` where `condition`, else `b`."""

    condition: Expr
    a: Expr
    b: Expr


Expr = Union[Load, Acc, Const, UnaryE, BinaryE, ClampE, CastE, WhereE]  # noqa: UP007


def expr_size(expr: Expr) -> int:
    """The number of operations in a body (loads and constants count 0)."""
    if isinstance(expr, Load | Acc | Const):
        return 0
    return 1 + sum(expr_size(child) for child in expr_children(expr))


def expr_children(expr: Expr) -> tuple[Expr, ...]:
    """The sub-expressions of a body node."""
    if isinstance(expr, UnaryE | ClampE | CastE):
        return (expr.x,)
    if isinstance(expr, BinaryE):
        return (expr.a, expr.b)
    if isinstance(expr, WhereE):
        return (expr.condition, expr.a, expr.b)
    return ()


def map_leaves(expr: Expr, leaf: Callable[[Expr], Expr]) -> Expr:
    """`expr` rebuilt with each load, accumulator and constant replaced by `leaf(it)`."""
    if isinstance(expr, UnaryE):
        return UnaryE(expr.kind, map_leaves(expr.x, leaf))
    if isinstance(expr, BinaryE):
        return BinaryE(expr.kind, map_leaves(expr.a, leaf), map_leaves(expr.b, leaf))
    if isinstance(expr, ClampE):
        return ClampE(map_leaves(expr.x, leaf), expr.lo, expr.hi)
    if isinstance(expr, CastE):
        return CastE(map_leaves(expr.x, leaf), expr.dtype)
    if isinstance(expr, WhereE):
        return WhereE(*(map_leaves(e, leaf) for e in (expr.condition, expr.a, expr.b)))
    return leaf(expr)


def format_expr(expr: Expr) -> str:
    """A body as text, like `RELU(ADD(in0, in1))`."""
    if isinstance(expr, Load):
        return f"in{expr.index}"
    if isinstance(expr, Acc):
        return "acc"
    if isinstance(expr, Const):
        return repr(expr.value)
    if isinstance(expr, UnaryE):
        return f"{expr.kind.name}({format_expr(expr.x)})"
    if isinstance(expr, BinaryE):
        return f"{expr.kind.name}({format_expr(expr.a)}, {format_expr(expr.b)})"
    if isinstance(expr, ClampE):
        return f"clamp({format_expr(expr.x)}, {expr.lo}, {expr.hi})"
    if isinstance(expr, CastE):
        return f"cast<{expr.dtype.short}>({format_expr(expr.x)})"
    return f"where({format_expr(expr.condition)}, {format_expr(expr.a)}, {format_expr(expr.b)})"


# ---- kernels and programs -----------------------------------------------------------------

VIEW = "view"  # the kind of view kernels, which alias their input
OPAQUE = "opaque"  # the kind of opaque ops' kernels (ONNX nodes knopt keeps as they are)


@dataclass(frozen=True)
class Tensor:
    """A value of the program: its type and where it comes from.

    Attributes:
        role: "input", "constant", "output" or "intermediate" ("output" wins over the others).
    """

    id: int
    type: TensorType
    role: str


@dataclass(frozen=True)
class Kernel:
    """One kernel launch (or view) of a program.

    Attributes:
        kind: An op name for single-op kernels, "view", "opaque", or a `KernelKind` (fused
            kernels).
        op: The IR op (the main op of fused kinds; None for "elementwise").
        inputs: Tensor ids read, in the order `Load` indices and the op's operands use: for
            fused main ops the op's own operands come first when there is no prologue.
        output: The tensor id written.
        body: The elementwise body ("elementwise" kernels).
        prologue: What the main op reads, computed from the inputs (reduce/softmax/norms).
        epilogue: What the kernel writes, computed from `Acc` and further inputs.
        names: The original (ONNX) node names this kernel computes.
        cost: The cost model's estimate, in seconds.
    """

    kind: str
    op: ops.Op | None
    inputs: tuple[int, ...]
    output: int
    body: Expr | None = None
    prologue: Expr | None = None
    epilogue: Expr | None = None
    names: tuple[str, ...] = ()
    cost: float = 0.0

    @property
    def is_view(self) -> bool:
        """True for views, which cost nothing and launch nothing."""
        return self.kind == VIEW


@dataclass(eq=False)
class Program:
    """Kernels in execution order over tensors, with the constants they read.

    Programs compare and hash by identity (a backend caches what it prepared for one).
    """

    tensors: list[Tensor]
    kernels: list[Kernel]
    inputs: list[int]
    input_names: list[str]
    outputs: list[int]
    output_names: list[str]
    constants: dict[int, np.ndarray] = field(default_factory=dict)
    name: str = ""

    def launches(self) -> list[Kernel]:
        """The kernels that do work (views left out)."""
        return [k for k in self.kernels if not k.is_view]

    def estimated_seconds(self) -> float:
        """The cost model's total."""
        return sum(k.cost for k in self.kernels)


def program_from_graph(
    graph: Graph,
    groups: Mapping[Node, int] | None = None,
    costs: Mapping[Node | int, float] | None = None,
    names: Mapping[Node | int, Sequence[str]] | None = None,
) -> Program:
    """The program that computes `graph`.

    Args:
        graph: The graph.
        groups: Node to a group key; the nodes of one group become one fused kernel whose
            result is the group's last node. Nodes in no group are kernels of their own.
        costs: Estimated seconds per group key, or per node for ungrouped nodes.
        names: Original node names per group key or per node.
    """
    groups = groups or {}
    costs = costs or {}
    names = names or {}
    members: dict[int, list[Node]] = {}
    for node in graph.nodes:
        if node in groups:
            members.setdefault(groups[node], []).append(node)
    last = {nodes[-1]: key for key, nodes in members.items()}
    builder = _ProgramBuilder(graph)
    for node in graph.nodes:
        if node in groups and node not in last:
            continue  # computed inside its group's kernel
        key = last.get(node)
        kernel: Kernel | None
        if key is not None:
            kernel = builder.fused(members[key], costs.get(key, 0.0), names.get(key, ()))
        else:
            kernel = builder.single(node, costs.get(node, 0.0), names.get(node, ()))
        if kernel is not None:
            builder.kernels.append(kernel)
    return builder.program()


class _ProgramBuilder:
    """Turns graph nodes into tensors and kernels."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.tensors: list[Tensor] = []
        self.ids: dict[Value, int] = {}
        self.constants: dict[int, np.ndarray] = {}
        self.kernels: list[Kernel] = []
        self.outputs = set(graph.outputs)

    def tensor(self, value: Value, role: str) -> int:
        if value not in self.ids:
            tid = len(self.tensors)
            self.ids[value] = tid
            final = "output" if value in self.outputs else role
            self.tensors.append(Tensor(tid, value.type, final))
            if isinstance(value.producer.op, ops.Constant):
                self.constants[tid] = value.producer.op.data.array
        return self.ids[value]

    def single(self, node: Node, cost: float, names: Sequence[str]) -> Kernel | None:
        op = node.op
        if isinstance(op, ops.Input | ops.Constant):
            self.tensor(node.output, "input" if isinstance(op, ops.Input) else "constant")
            return None
        inputs = tuple(self.ids[v] for v in node.inputs)
        out = self.tensor(node.output, "intermediate")
        kind = VIEW if type(op) in VIEW_OPS else OPAQUE if isinstance(op, ops.Opaque) else op.name
        return Kernel(kind, op, inputs, out, names=tuple(names) or _own_name(node), cost=cost)

    def fused(self, nodes: list[Node], cost: float, names: Sequence[str]) -> Kernel:
        inside = set(nodes)
        mains = [n for n in nodes if KernelKind.of_main_op(type(n.op)) is not None]
        assert len(mains) <= 1, "a fused kernel has one main op"
        loads: list[int] = []
        result = nodes[-1]

        def load(value: Value) -> Expr:
            splat = _splat_of(value, inside)
            if splat is not None:
                return Const(splat, value.dtype)
            if value.producer in inside and value.producer is not main_node:
                return _expr(value.producer, load)
            if value.producer is main_node:
                return Acc()
            tid = self.ids[value]
            if tid not in loads:
                loads.append(tid)
            return Load(loads.index(tid))

        main_node = mains[0] if mains else None
        out = self.tensor(result.output, "intermediate")
        label = tuple(names) or tuple(dict.fromkeys(n.name for n in nodes if n.name))
        if main_node is None:
            body = _expr(result, load)
            return Kernel(
                KernelKind.ELEMENTWISE, None, tuple(loads), out, body=body, names=label, cost=cost
            )
        kind = KernelKind.of_main_op(type(main_node.op))
        assert kind is not None
        prologue = None
        if not kind.has_prologue:
            for operand in main_node.inputs:
                tid = self.ids[operand]
                loads.append(tid)
        else:
            (operand,) = main_node.inputs
            if operand.producer in inside:
                prologue = _expr(operand.producer, load)
            else:
                loads.append(self.ids[operand])
        epilogue = None if result is main_node else _expr(result, load)
        return Kernel(
            kind,
            main_node.op,
            tuple(loads),
            out,
            prologue=prologue,
            epilogue=epilogue,
            names=label,
            cost=cost,
        )

    def program(self) -> Program:
        g = self.graph
        return Program(
            self.tensors,
            self.kernels,
            [self.ids[v] for v in g.inputs],
            g.input_names,
            [self.ids[v] for v in g.outputs],
            g.output_names,
            self.constants,
            g.name,
        )


def _own_name(node: Node) -> tuple[str, ...]:
    return (node.name,) if node.name else ()


def _splat_of(value: Value, inside: set[Node]) -> float | None:
    """The value of a splat constant made for a kernel (seen through its views), or None."""
    node = value.producer
    while node in inside and type(node.op) in VIEW_OPS:
        node = node.inputs[0].producer
    if isinstance(node.op, ops.Constant) and (
        node in inside or node.output.type.shape == () or node.op.data.array.size == 1
    ):
        splat = node.op.data.splat_value()
        return float(splat) if splat is not None else None
    return None


def _expr(node: Node, load: Callable[[Value], Expr]) -> Expr:
    """The scalar body of an elementwise node; its inputs are `load`ed."""
    if type(node.op) not in ops.ELEMENTWISE_OPS:
        raise AssertionError(f"{node.describe()} is not elementwise but sits in a fused body")
    return elementwise_expr(node.op, [load(v) for v in node.inputs])


def elementwise_expr(op: ops.Op, args: Sequence[Expr]) -> Expr:
    """The scalar body of an elementwise op applied to `args`.

    Raises:
        KeyError: If `op` is not one of `ELEMENTWISE_OPS`.
    """
    return ELEMENTWISE_EXPRS[type(op)](op, args)


ELEMENTWISE_EXPRS: dict[type[ops.Op], Callable[[Any, Sequence[Expr]], Expr]] = {
    ops.UnaryOp: lambda op, a: UnaryE(op.kind, a[0]),
    ops.BinaryOp: lambda op, a: BinaryE(op.kind, a[0], a[1]),
    ops.Clamp: lambda op, a: ClampE(a[0], op.lo, op.hi),
    ops.Cast: lambda op, a: CastE(a[0], op.dtype),
    ops.Where: lambda op, a: WhereE(a[0], a[1], a[2]),
}


def format_program(program: Program) -> str:
    """The program as text, one kernel per line."""
    t = program.tensors
    lines = [
        f"program {program.name or 'main'}("
        + ", ".join(
            f"{n}: %{i} {t[i].type}"
            for n, i in zip(program.input_names, program.inputs, strict=True)
        )
        + ") {"
    ]
    for k in program.kernels:
        args = ", ".join(f"%{i}" for i in k.inputs)
        what = k.kind if k.op is None else f"{k.kind}:{k.op.name}"
        parts = [f"  %{k.output} = {what}({args}) : {t[k.output].type}"]
        for label, expr in (("body", k.body), ("prologue", k.prologue), ("epilogue", k.epilogue)):
            if expr is not None:
                parts.append(f"{label}={format_expr(expr)}")
        if k.cost:
            parts.append(f"[{k.cost * 1e6:.1f} us]")
        if k.names:
            parts.append("# " + ", ".join(k.names[:4]) + (" ..." if len(k.names) > 4 else ""))
        lines.append("  ".join(parts))
    outs = ", ".join(
        f"{n} = %{i}" for n, i in zip(program.output_names, program.outputs, strict=True)
    )
    lines.append(f"  return {outs}")
    lines.append("}")
    return "\n".join(lines)
