"""Importers of ONNX control flow: If, Loop and Scan, resolved while importing.

knopt graphs have no control flow. An If whose condition is known imports only the branch it
takes; one whose condition is computed imports both branches and selects each output with a
`Where`, which is exact because branches have no side effects (their outputs must then have
equal types). Loop and Scan are unrolled: Scan over its static sequence length, Loop for as long
as its trip count and condition, which must be known when loading, say.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from knopt.ir.dtype import DType
from knopt.ir.graph import Value
from knopt.onnx.context import ImportContext, Known, OnnxValue, importer
from knopt.onnx.nodes import import_nodes, initializer_value
from knopt.onnx.ops.common import axis_of

MAX_UNROLL = 4096  # iterations; a longer Loop is more likely a mistake than a model


def import_subgraph(
    ctx: ImportContext, graph: onnx.GraphProto, args: Sequence[OnnxValue | None]
) -> list[OnnxValue]:
    """Import `graph` in place, its inputs bound to `args`, and return its outputs.

    The subgraph sees every value of the enclosing scope, as ONNX scoping says.

    Raises:
        UnsupportedModelError: If the subgraph uses anything knopt lacks or an output is unset.
    """
    inner: dict[str, OnnxValue] = dict(ctx.env)
    for tensor in graph.initializer:
        inner[tensor.name] = initializer_value(tensor)
    for info, arg in zip(graph.input, args, strict=False):
        if arg is not None:
            inner[info.name] = arg
    outer_env, outer_where, outer_attributes = ctx.env, ctx.where, ctx._attributes
    outer_name = ctx.builder.current_name
    ctx.env = inner
    try:
        import_nodes(ctx, list(graph.node))
        missing = [o.name for o in graph.output if o.name not in inner]
        if missing:
            raise ctx.fail(f"subgraph '{graph.name}' never computes {missing}")
        return [inner[o.name] for o in graph.output]
    finally:
        ctx.env, ctx.where, ctx._attributes = outer_env, outer_where, outer_attributes
        ctx.builder.current_name = outer_name


def _known_scalar(
    ctx: ImportContext, value: OnnxValue | None, name: str, what: str
) -> int | float | bool | None:
    """The single element of a known value, or an error saying it must be known."""
    if value is None:
        return None
    if not isinstance(value, Known) or value.is_symbolic:
        raise ctx.needs_known(name, what)
    if value.array.size != 1:
        raise ctx.fail(f"{what} must hold one value, not {value.array.size}")
    return value.concrete().reshape(-1)[0].item()


def _int_known(value: int) -> Known:
    return Known(np.array(value, np.int64), DType.I64)


def _bool_known(value: bool) -> Known:
    return Known(np.array(value), DType.BOOL)


# ---- If ----------------------------------------------------------------------------------------


@importer("If", since=1)
def _if(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    attrs = ctx.attributes(node)
    then_graph, else_graph = attrs.graph("then_branch"), attrs.graph("else_branch")
    if then_graph is None or else_graph is None:
        raise ctx.fail("If needs then_branch and else_branch")
    condition = ctx.lookup(node.input[0])
    if isinstance(condition, Known) and not condition.is_symbolic:
        known = _known_scalar(ctx, condition, node.input[0], "the If condition")
        taken = then_graph if known else else_graph
        return import_subgraph(ctx, taken, [])
    yes = import_subgraph(ctx, then_graph, [])
    no = import_subgraph(ctx, else_graph, [])
    if len(yes) != len(no) or len(yes) != len(node.output):
        raise ctx.fail(f"If branches give {len(yes)} and {len(no)} outputs for {len(node.output)}")
    b = ctx.builder
    flag = b.view(ctx.value(node.input[0]), ())
    merged: list[OnnxValue] = []
    for a, c in zip(yes, no, strict=True):
        left = a if isinstance(a, Value) else ctx.materialize(a)
        right = c if isinstance(c, Value) else ctx.materialize(c)
        if left.type != right.type:
            raise ctx.needs_known(node.input[0], "the If condition (its branches differ in type)")
        merged.append(b.where(flag, left, right))
    return merged


# ---- Loop --------------------------------------------------------------------------------------


@importer("Loop", since=1)
def _loop(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    body = ctx.attributes(node).graph("body")
    assert body is not None, "Loop's body is a required attribute"
    names = list(node.input) + [""] * 2
    trips = _known_scalar(ctx, ctx.lookup(names[0]) if names[0] else None, names[0], "trip count")
    if isinstance(trips, float):  # M is int64: a float would need rounding, NaN has no integer
        raise ctx.fail(f"the trip count must be an integer, not {trips}")
    go = _known_scalar(ctx, ctx.lookup(names[1]) if names[1] else None, names[1], "condition")
    carried: list[OnnxValue] = [ctx.lookup(n) for n in node.input[2:]]
    count = len(carried)
    if len(body.input) != 2 + count or len(body.output) < 1 + count:
        raise ctx.fail(
            f"Loop body takes {len(body.input)} inputs and gives {len(body.output)} outputs "
            f"for {count} carried values"
        )
    scans: list[list[OnnxValue]] = [[] for _ in range(len(body.output) - 1 - count)]
    iteration = 0
    while (trips is None or iteration < int(trips)) and (go is None or bool(go)):
        if iteration >= MAX_UNROLL:
            raise ctx.fail(f"Loop runs more than {MAX_UNROLL} iterations; knopt unrolls loops")
        args = [_int_known(iteration), _bool_known(True if go is None else bool(go)), *carried]
        outputs = import_subgraph(ctx, body, args)
        condition_name = body.output[0].name
        go = _known_scalar(ctx, outputs[0], condition_name, "the loop condition")
        carried = outputs[1 : 1 + count]
        for store, value in zip(scans, outputs[1 + count :], strict=True):
            store.append(value)
        iteration += 1
    if any(not store for store in scans):
        raise ctx.fail("a Loop that runs no iteration has no scan outputs knopt can shape")
    return [*carried, *(_stack(ctx, store, 0) for store in scans)]


def _stack(ctx: ImportContext, values: Sequence[OnnxValue], axis: int) -> Value:
    """Values of one shape stacked along a new `axis`."""
    b = ctx.builder
    parts = []
    for value in values:
        v = value if isinstance(value, Value) else ctx.materialize(value)
        axis_at = axis_of(ctx, axis, v.rank + 1)
        parts.append(b.view(v, (*v.shape[:axis_at], 1, *v.shape[axis_at:])))
    return b.concat(parts, axis=axis_of(ctx, axis, parts[0].rank))


# ---- Scan --------------------------------------------------------------------------------------


def _scan(
    ctx: ImportContext,
    node: onnx.NodeProto,
    states: list[OnnxValue],
    inputs: list[Value],
) -> list[OnnxValue]:
    """Scan-9 semantics over the given states and scan inputs (no batch axis)."""
    attrs = ctx.attributes(node)
    body = attrs.graph("body")
    assert body is not None, "Scan's body is a required attribute"
    input_axes = attrs.ints("scan_input_axes", [0] * len(inputs))
    input_backward = attrs.ints("scan_input_directions", [0] * len(inputs))
    output_count = len(body.output) - len(states)
    output_axes = attrs.ints("scan_output_axes", [0] * output_count)
    output_backward = attrs.ints("scan_output_directions", [0] * output_count)
    if (
        output_count < 0
        or len(body.input) != len(states) + len(inputs)
        or not len(input_axes) == len(input_backward) == len(inputs)
        or not len(output_axes) == len(output_backward) == output_count
    ):
        raise ctx.fail("Scan's body, axes and directions do not fit its inputs and outputs")
    axes = [axis_of(ctx, a, x.rank) for a, x in zip(input_axes, inputs, strict=True)]
    lengths = {x.shape[a] for a, x in zip(axes, inputs, strict=True)}
    if len(lengths) != 1 or not isinstance(length := lengths.pop(), int):
        raise ctx.fail(
            f"Scan inputs need one static sequence length, got {sorted(map(str, lengths))}"
        )
    b = ctx.builder
    collected: list[list[OnnxValue]] = [[] for _ in range(output_count)]
    for step in range(length):
        slices: list[OnnxValue] = []
        for x, axis, backward in zip(inputs, axes, input_backward, strict=True):
            t = length - 1 - step if backward else step
            part = b.slice(x, axis=axis, start=t, stop=t + 1)
            slices.append(b.view(part, x.shape[:axis] + x.shape[axis + 1 :]))
        outputs = import_subgraph(ctx, body, [*states, *slices])
        states = outputs[: len(states)]
        for store, value in zip(collected, outputs[len(states) :], strict=True):
            store.append(value)
    stacked = []
    for store, axis, backward in zip(collected, output_axes, output_backward, strict=True):
        if not store:
            raise ctx.fail("a Scan over an empty sequence has no outputs knopt can shape")
        stacked.append(_stack(ctx, store[::-1] if backward else store, axis))
    return [*states, *stacked]


@importer("Scan", since=9)
def _scan_9(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    attrs = ctx.attributes(node)
    scanned = attrs.int("num_scan_inputs")
    names = list(node.input)
    states = [ctx.lookup(n) for n in names[: len(names) - scanned]]
    inputs = [ctx.value(n) for n in names[len(names) - scanned :]]
    return _scan(ctx, node, states, inputs)


@importer("Scan", since=8)
def _scan_8(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    attrs = ctx.attributes(node)
    scanned = attrs.int("num_scan_inputs")
    if attrs.has("directions"):
        raise ctx.fail("Scan-8 directions are not supported")
    names = list(node.input)
    if names[0]:
        lengths = ctx.known_input(node, 0, "sequence_lens")
        assert lengths is not None
        full = ctx.value(names[-1]).shape[1]
        if np.any(lengths != full):
            raise ctx.fail("Scan-8 with sequence_lens shorter than the input is not supported")
    states = [ctx.value(n) for n in names[1 : len(names) - scanned]]
    inputs = [ctx.value(n) for n in names[len(names) - scanned :]]
    b = ctx.builder
    batch = (states + inputs)[0].shape[0]
    if not isinstance(batch, int):
        raise ctx.fail("Scan-8 needs a static batch size")
    per_batch: list[list[OnnxValue]] = []
    for i in range(batch):
        pick = [b.view(b.slice(v, axis=0, start=i, stop=i + 1), v.shape[1:]) for v in states]
        rows = [b.view(b.slice(v, axis=0, start=i, stop=i + 1), v.shape[1:]) for v in inputs]
        per_batch.append(_scan(ctx, node, list(pick), rows))
    return [_stack(ctx, [r[k] for r in per_batch], 0) for k in range(len(per_batch[0]))]
