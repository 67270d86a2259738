"""IR graphs as egglog terms (rules/schema.egg), built as command objects without text parsing.

Each IR op class has one encoder in `ENCODERS` that gives its constructor name and attribute
arguments; `schema.egg` declares the constructors with the same names (a test checks both).
Symbolic sizes become negative sentinels, large constants become indices into a table, and
constants whose elements are all equal become `Splat`s.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from egglog import bindings as eb

from knopt.errors import InvalidGraphError
from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.graph import Graph, Node
from knopt.ir.op import Binary, PadMode, PoolKind, Reduction, ScatterReduction, Unary
from knopt.ir.shape import Dim, Sym

SPAN = eb.PanicSpan()
SENTINEL_BASE = -1000  # symbolic sizes are SENTINEL_BASE - k; real sizes are never negative
# Inlined terms nest at most this deep; the rest get handles. Deeper than any template the
# rules match (a LayerNorm spans 9 ops), so rules see the same classes either way.
MAX_INLINE_DEPTH = 64

# Enum members appear as nullary constructors; enums whose member names clash with an earlier
# enum's get a prefix (schema.egg says the same).
ENUM_PREFIX: dict[type[enum.Enum], str] = {
    DType: "",
    Unary: "",
    Binary: "",
    Reduction: "REDUCE_",
    PoolKind: "POOL_",
    PadMode: "PAD_",
    ScatterReduction: "SCATTER_",
}


def enum_constructor(member: enum.Enum) -> str:
    """The schema.egg constructor name of an enum member."""
    return ENUM_PREFIX[type(member)] + member.name


@dataclass(frozen=True, eq=False)
class Term:
    """A term as knopt writes it: a constructor (or primitive) applied to arguments."""

    name: str
    args: tuple[Any, ...]


@dataclass(frozen=True, eq=False)
class Lit:
    """A literal argument."""

    value: int | float | str | bool


def call(name: str, *args: Any) -> Term:
    """A call term."""
    return Term(name, args)


class LiteralRangeError(ValueError):
    """An integer literal that egglog's i64 cannot hold."""


def lit(value: int | float | str | bool) -> Lit:
    """A literal.

    Raises:
        LiteralRangeError: If it is an integer outside the 64-bit range.
    """
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        raise LiteralRangeError(f"{value} does not fit in 64 bits")
    return Lit(value)


def to_egglog(term: Term | Lit) -> Any:
    """The egglog bindings' expression for a term.

    Iterative, so a deep term costs no Python recursion (graph_commands bounds the depth of
    the terms it writes, for egglog's own sake, but other callers may not).
    """
    done: dict[int, Any] = {}  # id(term) -> expression; the terms outlive this call
    stack: list[tuple[Term | Lit, bool]] = [(term, False)]
    while stack:
        current, ready = stack.pop()
        if id(current) in done:
            continue
        if isinstance(current, Lit):
            done[id(current)] = _literal(current.value)
        elif ready:
            args = [done[id(a)] for a in current.args]
            done[id(current)] = eb.Call(SPAN, current.name, args)
        else:
            stack.append((current, True))
            stack.extend((a, False) for a in current.args)
    return done[id(term)]


def _literal(value: int | float | str | bool) -> Any:
    if isinstance(value, bool):
        return eb.Lit(SPAN, eb.Bool(value))
    if isinstance(value, int):
        return eb.Lit(SPAN, eb.Int(value))
    if isinstance(value, float):
        return eb.Lit(SPAN, eb.Float(value))
    return eb.Lit(SPAN, eb.String(value))


@dataclass
class TermTables:
    """What the terms refer to outside the e-graph: constants and symbolic sizes."""

    constants: list[np.ndarray] = field(default_factory=list)
    symbols: list[Sym] = field(default_factory=list)
    _constant_index: dict[str, int] = field(default_factory=dict)
    _symbol_index: dict[Sym, int] = field(default_factory=dict)

    def dim(self, d: Dim) -> int:
        """The i64 that stands for a size."""
        if isinstance(d, int):
            return d
        if d not in self._symbol_index:
            self._symbol_index[d] = len(self.symbols)
            self.symbols.append(d)
        return SENTINEL_BASE - self._symbol_index[d]

    def size(self, code: int) -> Dim:
        """The size an i64 stands for."""
        return code if code >= 0 else self.symbols[SENTINEL_BASE - code]

    def constant(self, data: ops.ConstData) -> int:
        """The table index of a constant."""
        if data.digest not in self._constant_index:
            self._constant_index[data.digest] = len(self.constants)
            self.constants.append(data.array)
        return self._constant_index[data.digest]


def ivec(values: Sequence[int]) -> Any:
    """An `IVec` expression."""
    if not values:
        return call("vec-empty")
    return call("vec-of", *(lit(int(v)) for v in values))


class _Encoder:
    def __init__(self, tables: TermTables) -> None:
        self.tables = tables

    def shape(self, shape: Sequence[Dim]) -> Any:
        return ivec([self.tables.dim(d) for d in shape])

    def enum(self, member: enum.Enum) -> Any:
        return call(enum_constructor(member))


