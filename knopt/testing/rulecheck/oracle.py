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

import ml_dtypes
import numpy as np

from knopt.cpu.elementwise import NUMPY_UNARY
from knopt.cpu.kernels import KERNELS, int4_weight, rotate_half, unpack_int4
from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.graph import Graph, Node, Value
from knopt.ir.kernel import KERNEL_CONSTRUCTORS, KernelKind
from knopt.ir.op import Input, Iota, Opaque, Sizes, TensorType, Unary
from knopt.ir.shape import is_static, static_dims
from knopt.opt.serialized import SRef
from knopt.opt.terms import TermTables, decode_main_op, prologue_of
from knopt.testing.compare import compare_arrays
from knopt.testing.rulecheck.facts import Fact
from knopt.testing.rulecheck.values import ClassValues, Uncomputable

ELEMENTWISE = frozenset(cls.__name__ for cls in ops.ELEMENTWISE_OPS)
FOLD_LIMIT = 1 << 20  # elements of the largest tensor a growing op folds to (fold.egg `small`)
LINEAR_BODY = frozenset({"SAcc", "SConst", "SLoad", "SBinary"})


@dataclass
class FactContext:
    """What oracles look at: class values on two input sets, and the IR types of classes."""

    values: ClassValues
    other: ClassValues  # the same classes on other random inputs
    tables: TermTables
    types: dict[int, TensorType]  # classes of original IR nodes
    varying: set[int]  # classes of original IR nodes that read a graph input or are opaque
    unfolded: set[int]  # classes of original IR nodes that read a broadcast too large to fold


def _large_broadcast(node: Node) -> bool:
    dims = static_dims(node.output.shape)
    return isinstance(node.op, ops.Broadcast) and dims is not None and math.prod(dims) > FOLD_LIMIT


def context(values: ClassValues, other: ClassValues, graph: Graph, ir_nodes: Any) -> FactContext:
    """The context for one e-graph, from the batch graph and where its nodes landed."""
    types: dict[int, TensorType] = {}
    varying: set[int] = set()
    unfolded: set[int] = set()
    reads: set[Value] = set()
    large: set[Value] = set()
    for node, (cls, _) in zip(graph.nodes, ir_nodes, strict=True):
        types.setdefault(cls, node.output.type)
        symbolic = (isinstance(node.op, Iota | Sizes) and not is_static(node.output.shape)) or (
            isinstance(node.op, Sizes) and not is_static(node.op.dims)
        )
        # An opaque op is known only when it runs, as an input (rules/fold.egg, varies-opaque).
        known_late = isinstance(node.op, Input | Opaque)
        if known_late or symbolic or any(v in reads for v in node.inputs):
            reads.add(node.output)
            varying.add(cls)
        if _large_broadcast(node) or any(v in large for v in node.inputs):
            large.add(node.output)
            unfolded.add(cls)
    return FactContext(values, other, values.tables, types, varying, unfolded)


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
    return None if count <= FOLD_LIMIT else f"{count} elements is not small"


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
    """The main result of a fused kernel, before its epilogue."""
    main = decode_main_op(ctx.tables, node)
    assert main is not None
    kind = KernelKind.of_constructor(node.op)
    assert kind is not None
    if kind.has_prologue:
        operands = [ctx.values.body(prologue_of(node).id)]
    else:
        arity = main.arity if main.arity is not None else 1
        operands = [ctx.values.value(a.id) for a in node.args[:arity]]
    return np.asarray(KERNELS[type(main)](main, *operands))


def _has_epilogue_state(constructor: str) -> bool:
    """Kinds whose `extends` facts fusion.egg derives: a main op with an epilogue."""
    kind = KernelKind.of_constructor(constructor)
    return kind is not None and kind.main_op is not None


