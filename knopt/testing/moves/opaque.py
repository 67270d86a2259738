"""The move that keeps an ONNX node as it is: an opaque op, which rules must optimize around.

Its ops are standard ones that onnx's reference evaluator runs (the CPU oracle runs them that
way), one with two outputs among them. A rule that looked through one would change what the
graph computes, which the fuzz tests' comparison with the original would catch.
"""

from __future__ import annotations

from knopt.ir.graph import Value
from knopt.ir.op import TensorType
from knopt.testing.generator import GraphGen, static_shape
from knopt.testing.opaque import kept_node

UNARY = ("Neg", "Sin", "Softsign")


def kept(gen: GraphGen) -> Value | None:
    """A unary op, or a Split of the last axis in two (when it is even), kept as it is."""
    x = gen.float_value(min_rank=1)
    shape = static_shape(x)
    g = gen.builder
    if shape[-1] % 2 == 0 and gen.boolean(0.3):
        half = TensorType((*shape[:-1], shape[-1] // 2), x.dtype)
        first, second = kept_node(g, "Split", [x], [half, half], axis=-1, num_outputs=2)
        gen.add(second)
        return gen.add(first)
    (y,) = kept_node(g, gen.choose(UNARY), [x], [x.type])
    return gen.add(y)