Encoder = Callable[[_Encoder, Any, Node, list[Any]], Any]
ENCODERS: dict[type[ops.Op], Encoder] = {}


def _encodes(cls: type[ops.Op]) -> Callable[[Encoder], Encoder]:
    def register(fn: Encoder) -> Encoder:
        ENCODERS[cls] = fn
        return fn

    return register


def _float(value: float) -> Any:
    return lit(float(value))


@_encodes(ops.Input)
def _input(e: _Encoder, op: ops.Input, node: Node, args: list[Any]) -> Any:
    t = op.tensor_type
    return call("Input", lit(op.input_name), e.shape(t.shape), e.enum(t.dtype))


@_encodes(ops.Constant)
def _constant(e: _Encoder, op: ops.Constant, node: Node, args: list[Any]) -> Any:
    t = node.output.type
    splat = op.data.splat_value()
    # f64 holds every float splat, and integers up to 2^53 exactly; larger ones stay tables.
    if splat is not None and (t.dtype.is_float or abs(splat) < 2**53):
        return call("Splat", _float(float(splat)), e.shape(t.shape), e.enum(t.dtype))
    return call("Constant", lit(e.tables.constant(op.data)), e.shape(t.shape), e.enum(t.dtype))


@_encodes(ops.Iota)
def _iota(e: _Encoder, op: ops.Iota, node: Node, args: list[Any]) -> Any:
    return call("Iota", lit(e.tables.dim(op.length)), e.enum(op.dtype))


@_encodes(ops.Sizes)
def _sizes(e: _Encoder, op: ops.Sizes, node: Node, args: list[Any]) -> Any:
    return call("Sizes", e.shape(op.dims), e.enum(op.dtype))


@_encodes(ops.View)
def _view(e: _Encoder, op: ops.View, node: Node, args: list[Any]) -> Any:
    return call("View", args[0], e.shape(op.shape))


@_encodes(ops.Broadcast)
def _broadcast(e: _Encoder, op: ops.Broadcast, node: Node, args: list[Any]) -> Any:
    return call("Broadcast", args[0], e.shape(op.shape))


@_encodes(ops.Permute)
def _permute(e: _Encoder, op: ops.Permute, node: Node, args: list[Any]) -> Any:
    return call("Permute", args[0], ivec(op.perm), e.shape(node.output.shape))


@_encodes(ops.Slice)
def _slice(e: _Encoder, op: ops.Slice, node: Node, args: list[Any]) -> Any:
    d = e.tables.dim
    return call(
        "Slice",
        args[0],
        lit(op.axis),
        lit(d(op.start)),
        lit(d(op.stop)),
        lit(op.step),
        e.shape(node.output.shape),
    )


@_encodes(ops.Flip)
def _flip(e: _Encoder, op: ops.Flip, node: Node, args: list[Any]) -> Any:
    return call("Flip", args[0], lit(op.axis))


@_encodes(ops.Pad)
def _pad(e: _Encoder, op: ops.Pad, node: Node, args: list[Any]) -> Any:
    flat = [p for pair in op.pads for p in pair]
    return call(
        "Pad", args[0], ivec(flat), e.enum(op.mode), _float(op.value), e.shape(node.output.shape)
    )


@_encodes(ops.Concat)
def _concat(e: _Encoder, op: ops.Concat, node: Node, args: list[Any]) -> Any:
    return call("Concat", call("vec-of", *args), lit(op.axis), e.shape(node.output.shape))


@_encodes(ops.Gather)
def _gather(e: _Encoder, op: ops.Gather, node: Node, args: list[Any]) -> Any:
    return call("Gather", args[0], args[1], lit(op.axis), e.shape(node.output.shape))


@_encodes(ops.Scatter)
def _scatter(e: _Encoder, op: ops.Scatter, node: Node, args: list[Any]) -> Any:
    return call("Scatter", *args, lit(op.axis), e.enum(op.reduction))


@_encodes(ops.Cast)
def _cast(e: _Encoder, op: ops.Cast, node: Node, args: list[Any]) -> Any:
    return call("Cast", args[0], e.enum(op.dtype))


@_encodes(ops.UnaryOp)
def _unary(e: _Encoder, op: ops.UnaryOp, node: Node, args: list[Any]) -> Any:
    return call("UnaryOp", e.enum(op.kind), args[0])


@_encodes(ops.BinaryOp)
def _binary(e: _Encoder, op: ops.BinaryOp, node: Node, args: list[Any]) -> Any:
    return call("BinaryOp", e.enum(op.kind), args[0], args[1])


@_encodes(ops.Clamp)
def _clamp(e: _Encoder, op: ops.Clamp, node: Node, args: list[Any]) -> Any:
    return call("Clamp", args[0], _float(op.lo), _float(op.hi))


@_encodes(ops.Where)
def _where(e: _Encoder, op: ops.Where, node: Node, args: list[Any]) -> Any:
    return call("Where", *args)


