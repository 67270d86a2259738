"""The importer of ONNX Einsum, decomposed into diagonals, sums, permutes and batched matmuls.

Each operand first loses its repeated letters (a diagonal: the two axes merged and sliced with
stride `n + 1`) and the letters no one else needs (a sum). Operands are then contracted left
to right: the letters both share and still need are batch axes, those both share and no one
else needs are contracted by one `MatMul`, and the rest ride along as rows or columns.
"""

from __future__ import annotations

import string

import onnx

from knopt.ir.graph import Value
from knopt.ir.op import Reduction
from knopt.ir.shape import Dim, numel
from knopt.onnx.context import ImportContext, OnnxValue, importer

_LETTERS = string.ascii_letters


def _parse(ctx: ImportContext, equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """The operand terms and the output term, with '...' spelled out as unused letters."""
    equation = equation.replace(" ", "")
    left, arrow, right = equation.partition("->")
    terms = left.split(",")
    if len(terms) != len(ranks):
        raise ctx.fail(f"Einsum '{equation}' names {len(terms)} operands, got {len(ranks)}")
    spare = [c for c in _LETTERS if c not in equation]
    widest = max(
        (r - len(t.replace("...", "")) for t, r in zip(terms, ranks, strict=True) if "..." in t),
        default=0,
    )
    ellipsis = "".join(spare[:widest])
    spelled = []
    for term, rank in zip(terms, ranks, strict=True):
        if "..." in term:
            width = rank - len(term.replace("...", ""))
            term = term.replace("...", ellipsis[widest - width :] if width else "")
        if len(term) != rank:
            raise ctx.fail(f"Einsum term '{term}' does not fit an operand of rank {rank}")
        spelled.append(term)
    if arrow:
        output = right.replace("...", ellipsis)
    else:
        counts = {c: "".join(spelled).count(c) for c in set("".join(spelled))}
        output = ellipsis + "".join(
            sorted(c for c, n in counts.items() if n == 1 and c not in ellipsis)
        )
    return spelled, output


def _diagonal(ctx: ImportContext, x: Value, term: str) -> tuple[Value, str]:
    """`x` with each repeated letter of `term` reduced to its diagonal."""
    b = ctx.builder
    while True:
        repeated = next((c for c in term if term.count(c) > 1), None)
        if repeated is None:
            return x, term
        first = term.index(repeated)
        second = term.index(repeated, first + 1)
        rest = [i for i in range(x.rank) if i not in (first, second)]
        size = x.shape[first]
        moved = b.permute(x, [*rest, first, second])
        merged = b.view(moved, (*moved.shape[:-2], size * size))
        diagonal = b.slice(
            merged, axis=merged.rank - 1, start=0, stop=size * size, step=_step(ctx, size)
        )
        x = diagonal
        term = "".join(term[i] for i in rest) + repeated


def _step(ctx: ImportContext, size: Dim) -> int:
    if not isinstance(size, int):
        raise ctx.fail("an Einsum diagonal needs a static size")
    return size + 1


def _sum_out(ctx: ImportContext, x: Value, term: str, needed: set[str]) -> tuple[Value, str]:
    """`x` summed over the letters that nothing else needs."""
    axes = [i for i, c in enumerate(term) if c not in needed]
    if not axes:
        return x, term
    b = ctx.builder
    total = b.reduce(Reduction.SUM, x, axes=axes)
    kept = [i for i in range(x.rank) if i not in axes]
    return b.view(total, tuple(x.shape[i] for i in kept)), "".join(term[i] for i in kept)


def _contract(
    ctx: ImportContext, a: Value, ta: str, c: Value, tc: str, needed: set[str]
) -> tuple[Value, str]:
    """The product of two operands, summed over the shared letters nothing else needs."""
    b = ctx.builder
    sizes: dict[str, Dim] = {}
    for x, term in ((a, ta), (c, tc)):
        for letter, dim in zip(term, x.shape, strict=True):
            if sizes.get(letter, 1) == 1:
                sizes[letter] = dim
    batch = [ch for ch in ta if ch in tc and ch in needed]
    summed = [ch for ch in ta if ch in tc and ch not in needed]
    rows = [ch for ch in ta if ch not in tc]
    cols = [ch for ch in tc if ch not in ta]

    def arrange(x: Value, term: str, order: list[str]) -> Value:
        moved = b.permute(x, [term.index(ch) for ch in order])
        return b.broadcast(moved, tuple(sizes[ch] for ch in order))

    def dims(letters: list[str]) -> Dim:
        return numel(sizes[ch] for ch in letters)

    left = b.view(arrange(a, ta, batch + rows + summed), (dims(batch), dims(rows), dims(summed)))
    right = b.view(arrange(c, tc, batch + summed + cols), (dims(batch), dims(summed), dims(cols)))
    product = b.matmul(left, right)
    letters = batch + rows + cols
    return b.view(product, tuple(sizes[ch] for ch in letters)), "".join(letters)


@importer("Einsum", since=12)
def _einsum(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    operands = [v for v in ctx.inputs(node, count=(1, None)) if v is not None]
    equation = ctx.attributes(node).string("equation")
    terms, output = _parse(ctx, equation, [v.rank for v in operands])
    pending = list(zip(operands, terms, strict=True))
    for i, (x, term) in enumerate(pending):
        x, term = _diagonal(ctx, x, term)
        others = set(output).union(*(t for j, (_, t) in enumerate(pending) if j != i))
        pending[i] = _sum_out(ctx, x, term, others)
    x, term = pending[0]
    for k, (c, tc) in enumerate(pending[1:], start=1):
        needed = set(output).union(*(t for _, t in pending[k + 1 :]))
        x, term = _contract(ctx, x, term, c, tc, needed)
        x, term = _sum_out(ctx, x, term, needed)
    x, term = _sum_out(ctx, x, term, set(output))
    if sorted(term) != sorted(output):
        raise ctx.fail(f"Einsum output '{output}' names letters no operand has")
    return [ctx.builder.permute(x, [term.index(ch) for ch in output])]
