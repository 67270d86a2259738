"""Seed instances: quantized models' spellings, for rules that random instances do not reach.

Some left sides sit at the end of a long chain of derived facts: an int4 weight is recognised
through seven rules (unpacked nibbles, blocked scales, repacked codes...), an integer
product's epilogue merges only behind a merged pair of products, whose constants pair behind
the ops that read them. Backward chaining through such chains rarely builds an instance that
every link accepts. Seeds are the spellings these chains were written for, drawn with random
sizes, codes, scales and zero points: ONNX models of MatMulNBits and of int4
DequantizeLinear products, imported as knopt imports them; and integer products of one int8
activation with their epilogues, built in the IR in the form quantize.egg's rules leave a
quantized projection in (a QDQ model would need those rules run first, deeper than the rounds).
The rules that make what a rule reads (`seed_deps`) run on them first, and the checked rule
matches wherever its left side occurs; its applications are judged as any other's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import ml_dtypes
import numpy as np

from knopt.ir import DType, GraphBuilder, Unary, Value, sym
from knopt.ir.graph import Graph
from knopt.onnx.load import import_model
from knopt.testing.onnxbuild import MS, OnnxBuilder
from knopt.testing.rulecheck.pattern import IR_CONSTRUCTORS, SATURATED
from knopt.testing.rulecheck.rulebook import LHS, Rule, Rulebook
from knopt.testing.rulecheck.sexpr import Expr, head

OPSET = 21  # int4 DequantizeLinear with blocks


class _Model(OnnxBuilder):
    """A small ONNX model of the opset int4 DequantizeLinear needs, imported as knopt does."""

    def __init__(self) -> None:
        super().__init__(OPSET)

    def graph(self, outputs: Sequence[str]) -> Graph:
        return import_model(self.model(outputs, "seed"), None)


def _pow2(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Scales that are powers of two: products of them are exact."""
    return np.exp2(-rng.integers(2, 6, shape)).astype(np.float32)


def _activations(rng: np.random.Generator, k: int, variant: int) -> Sequence[int | str]:
    """Activations `[m, k]`, `[1, m, k]` or `[b, m, k]`, by `variant`.

    The weight is then used as it is, viewed with a leading 1, or viewed and broadcast over
    the batch (the three int4 product rules).
    """
    m = int(rng.integers(1, 4))
    shapes: list[Sequence[int | str]] = [[m, k], [1, m, k], [2, m, k]]
    return shapes[variant % 3]


