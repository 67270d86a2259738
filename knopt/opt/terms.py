"""IR ops as egglog terms (rules/schema.egg) and back: the term form of the IR, both ways.

Each IR op class has one encoder in `ENCODERS` that gives its constructor name and attribute
arguments, and one decoder in `DECODERS` that makes the op again from a serialized e-node's
arguments; `schema.egg` declares the constructors with the same names (tests/test_tables.py
checks all three, and that decoding undoes encoding). Terms are built as command objects,
without text parsing. Symbolic sizes become negative sentinels, large constants become
indices into a table, and constants whose elements are all equal become `Splat`s.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np
from egglog import bindings as eb

from knopt.errors import InvalidGraphError, OptimizeError
from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.graph import Graph, Node, Value
from knopt.ir.kernel import KernelKind
from knopt.ir.op import Binary, PadMode, PoolKind, Reduction, ScatterReduction, Unary
from knopt.ir.shape import Dim, Sym
from knopt.opt.serialized import ENode, SRef

EnumT = TypeVar("EnumT", bound=enum.Enum)
SPAN = eb.PanicSpan()
SENTINEL_BASE = -1000  # symbolic sizes are SENTINEL_BASE - k; real sizes are never negative
# A constant whose elements are all equal is a `Splat` term, a leaf beside the leaf ops.
SPLAT = "Splat"
LEAF_TERMS = frozenset({cls.__name__ for cls in ops.LEAF_OPS} | {SPLAT})
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


def enum_member(kind: type[EnumT], constructor: str) -> EnumT:
    """The member of `kind` that a schema.egg constructor names (`enum_constructor` undone)."""
    return kind[constructor.removeprefix(ENUM_PREFIX[kind])]


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
    """What the terms refer to outside the e-graph: constants, opaque ops, symbolic sizes."""

    constants: list[np.ndarray] = field(default_factory=list)
    symbols: list[Sym] = field(default_factory=list)
    opaques: list[ops.Opaque] = field(default_factory=list)
    _constant_index: dict[str, int] = field(default_factory=dict)
    _symbol_index: dict[Sym, int] = field(default_factory=dict)
    _opaque_index: dict[ops.Opaque, int] = field(default_factory=dict)

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

    def shape(self, codes: Sequence[int]) -> tuple[Dim, ...]:
        """The sizes an IVec of i64s stands for."""
        return tuple(self.size(c) for c in codes)

    def opaque(self, op: ops.Opaque) -> int:
        """The table index of an opaque op."""
        if op not in self._opaque_index:
            self._opaque_index[op] = len(self.opaques)
            self.opaques.append(op)
        return self._opaque_index[op]

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
        return call(SPLAT, _float(float(splat)), e.shape(t.shape), e.enum(t.dtype))
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
@_encodes(ops.IntConv)
def _conv(e: _Encoder, op: ops.Conv | ops.IntConv, node: Node, args: list[Any]) -> Any:
    pads = [p for pair in op.pads for p in pair]
    return call(
        op.name,
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


@_encodes(ops.Rope)
def _rope(e: _Encoder, op: ops.Rope, node: Node, args: list[Any]) -> Any:
    return call("Rope", *args)


@_encodes(ops.IntMatMul)
def _int_matmul(e: _Encoder, op: ops.IntMatMul, node: Node, args: list[Any]) -> Any:
    return call("IntMatMul", *args)


@_encodes(ops.Int4MatMul)
def _int4_matmul(e: _Encoder, op: ops.Int4MatMul, node: Node, args: list[Any]) -> Any:
    return call("Int4MatMul", *args, lit(op.block))


@_encodes(ops.Opaque)
def _opaque(e: _Encoder, op: ops.Opaque, node: Node, args: list[Any]) -> Any:
    t = op.tensor_type
    inputs = call("vec-of", *args) if args else call("vec-empty")
    return call("Opaque", lit(e.tables.opaque(op)), e.shape(t.shape), e.enum(t.dtype), inputs)


def _encoder_of(node: Node) -> Encoder:
    encode = ENCODERS.get(type(node.op))
    if encode is None:
        raise OptimizeError(
            f"{node.describe()}: {type(node.op).__name__} has no egglog term; add its encoder "
            "to ENCODERS in knopt/opt/terms.py and its constructor to rules/schema.egg"
        )
    return encode


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
    outputs = set(graph.outputs)
    exprs: dict[Value, Any] = {}
    depths: dict[Value, int] = {}
    terms = []
    commands = []
    for index, node in enumerate(graph.nodes):
        value = node.output
        encode = _encoder_of(node)
        try:
            term = encode(encoder, node.op, node, [exprs[v] for v in node.inputs])
        except LiteralRangeError as err:
            raise InvalidGraphError(f"{node.describe()}: an attribute or size {err}") from err
        terms.append(term)
        depth = 1 + max((depths[v] for v in node.inputs), default=0)
        if len(value.users()) == 1 and value not in outputs and depth < MAX_INLINE_DEPTH:
            exprs[value] = term
            depths[value] = depth
        else:
            handle = call("V", lit(index))
            union = eb.Union(SPAN, to_egglog(handle), to_egglog(term))
            commands.append(eb.ActionCommand(union))
            exprs[value] = handle
            depths[value] = 0
    return LoadedGraph(commands, terms)


# ---- decoders: terms back to ops ---------------------------------------------------------


def _pairs(flat: Sequence[int]) -> tuple[tuple[int, int], ...]:
    return tuple((flat[i], flat[i + 1]) for i in range(0, len(flat), 2))


class SizeCodes(Protocol):
    """What a decoder reads sizes with: i64 codes to sizes (negative codes are symbolic)."""

    def size(self, code: int) -> Dim:
        """The size a code stands for."""
        ...

    def shape(self, codes: tuple[int, ...]) -> tuple[Dim, ...]:
        """The sizes an IVec of codes stands for."""
        ...


Decoder = Callable[[SizeCodes, tuple[Any, ...]], ops.Op]


def decode_main_op(sizes: SizeCodes, node: ENode) -> ops.Op | None:
    """The main op of a kernel term, or None for an elementwise kernel.

    A kernel term's arguments are its main op's term arguments (the operand a prologue
    computes written as that prologue) followed by the epilogue (knopt/ir/kernel.py).
    """
    kind = KernelKind.of_constructor(node.op)
    assert kind is not None, f"{node.op} is no kernel term"
    if kind.main_op is None:
        return None
    return DECODERS[kind.main_op.__name__](sizes, node.args[:-1])


def prologue_of(node: ENode) -> SRef:
    """The prologue of a kernel term whose kind has one: its first scalar argument."""
    return next(arg for arg in node.args if isinstance(arg, SRef))


DECODERS: dict[str, Decoder] = {
    "Iota": lambda r, a: ops.Iota(r.size(a[0]), DType[a[1]]),
    "Sizes": lambda r, a: ops.Sizes(r.shape(a[0]), DType[a[1]]),
    "View": lambda r, a: ops.View(r.shape(a[1])),
    "Broadcast": lambda r, a: ops.Broadcast(r.shape(a[1])),
    "Permute": lambda r, a: ops.Permute(tuple(a[1])),
    "Slice": lambda r, a: ops.Slice(a[1], r.size(a[2]), r.size(a[3]), a[4]),
    "Flip": lambda r, a: ops.Flip(a[1]),
    "Pad": lambda r, a: ops.Pad(_pairs(a[1]), enum_member(PadMode, a[2]), a[3]),
    "Concat": lambda r, a: ops.Concat(a[1]),
    "Gather": lambda r, a: ops.Gather(a[2]),
    "Scatter": lambda r, a: ops.Scatter(a[3], enum_member(ScatterReduction, a[4])),
    "Cast": lambda r, a: ops.Cast(DType[a[1]]),
    "UnaryOp": lambda r, a: ops.UnaryOp(enum_member(Unary, a[0])),
    "BinaryOp": lambda r, a: ops.BinaryOp(enum_member(Binary, a[0])),
    "Clamp": lambda r, a: ops.Clamp(a[1], a[2]),
    "Where": lambda r, a: ops.Where(),
    "Reduce": lambda r, a: ops.Reduce(enum_member(Reduction, a[0]), tuple(a[2])),
    "ArgReduce": lambda r, a: ops.ArgReduce(a[1], a[2], a[3]),
    "ArgSort": lambda r, a: ops.ArgSort(a[1], a[2]),
    "CumSum": lambda r, a: ops.CumSum(a[1], a[2], a[3]),
    "MatMul": lambda r, a: ops.MatMul(),
    "Conv": lambda r, a: ops.Conv(tuple(a[2]), _pairs(a[3]), tuple(a[4]), a[5]),
    "Pool": lambda r, a: ops.Pool(
        enum_member(PoolKind, a[0]), tuple(a[2]), tuple(a[3]), _pairs(a[4]), tuple(a[5]), a[6], a[7]
    ),
    "Softmax": lambda r, a: ops.Softmax(a[1]),
    "LayerNorm": lambda r, a: ops.LayerNorm(a[1], a[2]),
    "RmsNorm": lambda r, a: ops.RmsNorm(a[1], a[2]),
    "Attention": lambda r, a: ops.Attention(a[4]),
    "Rope": lambda r, a: ops.Rope(),
    "IntMatMul": lambda r, a: ops.IntMatMul(),
    "IntConv": lambda r, a: ops.IntConv(tuple(a[4]), _pairs(a[5]), tuple(a[6]), a[7]),
    "Int4MatMul": lambda r, a: ops.Int4MatMul(a[4]),
}
