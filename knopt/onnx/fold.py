"""Evaluating ONNX nodes while importing, when all their inputs are known.

Shape arithmetic (`Shape -> Gather -> Concat -> Reshape`) must become attributes, not runtime
work. A node whose inputs are all known is evaluated right away: symbolic integer values go
through the small folders registered with `@folder`; everything else is imported into a scratch
graph with the node's own importer and run on the CPU executor, so folding has exactly the
semantics of running. Large float results are not folded: the optimizer's constant folding
(rules/fold.egg) decides about those.
"""

from __future__ import annotations

import numpy as np
import onnx

from knopt.cpu.executor import run_graph
from knopt.ir.builder import GraphBuilder
from knopt.onnx.context import (
    KNOWN_LIMIT,
    Attributes,
    ImportContext,
    Known,
    find_folder,
    find_importer,
)

# Ops never evaluated at import time: random ones have no value to know, and dequantized
# weights stay integer codes and scales, for the optimizer's integer products
# (rules/quantize.egg); rules/fold.egg folds them where the float form is chosen.
_NEVER_FOLD = frozenset(
    {
        "DequantizeLinear",
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
    }
)


def fold_node(ctx: ImportContext, node: onnx.NodeProto, domain: str) -> list[Known | None] | None:
    """The node's outputs if they can be known now, else None (then it is imported)."""
    if domain or node.op_type in _NEVER_FOLD or _has_subgraph(node):
        return None  # subgraphs read the enclosing scope, which a scratch graph lacks
    args: list[Known | None] = []
    for name in node.input:
        found = ctx.env.get(name) if name else None
        if name and not isinstance(found, Known):
            return None
        args.append(found)  # type: ignore[arg-type]
    if any(a is not None and a.is_symbolic for a in args):
        fn = find_folder(domain, node.op_type)
        if fn is None:
            return None
        ctx._attributes = Attributes(node, ctx.where)
        symbolic = fn(ctx, node, args)
        return None if symbolic is None else list(symbolic)
    return _evaluate(ctx, node, args)


def _evaluate(
    ctx: ImportContext, node: onnx.NodeProto, args: list[Known | None]
) -> list[Known | None] | None:
    fn = find_importer("", node.op_type, ctx.opset)
    if fn is None:
        return None
    scratch = ImportContext(GraphBuilder("fold"), ctx.opset, where=ctx.where)
    scratch.builder.current_name = ctx.builder.current_name  # a size error names the node
    scratch.functions = ctx.functions
    for name, known in zip(node.input, args, strict=True):
        if name and known is not None:
            scratch.env[name] = known
    scratch._attributes = Attributes(node, ctx.where)
    outputs = list(fn(scratch, node))
    ctx._attributes = scratch._attributes
    results: list[Known | None] = []
    builder = scratch.builder
    pending = []
    for index, out in enumerate(outputs):
        if out is None or isinstance(out, Known):
            results.append(out)
        else:
            if out.dtype.is_float and _numel(out.shape) > KNOWN_LIMIT:
                return None
            builder.output(out, f"out{index}")
            pending.append(index)
            results.append(None)
    if pending:
        arrays = run_graph(builder.build(), {})
        for index, array in zip(pending, arrays, strict=True):
            dtype = outputs[index].dtype  # type: ignore[union-attr]
            results[index] = Known(np.asarray(array, dtype.numpy), dtype)
    return results


def _numel(shape: tuple[object, ...]) -> int:
    total = 1
    for d in shape:
        if not isinstance(d, int):
            return KNOWN_LIMIT + 1
        total *= d
    return total


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute
    )
