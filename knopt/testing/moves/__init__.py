"""The moves a `GraphGen` makes, with their weights.

A move takes values from the generator's pool, adds nodes and puts its result back; it
returns None when the pool has nothing it can use. Weights favour the compositions the rules
target (templates), so that rules fire in most drawn graphs.
"""

from __future__ import annotations

from collections.abc import Callable

from knopt.ir.graph import Value
from knopt.testing.generator import GraphGen
from knopt.testing.moves import compute, elementwise, layout, opaque, quantize, template

Move = Callable[[GraphGen], Value | None]

MOVES: list[tuple[Move, int]] = [
    (elementwise.unary_float, 6),
    (elementwise.binary_float, 8),
    (elementwise.integer_ops, 2),
    (elementwise.logic, 2),
    (elementwise.clamp_chain, 3),
    (elementwise.cast, 2),
    (layout.view, 2),
    (layout.broadcast, 2),
    (layout.permute, 2),
    (layout.slice_, 2),
    (layout.flip_or_pad, 1),
    (layout.concat, 1),
    (layout.gather, 1),
    (layout.scatter, 1),
    (layout.index_makers, 1),
    (compute.reduce, 2),
    (compute.arg_or_cumsum, 1),
    (compute.softmax_or_norm, 2),
    (compute.matmul, 3),
    (compute.conv, 2),
    (compute.pool, 1),
    (compute.attention_op, 1),
    (template.affine_chain, 4),
    (template.layer_norm, 4),
    (template.rms_norm, 3),
    (template.gelu, 4),
    (template.gates, 4),
    (template.softmax, 3),
    (template.attention, 3),
    (template.swiglu, 2),
    (template.rope, 1),
    (template.rope_op, 1),
    (template.neutral, 3),
    (template.no_op_views, 2),
    (quantize.int_products, 1),
    (quantize.int4_matmul, 1),
    (quantize.qdq_matmul, 2),
    (quantize.matmul_integer, 1),
    (opaque.kept, 1),
]
# Moves whose graphs only the CPU runs (the GPU refuses opaque ops).
CPU_ONLY: frozenset[Move] = frozenset({opaque.kept})


def moves(*, opaque: bool = True) -> list[tuple[Move, int]]:
    """`MOVES`, without the opaque op's move unless `opaque`."""
    return [(move, weight) for move, weight in MOVES if opaque or move not in CPU_ONLY]


__all__ = ["CPU_ONLY", "MOVES", "Move", "moves"]