def _extends(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    e, y, ep, ep2 = args
    kernels = [
        n
        for n in ctx.values.data.classes.get(y.id, [])
        if _has_epilogue_state(n.op) and n.args[-1] == ep
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
    """A fact about where a tensor is read or how siblings are ordered: no value to check.

    Such are softmax-addend and raw-scores, and merge.egg's sibling-first and the like.
    """
    return None


def _merged_pair(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    m, y, e, axis = args
    merged, first, second = (ctx.values.value(c.id) for c in (m, y, e))
    if merged.ndim != first.ndim or not 0 <= axis < merged.ndim:
        return f"axis {axis} of rank {merged.ndim}"
    if merged.shape[axis] != first.shape[axis] + second.shape[axis]:
        return f"sizes {merged.shape[axis]} != {first.shape[axis]} + {second.shape[axis]}"
    head, tail = np.split(merged, [first.shape[axis]], axis=axis)
    return _close(head, first, "the first part") or _close(tail, second, "the second part")


def _runtime(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    cls = args[0].id
    if cls in ctx.varying or cls in ctx.unfolded or not is_static(_type(ctx, cls).shape):
        return None
    return f"e-class {cls} reads no input nor a broadcast too large to fold, and is static"


# ---- rotary embedding (rules/rope.egg) ---------------------------------------------------------


def _half_rotated(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    r, x = args
    return _exact(ctx.values.value(r.id), rotate_half(ctx.values.value(x.id)), "rotate_half(x)")


def _rope_sin_term(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    q, x, s = args
    expected = rotate_half(ctx.values.value(x.id)) * ctx.values.value(s.id)
    return _exact(ctx.values.value(q.id), expected, "rotate_half(x) * sin")


def _rope_cos_term(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    p, x, c = args
    expected = ctx.values.value(x.id) * ctx.values.value(c.id)
    return _exact(ctx.values.value(p.id), expected, "x * cos")


# ---- quantized arithmetic (rules/quantize.egg) ------------------------------------------------


def _exact(actual: np.ndarray, expected: np.ndarray, what: str) -> str | None:
    expected = np.asarray(expected)
    actual = np.asarray(actual)
    if actual.shape != expected.shape or not _same(actual.astype(expected.dtype), expected):
        return f"{what} differs"
    return None


def _splat_of(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    t, v = args
    x = ctx.values.value(t.id)
    return None if bool(np.all(x == v)) else f"not every element is {v}"


def _centered(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    e, q, z = (ctx.values.value(a.id) for a in args)
    return _exact(e, q.astype(np.int32) - z.astype(np.int32), "q - z")


def _dequantized(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    e, q, z, sc = (ctx.values.value(a.id) for a in args)
    t = e.dtype
    return _close(e, (q.astype(t) - z.astype(t)) * sc, "(q - z) * s")


def _uniform(axis: int) -> Oracle:
    def oracle(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
        x = ctx.values.value(args[0].id)
        if x.ndim < -axis:
            return None  # no such axis: nothing varies along it
        first = np.take(x, [0], axis=axis)
        return None if _same(np.broadcast_to(first, x.shape), x) else f"varies along axis {axis}"

    return oracle


def _scale_row(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    t, r = (ctx.values.value(a.id) for a in args)
    spreads = r.ndim == t.ndim and all(d in (1, n) for d, n in zip(r.shape, t.shape, strict=True))
    if not spreads or r.ndim < 2 or r.shape[-2] != 1:
        return f"a row of shape {r.shape} for a scale of shape {t.shape}"
    return _exact(t, np.broadcast_to(r, t.shape), "the scale spread from its row")


def _int_product(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    nodes = ctx.values.data.classes.get(args[0].id, [])
    return None if any(n.op in ("IntMatMul", "IntConv") for n in nodes) else "no integer product"


def _int_body(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    y, acc, body = args
    expected = ctx.values.value(y.id)
    return _close(ctx.values.body(body.id, acc=ctx.values.value(acc.id)), expected, "the body")


def _quantized(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    e, y, scale, zero, lo, dtype = args
    t = DType[dtype]
    info = ml_dtypes.iinfo(t.numpy)
    x = ctx.values.value(y.id)
    with np.errstate(all="ignore"):
        codes = np.round(x / x.dtype.type(scale)) + x.dtype.type(zero)
        codes = np.clip(codes, info.min, info.max)
        codes = np.where(np.isnan(codes), lo, codes)
    return _exact(ctx.values.value(e.id), codes.astype(np.int32).astype(t.numpy), "the codes")


def _unpacked4(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    c, p = (ctx.values.value(a.id) for a in args)
    return _exact(c, unpack_int4(p), "the nibbles")


def _nbits_zeros(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    z, zp, blocks = args
    expected = unpack_int4(ctx.values.value(zp.id))[:, :blocks]
    return _exact(ctx.values.value(z.id), expected, "the zero points")


def _int4_rows(packed: np.ndarray, scales: np.ndarray, zeros: np.ndarray, block: int) -> Any:
    """The dequantized rows [n, blocks * block] of Int4MatMul's operands."""
    k = packed.shape[1] * block
    return int4_weight(ops.Int4MatMul(block), packed, scales, zeros, k)


def _misblocked(packed: np.ndarray, block: int) -> str | None:
    """What is wrong with a block size for packed codes `[n, blocks, block / 2]`, if anything."""
    if packed.ndim != 3 or 2 * packed.shape[2] != block:
        return f"blocks of {block} codes for packed bytes of shape {packed.shape}"
    return None


def _nbits_rows(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    r, p, sc, zp, block = args
    v = ctx.values.value
    if (wrong := _misblocked(v(p.id), block)) is not None:
        return wrong
    rows = _int4_rows(v(p.id), v(sc.id), v(zp.id), block)
    return _close(v(r.id), rows, "the dequantized rows")


def _int4_weight(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    w, p, sc, zp, block = args
    v = ctx.values.value
    if (wrong := _misblocked(v(p.id), block)) is not None:
        return wrong
    weight = v(w.id)
    rows = _int4_rows(v(p.id), v(sc.id), v(zp.id), block)
    return _close(weight, rows[:, : weight.shape[0]].T, "the weight")


def _blocked(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    v, t, block = args
    spread = ctx.values.value(t.id)
    expected = np.repeat(ctx.values.value(v.id), block, axis=0)[: spread.shape[0]]
    return _exact(spread, expected, "the blocked rows")


def _dequantized4(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    e, q, z, sc, block = args
    x = ctx.values.value(e.id)
    k = x.shape[0]
    zero = np.repeat(ctx.values.value(z.id), block, axis=0)[:k]
    scale = np.repeat(ctx.values.value(sc.id), block, axis=0)[:k]
    codes = ctx.values.value(q.id)
    return _close(x, (codes.astype(x.dtype) - zero.astype(x.dtype)) * scale, "(q - z) * s")


def _codes8(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    q, c = (ctx.values.value(a.id) for a in args)
    shift = 8 if q.dtype == DType.I4.numpy else 0
    return _exact(c, (q.astype(np.int16) + shift).astype(np.uint8), "the uint8 codes")


def _pack_pairs(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    t, p = (ctx.values.value(a.id) for a in args)
    return _exact(p, (t[:, 0::2] | (t[:, 1::2] << 4)).astype(np.uint8), "the packed bytes")


def _int4_rows_of(ctx: FactContext, args: tuple[Any, ...], value: Any) -> str | None:
    e, rows, zrows, sc, block = args
    x = ctx.values.value(e.id)
    codes, zeros = ctx.values.value(rows.id), ctx.values.value(zrows.id)
    scales = ctx.values.value(sc.id).T
    blocks = scales.shape[1]
    zero = np.repeat(zeros[:, :blocks], block, axis=1)
    scale = np.repeat(scales, block, axis=1)
    weight = (codes.astype(x.dtype) - zero.astype(x.dtype)) * scale
    return _close(x, weight[:, : x.shape[0]].T, "the rows")


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
    "half-rotated": _half_rotated,
    "rope-sin-term": _rope_sin_term,
    "rope-cos-term": _rope_cos_term,
    "softmax-addend": _context_only,
    "raw-scores": _context_only,
    "merge-key": _constant,
    "sibling-first": _context_only,
    "sibling-after": _context_only,
    "chain-end": _context_only,
    "merged-pair": _merged_pair,
    "constant-pair": _merged_pair,
    "pair-wanted": _context_only,
    "runtime": _runtime,
    "epilogue-cap": _context_only,
    "splat-of": _splat_of,
    "centered": _centered,
    "dq": _dequantized,
    "scale": _context_only,
    "across-last": _uniform(-1),
    "across-penult": _uniform(-2),
    "scale-row": _scale_row,
    "int-product": _int_product,
    "int-body": _int_body,
    "quantized": _quantized,
    "unpacked4": _unpacked4,
    "nbits-zeros": _nbits_zeros,
    "nbits-rows": _nbits_rows,
    "int4-weight": _int4_weight,
    "blocked": _blocked,
    "dq4": _dequantized4,
    "codes8": _codes8,
    "wants-pairs": _context_only,
    "pack-pairs": _pack_pairs,
    "int4-rows": _int4_rows_of,
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
