"""What each fact of the shipped rule files claims, checked on the CPU executor.

A fact rule adds rows to a function or relation. Its oracle here says whether one row is
true of the instance: `shape` and `dtype` must be what `Op.infer` gives, `folds` must not
depend on the inputs, `full x b` must have the body `b` compute `x`, `numel-from` must be the
product it names, and so on. A relation without an oracle leaves its rules unchecked.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from knopt.cpu.elementwise import NUMPY_UNARY
from knopt.cpu.kernels import KERNELS
from knopt.ir import op as ops
from knopt.ir.graph import Graph, Value
from knopt.ir.kernel import KERNEL_CONSTRUCTORS, KernelKind
from knopt.ir.op import Input, Iota, Sizes, TensorType, Unary
from knopt.ir.shape import is_static, static_dims
from knopt.opt.serialized import SRef
from knopt.opt.terms import TermTables, decode_main_op, prologue_of
from knopt.testing.compare import compare_arrays
from knopt.testing.rulecheck.facts import Fact
from knopt.testing.rulecheck.values import ClassValues, Uncomputable

ELEMENTWISE = frozenset(cls.__name__ for cls in ops.ELEMENTWISE_OPS)
LINEAR_BODY = frozenset({"SAcc", "SConst", "SLoad", "SBinary"})


@dataclass
class FactContext:
    """What oracles look at: class values on two input sets, and the IR types of classes."""

    values: ClassValues
    other: ClassValues  # the same classes on other random inputs
    tables: TermTables
    types: dict[int, TensorType]  # classes of original IR nodes
    varying: set[int]  # classes of original IR nodes that read a graph input


def context(values: ClassValues, other: ClassValues, graph: Graph, ir_nodes: Any) -> FactContext:
    """The context for one e-graph, from the batch graph and where its nodes landed."""
    types: dict[int, TensorType] = {}
    varying: set[int] = set()
    reads: set[Value] = set()
    for node, (cls, _) in zip(graph.nodes, ir_nodes, strict=True):
        types.setdefault(cls, node.output.type)
        symbolic = (isinstance(node.op, Iota | Sizes) and not is_static(node.output.shape)) or (
            isinstance(node.op, Sizes) and not is_static(node.op.dims)
        )
        if isinstance(node.op, Input) or symbolic or any(v in reads for v in node.inputs):
            reads.add(node.output)
            varying.add(cls)
    return FactContext(values, other, values.tables, types, varying)


def _type(ctx: FactContext, cls: int) -> TensorType:
    if cls not in ctx.types:
        raise Uncomputable(f"e-class {cls} is no original node")
    return ctx.types[cls]


def _close(actual: Any, expected: Any, what: str) -> str | None:
    expected = np.asarray(expected)
    actual = np.broadcast_to(np.asarray(actual).astype(expected.dtype), expected.shape)
    result = compare_arrays(np.array(actual, order="C"), expected)
    return None if result.ok else f"{what}: {result.message}"


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.all((a == b) | ((a != a) & (b != b))))


# ---- one oracle per function or relation ------------------------------------------------------


def _shape(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    actual = tuple(ctx.tables.dim(d) for d in _type(ctx, args[0].id).shape)
    return None if tuple(value) == actual else f"shape {value} but the node has {actual}"


def _dtype(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    actual = _type(ctx, args[0].id).dtype.name
    return None if value == actual else f"dtype {value} but the node has {actual}"


def _constant(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    cls = args[0].id
    if _same(ctx.values.value(cls), ctx.other.value(cls)):
        return None
    return f"e-class {cls} is said to be constant but changes with the inputs"


def _static(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    shape = _type(ctx, args[0].id).shape
    return None if all(isinstance(d, int) for d in shape) else f"shape {shape} is symbolic"


def _small(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    shape = _type(ctx, args[0].id).shape
    dims = static_dims(shape)
    if dims is None:
        return f"shape {shape} is symbolic, so not known to be small"
    count = math.prod(dims)
    return None if count <= 1 << 20 else f"{count} elements is not small"


def _varies(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    cls = args[0].id
    _type(ctx, cls)
    return None if cls in ctx.varying else f"e-class {cls} reads no input"


def _product(shape: tuple[int, ...], start: int) -> int:
    rest = shape[start:]
    return -1 if any(d < 0 for d in rest) else math.prod(rest)


def _numel_from(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    shape, start = args
    expected = _product(shape, start)
    return None if value == expected else f"numel-from {shape} {start} = {value}, not {expected}"


def _numel(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    expected = _product(args[0], 0)
    return None if value == expected else f"numel {args[0]} = {value}, not {expected}"


def _ones_below(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    shape, i = args
    return None if 0 <= i <= len(shape) and all(d == 1 for d in shape[:i]) else "not all 1"


def _ones_above(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    shape, i = args
    return None if 0 <= i <= len(shape) and all(d == 1 for d in shape[i:]) else "not all 1"


def _identity_below(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    perm, i = args
    ok = 0 <= i <= len(perm) and all(perm[j] == j for j in range(i))
    return None if ok else f"{perm} is not the identity below {i}"


def _composed(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    p, q, i = args
    expected = tuple(p[q[j]] for j in range(i))
    return None if tuple(value) == expected else f"composed {p} {q} {i} = {value}"


def _swap(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    (rank,) = args
    expected = (*range(rank - 2), rank - 1, rank - 2)
    return None if tuple(value) == expected else f"swap-last-two {rank} = {value}"


def _concat_folds(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    _, parts, start = args
    for part in parts[start:]:
        message = _constant(ctx, (part,), None)
        if message is not None:
            return message
    return None


def _concat_part(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    _, parts, i = args
    return None if 0 <= i < len(parts) else f"part {i} of {len(parts)}"


def _min_sizes(ctx: FactContext) -> dict[int, int]:
    """The fewest scalar ops any spelling of each scalar class takes (a fixpoint)."""
    scalars = ctx.values.data.scalars
    size = {sid: 1 << 30 for sid in scalars}
    for _ in range(len(scalars) + 1):
        changed = False
        for sid, nodes in scalars.items():
            for node in nodes:
                kids = [a.id for a in node.args if isinstance(a, SRef)]
                own = 0 if node.op in ("SLoad", "SConst", "SAcc") else 1
                total = own + sum(size.get(k, 1 << 30) for k in kids)
                if total < size[sid]:
                    size[sid], changed = total, True
        if not changed:
            break
    return size


def _body_size(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    fewest = _min_sizes(ctx).get(args[0].id, 0)
    return None if value >= fewest else f"body-size {value} < {fewest} ops"


def _leaf(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    cls = args[0].id
    data = ctx.values.data
    nodes = data.classes.get(cls, [])
    if cls in data.folds or any(n.op not in ELEMENTWISE | KERNEL_CONSTRUCTORS for n in nodes):
        return None
    return f"e-class {cls} holds only elementwise ops"


def _body_computes(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    tensor, body = args
    return _close(ctx.values.body(body.id), ctx.values.value(tensor.id), "the body")


def _epilogue_of(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    y, ep = args
    nodes = ctx.values.data.classes.get(y.id, [])
    found = any(n.op in KERNEL_CONSTRUCTORS and n.args[-1] == ep for n in nodes)
    return None if found else "no kernel"


def _accumulator(ctx: FactContext, node: Any) -> np.ndarray:
    """The main result of a reduce, softmax or norm kernel, before its epilogue."""
    main = decode_main_op(ctx.tables, node)
    assert main is not None
    x = ctx.values.body(prologue_of(node).id)
    return np.asarray(KERNELS[type(main)](main, x))


def _has_prologue(constructor: str) -> bool:
    kind = KernelKind.of_constructor(constructor)
    return kind is not None and kind.has_prologue


def _extends(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    e, y, ep, ep2 = args
    kernels = [
        n for n in ctx.values.data.classes.get(y.id, []) if _has_prologue(n.op) and n.args[-1] == ep
    ]
    if not kernels:
        raise Uncomputable(f"e-class {y.id} has no kernel with that epilogue")
    acc = _accumulator(ctx, kernels[0])
    return _close(ctx.values.body(ep2.id, acc=acc), ctx.values.value(e.id), "the epilogue")


def _linear(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    stack, seen = [args[0].id], set()
    while stack:
        sid = stack.pop()
        if sid in seen:
            continue
        seen.add(sid)
        node = ctx.values.data.body(sid)
        if node.op not in LINEAR_BODY or (
            node.op == "SBinary" and node.args[0] not in ("ADD", "MUL")
        ):
            return f"the epilogue has a {node.op} {node.args[0] if node.args else ''}"
        stack.extend(a.id for a in node.args if isinstance(a, SRef))
    return None


def _gelu_core(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    t, x, kind = args
    xv = ctx.values.value(x.id)
    expected = NUMPY_UNARY[Unary[kind]](xv)
    return _close(xv * ctx.values.value(t.id) * xv.dtype.type(0.5), expected, "x * t / 2")


def _cube_of(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    e, x = args
    xv = ctx.values.value(x.id)
    return _close(ctx.values.value(e.id), xv * xv * xv, "the cube")


def _mean_of(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    m, x, axis = args
    expected = np.mean(ctx.values.value(x.id), axis=axis, keepdims=True)
    return _close(ctx.values.value(m.id), expected, "the mean")


def _channel_mean_of(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    m, x = args
    return _mean_of(ctx, (m, x, 1), value)


def _tanh_gelu_arg(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    u, x = args
    xv = ctx.values.value(x.id)
    return _close(ctx.values.value(u.id), xv + xv.dtype.type(0.044715) * xv * xv * xv, "x + k x^3")


def _context_only(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    """A fact about where a tensor is read (softmax-addend, raw-scores): no value to check."""
    return None


Oracle = Callable[[FactContext, tuple[Any, ...], Any], "str | None"]
ORACLES: dict[str, Oracle] = {
    "shape": _shape,
    "dtype": _dtype,
    "folds": _constant,
    "coef": _constant,
    "static": _static,
    "small": _small,
    "varies": _varies,
    "numel-from": _numel_from,
    "numel": _numel,
    "ones-below": _ones_below,
    "ones-above": _ones_above,
    "identity-below": _identity_below,
    "composed": _composed,
    "swap-last-two": _swap,
    "concat-folds-from": _concat_folds,
    "concat-part": _concat_part,
    "body-size": _body_size,
    "leaf": _leaf,
    "full": _body_computes,
    "operand": _body_computes,
    "epilogue-of": _epilogue_of,
    "extends": _extends,
    "gemm-linear": _linear,
    "conv-linear": _linear,
    "gelu-core": _gelu_core,
    "cube-of": _cube_of,
    "mean-of": _mean_of,
    "channel-mean-of": _channel_mean_of,
    "tanh-gelu-arg": _tanh_gelu_arg,
    "softmax-addend": _context_only,
    "raw-scores": _context_only,
}


def check_fact(ctx: FactContext, fact: Fact) -> str | None:
    """None if the fact is true of the instance, else what is wrong.

    Raises:
        Uncomputable: If the fact has no oracle or cannot be evaluated here.
    """
    name, args, value = fact
    if name not in ORACLES:
        raise Uncomputable(f"no oracle for `{name}`")
    return ORACLES[name](ctx, args, value)