@_encodes(ops.Reduce)
def _reduce(e: _Encoder, op: ops.Reduce, node: Node, args: list[Any]) -> Any:
    return call("Reduce", e.enum(op.kind), args[0], ivec(op.axes), e.shape(node.output.shape))


@_encodes(ops.ArgReduce)
def _arg_reduce(e: _Encoder, op: ops.ArgReduce, node: Node, args: list[Any]) -> Any:
    return call(
        "ArgReduce",
        args[0],
        lit(op.axis),
        lit(op.largest),
        lit(op.last),
        e.shape(node.output.shape),
    )


@_encodes(ops.ArgSort)
def _arg_sort(e: _Encoder, op: ops.ArgSort, node: Node, args: list[Any]) -> Any:
    return call("ArgSort", args[0], lit(op.axis), lit(op.descending))


@_encodes(ops.CumSum)
def _cumsum(e: _Encoder, op: ops.CumSum, node: Node, args: list[Any]) -> Any:
    return call("CumSum", args[0], lit(op.axis), lit(op.exclusive), lit(op.reverse))


@_encodes(ops.MatMul)
def _matmul(e: _Encoder, op: ops.MatMul, node: Node, args: list[Any]) -> Any:
    return call("MatMul", *args)


@_encodes(ops.Conv)
def _conv(e: _Encoder, op: ops.Conv, node: Node, args: list[Any]) -> Any:
    pads = [p for pair in op.pads for p in pair]
    return call(
        "Conv",
        *args,
        ivec(op.strides),
        ivec(pads),
        ivec(op.dilations),
        lit(op.groups),
        e.shape(node.output.shape),
    )


@_encodes(ops.Pool)
def _pool(e: _Encoder, op: ops.Pool, node: Node, args: list[Any]) -> Any:
    pads = [p for pair in op.pads for p in pair]
    return call(
        "Pool",
        e.enum(op.kind),
        args[0],
        ivec(op.kernel),
        ivec(op.strides),
        ivec(pads),
        ivec(op.dilations),
        lit(op.ceil_mode),
        lit(op.count_include_pad),
        e.shape(node.output.shape),
    )


@_encodes(ops.Softmax)
def _softmax(e: _Encoder, op: ops.Softmax, node: Node, args: list[Any]) -> Any:
    return call("Softmax", args[0], lit(op.axis))


@_encodes(ops.LayerNorm)
def _layer_norm(e: _Encoder, op: ops.LayerNorm, node: Node, args: list[Any]) -> Any:
    return call("LayerNorm", args[0], lit(op.axis), _float(op.eps))


@_encodes(ops.RmsNorm)
def _rms_norm(e: _Encoder, op: ops.RmsNorm, node: Node, args: list[Any]) -> Any:
    return call("RmsNorm", args[0], lit(op.axis), _float(op.eps))


@dataclass
class LoadedGraph:
    """A graph written as terms.

    Attributes:
        commands: What adds the graph to an e-graph.
        terms: Each IR node's term, in node order (children as handles or inline terms).
    """

    commands: list[Any]
    terms: list[Term]


@_encodes(ops.Attention)
def _attention(e: _Encoder, op: ops.Attention, node: Node, args: list[Any]) -> Any:
    return call("Attention", *args, _float(op.scale))


def graph_commands(graph: Graph, tables: TermTables) -> LoadedGraph:
    """The commands that add `graph` to an e-graph.

    A value read by one node only is written inline in its reader's term; every other value
    gets a handle, `(union (V i) term)`, so that shared values are shared classes. (Each
    top-level command costs egglog a fraction of a millisecond, so fewer is faster.) A term
    that would nest deeper than `MAX_INLINE_DEPTH` gets a handle too, so that no term is as
    deep as a long chain of single-use ops (egglog and the bindings recurse on terms).

    Raises:
        InvalidGraphError: If an attribute or size of a node does not fit in 64 bits.
    """
    encoder = _Encoder(tables)
    outputs = {id(v) for v in graph.outputs}
    exprs: dict[int, Any] = {}
    depths: dict[int, int] = {}
    terms = []
    commands = []
    for index, node in enumerate(graph.nodes):
        value = node.output
        args = [exprs[id(v)] for v in node.inputs]
        try:
            term = ENCODERS[type(node.op)](encoder, node.op, node, args)
        except LiteralRangeError as err:
            raise InvalidGraphError(f"{node.describe()}: an attribute or size {err}") from err
        terms.append(term)
        depth = 1 + max((depths[id(v)] for v in node.inputs), default=0)
        if len(value.users()) == 1 and id(value) not in outputs and depth < MAX_INLINE_DEPTH:
            exprs[id(value)] = term
            depths[id(value)] = depth
        else:
            handle = call("V", lit(index))
            union = eb.Union(SPAN, to_egglog(handle), to_egglog(term))
            commands.append(eb.ActionCommand(union))
            exprs[id(value)] = handle
            depths[id(value)] = 0
    return LoadedGraph(commands, terms)