def _nbits(rng: np.random.Generator, variant: int) -> Graph:
    """A MatMulNBits product (4-bit, blocks of 16 or 32 along k), with or without zero points."""
    block = int(rng.choice((16, 32)))
    k, n = int(rng.integers(block // 2, 2 * block + 1)), int(rng.integers(1, 5))
    blocks = -(-k // block)
    m = _Model()
    args = [
        m.input("a", _activations(rng, k, variant)),
        m.const(rng.integers(0, 256, (n, blocks, block // 2), dtype=np.uint8)),
        m.const(_pow2(rng, (n, blocks))),
    ]
    if rng.random() < 0.7:
        args.append(m.const(rng.integers(0, 256, (n, -(-blocks // 2)), dtype=np.uint8)))
    y = m.node("MatMulNBits", args, MS, K=k, N=n, bits=4, block_size=block)
    return m.graph([y])


def _int4_dequantized(rng: np.random.Generator, variant: int) -> Graph:
    """A MatMul by an int4 or uint4 DequantizeLinear weight with blocks along k."""
    dtype = (ml_dtypes.int4, ml_dtypes.uint4)[int(rng.integers(0, 2))]
    block = int(rng.choice((16, 32)))
    k, n = int(rng.integers(block // 2, 2 * block + 1)), int(rng.integers(1, 5))
    blocks = -(-k // block)
    info = ml_dtypes.iinfo(dtype)
    low, high = int(info.min), int(info.max) + 1
    m = _Model()
    args = [
        m.const(rng.integers(low, high, (k, n)).astype(dtype)),
        m.const(_pow2(rng, (blocks, n))),
    ]
    if rng.random() < 0.7:
        args.append(m.const(rng.integers(low, high, (blocks, n)).astype(dtype)))
    w = m.node("DequantizeLinear", args, axis=0, block_size=block)
    return m.graph([m.node("MatMul", [m.input("a", _activations(rng, k, variant)), w])])


def _int8_products(rng: np.random.Generator, variant: int) -> Graph:
    """Integer products of one int8 activation, as quantize.egg leaves a quantized projection.

    Two or three products by int8 weights broadcast over a symbolic batch with one zero point,
    each with its epilogue (by `variant`): a dequantizing scale that is the activations' scale
    times the weight's (a product of constants the batch keeps from folding); a bias added
    first, then the saturation that quantizing writes; or a dequantization with a zero point
    in the first part only, or in the second only.
    """
    b, rows, k = sym("batch"), int(rng.integers(1, 4)), int(rng.integers(2, 7))
    g = GraphBuilder("seed")
    x = g.input("x", (b, rows, k), DType.I8)
    zx, zw = g.constant(_codes(rng, (1, 1, 1))), g.constant(_codes(rng, (1, 1, 1)))
    scale = g.constant(_pow2(rng, (1, 1, 1)))
    parts = int(rng.integers(2, 4))
    for part in range(parts):
        n = int(rng.integers(1, 5))  # one column makes the scales splats over the batch
        w = g.broadcast(g.view(g.constant(_codes(rng, (k, n))), (1, k, n)), (b, k, n))
        y = g.cast(g.int_matmul(x, w, zx, zw), DType.F32)
        g.output(_epilogue(g, rng, (y, scale), variant, part), f"y{part}")
    return g.build()


def _codes(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(-128, 128, shape).astype(np.int8)


def _epilogue(
    g: GraphBuilder, rng: np.random.Generator, ys: tuple[Value, Value], variant: int, part: int
) -> Value:
    """One of `_int8_products`' epilogues of part `part`'s product.

    `ys` holds the product (float32) and the activations' scale.
    """
    y, scale = ys
    shape = y.shape

    def spread(array: np.ndarray) -> Value:
        return g.broadcast(g.view(g.constant(array), (1, 1, array.size)), shape)

    n = int(shape[-1])  # type: ignore[arg-type]
    if variant % 3 == 0:
        return g.mul(y, g.mul(g.broadcast(scale, shape), spread(_pow2(rng, (n,)))))
    if variant % 3 == 1:
        bias = spread(rng.integers(-9, 10, n).astype(np.float32))
        c = g.clamp(g.add(bias, y), lo=-128, hi=127)
        lowest = g.scalar(-128.0, DType.F32, shape)
        return g.where(g.unary(Unary.IS_NAN, c), lowest, c)
    if part == (variant // 3) % 2:
        zero = g.constant(rng.integers(1, 10, (1, 1, 1)).astype(np.float32))
        y = g.sub(y, g.broadcast(zero, shape))
    return g.mul(y, spread(_pow2(rng, (n,))))


Seed = Callable[[np.random.Generator, int], Graph]
# Each seed family by the relation whose spelling it is. A rule gets the families whose
# relation it reads, directly or through the rules that make what it reads: running seeds
# costs seconds, and a rule that reads none of them would find nothing there.
SEEDS: dict[str, Seed] = {
    "unpacked4": _nbits,
    "dq4": _int4_dequantized,
    "chain-end": _int8_products,
}


def seed_graphs(book: Rulebook, rule: Rule, seed: int, count: int) -> list[Graph]:
    """`count` seed graphs for `rule` (none if it reads no seed's relation).

    Each of its families and variants in turn, with random sizes and values.
    """
    wanted = _closure(book, rule, frozenset(IR_CONSTRUCTORS))[0]
    families = [family for relation, family in SEEDS.items() if relation in wanted]
    rng = np.random.default_rng(seed)
    return [families[k % len(families)](rng, k // len(families)) for k in range(count) if families]


# ---- the rules that make what a left side reads ----------------------------------------------


def _atoms(expr: Expr) -> Iterator[str]:
    """The heads of every call inside `expr`."""
    if isinstance(expr, tuple) and expr:
        name = head(expr)
        if name is not None:
            yield name
        for item in expr[1:]:
            yield from _atoms(item)


def _makes(rule: Rule) -> set[str]:
    """What a rule's actions make: relations, functions and the constructors of terms."""
    made: set[str] = set()
    for action in rule.actions:
        if head(action) in ("union", "set", "let") and isinstance(action, tuple):
            for item in action[1:]:
                made.update(_atoms(item))
        else:
            made.update(_atoms(action))
    return made


def seed_deps(book: Rulebook, rule: Rule, present: frozenset[str]) -> set[str]:
    """The rules to run on seeds before `rule`: those that make what its query reads.

    A rule is needed if it makes a relation or function the query (or a needed rule's query)
    reads, or an IR op it names that the seeds lack (which only rules put beside theirs).
    Rules of the saturated analyses run anyway, and the checked rule never runs before itself
    (its unions would leave nothing to compare).
    """
    needed = _closure(book, rule, present)[1]
    # The spellings those rules read are what their own files' rewrites make of the seeds'
    # ops (a cast of codes moved inside the broadcast that spreads it): those run too, but only
    # the rewrites that add no op (one that adds some could keep growing).
    files = {book.rule(name).file for name in needed}
    return needed | {
        other.name
        for other in book.rules
        if other.file in files
        and other.ruleset not in SATURATED
        and other.name != rule.name
        and _is_reordering(other)
    }


def _closure(book: Rulebook, rule: Rule, present: frozenset[str]) -> tuple[set[str], set[str]]:
    """What `rule` reads, transitively, and the rules that make it (see `seed_deps`)."""
    wanted: set[str] = set()
    needed: set[str] = set()
    queue = [rule]
    while queue:
        for atom in queue.pop().query:
            for name in _atoms(atom):
                signature = book.signatures.get(name)
                if signature is None or name in wanted:
                    continue
                is_op = signature.kind == "constructor" and name in IR_CONSTRUCTORS
                if signature.kind == "constructor" and (not is_op or name in present):
                    continue
                wanted.add(name)
                for other in book.rules:
                    if (
                        other.name not in needed
                        and other.name != rule.name
                        and other.ruleset not in SATURATED
                        and name in _makes(other)
                    ):
                        needed.add(other.name)
                        queue.append(other)
    return wanted, needed


def _is_reordering(rule: Rule) -> bool:
    """Whether a rule is a rewrite whose right side has no more ops than its left side."""
    if len(rule.actions) != 1 or head(rule.actions[0]) != "union" or not rule.query:
        return False
    first = rule.query[0]
    if head(first) != "=" or not isinstance(first, tuple) or first[1] != LHS:
        return False
    action = rule.actions[0]
    assert isinstance(action, tuple)
    return _ops(action[2]) <= _ops(first[2])


def _ops(expr: Expr) -> int:
    """How many IR ops a term has."""
    return sum(1 for name in _atoms(expr) if name in IR_CONSTRUCTORS)
