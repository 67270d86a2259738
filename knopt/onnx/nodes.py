"""Importing ONNX nodes in order: the graph's, a subgraph's, or a model-local function's body.

A node is evaluated right away when its inputs are known (`fold.py`), inlined when it calls a
model-local function, and otherwise imported by its op's importer (`knopt/onnx/ops`), which
the registry in `context.py` finds at run time, or kept as it is where there is none
(`opaque.py`).
"""

from __future__ import annotations

import onnx

from knopt.errors import InvalidGraphError, UnsupportedModelError
from knopt.ir.dtype import DType
from knopt.onnx.context import Attributes, ImportContext, Known, OnnxValue, find_importer
from knopt.onnx.data import tensor_array
from knopt.onnx.fold import fold_node
from knopt.onnx.opaque import import_opaque
from knopt.onnx.order import in_topological_order, undefined_input_error


def inline_function(
    ctx: ImportContext, node: onnx.NodeProto, function: onnx.FunctionProto
) -> list[OnnxValue | None]:
    """Import the body of `function` in place of the call `node`.

    The body sees the call's inputs under the function's parameter names, and attributes that
    refer to the call's attributes (`ref_attr_name`) take the call's values or the defaults.
    """
    calls = {a.name: a for a in node.attribute}
    defaults = {a.name: a for a in function.attribute_proto}
    ctx.attributes(node).skip(*calls)
    outer_env = ctx.env
    inner_env: dict[str, OnnxValue] = {}
    for param, arg in zip(function.input, node.input, strict=False):
        if arg:
            inner_env[param] = outer_env[arg]
    body = [_bind_attributes(n, calls, defaults) for n in function.node]
    outer_where, outer_attributes = ctx.where, ctx._attributes
    ctx.env = inner_env
    try:
        import_nodes(ctx, body)
        results: list[OnnxValue | None] = [inner_env.get(name) for name in function.output]
    finally:
        ctx.env = outer_env
        ctx.where, ctx._attributes = outer_where, outer_attributes
    return results


def _bind_attributes(
    node: onnx.NodeProto,
    calls: dict[str, onnx.AttributeProto],
    defaults: dict[str, onnx.AttributeProto],
) -> onnx.NodeProto:
    if not any(a.ref_attr_name for a in node.attribute):
        return node
    bound = onnx.NodeProto()
    bound.CopyFrom(node)
    del bound.attribute[:]
    for attr in node.attribute:
        if not attr.ref_attr_name:
            bound.attribute.append(attr)
            continue
        source = calls.get(attr.ref_attr_name) or defaults.get(attr.ref_attr_name)
        if source is not None:
            copy = onnx.AttributeProto()
            copy.CopyFrom(source)
            copy.name = attr.name
            bound.attribute.append(copy)
    return bound


def initializer_value(tensor: onnx.TensorProto) -> Known:
    """An initializer (of the graph or of a subgraph) as a known value.

    Raises:
        UnsupportedModelError: If its element type is not supported.
        MemoryLimitError: If it declares more elements than the memory budget holds.
        InvalidModelError: If its data does not match its shape.
    """
    where = f"initializer '{tensor.name}'"
    dtype = DType.from_onnx(tensor.data_type, where)
    return Known(tensor_array(tensor, where), dtype)


def import_nodes(ctx: ImportContext, nodes: list[onnx.NodeProto]) -> None:
    """Import nodes into `ctx` in topological order, binding their outputs in `ctx.env`.

    Raises:
        InvalidGraphError: If a node reads a value that nothing defines (or only a cycle does),
            or defines one that is defined already (in its graph or an enclosing one).
    """
    for index, node in enumerate(in_topological_order(nodes, ctx.env)):
        ctx.where = f"node '{node.name or f'#{index}'}' ({node.op_type})"
        ctx.builder.current_name = node.name or f"{node.op_type}_{index}"
        for name in node.input:
            if name and name not in ctx.env:
                raise undefined_input_error(ctx.where, name, nodes, ctx.env)
        for name in node.output:
            if name and name in ctx.env:
                raise InvalidGraphError(
                    f"{ctx.where}: computes '{name}', which is already defined (by an input, "
                    "an initializer or another node); ONNX values are assigned once: rename one"
                )
        outputs = _import_node(ctx, node)
        for name, result in zip(node.output, outputs, strict=False):
            if name and result is not None:
                ctx.env[name] = result
        for name in list(node.output)[len(outputs) :]:
            if name:
                ctx.env.pop(name, None)


def _import_node(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue | None]:
    domain = "" if node.domain == "ai.onnx" else node.domain
    ctx._attributes = Attributes(node, ctx.where)
    if (domain, node.op_type) in ctx.functions:
        return inline_function(ctx, node, ctx.functions[(domain, node.op_type)])
    version = ctx.domain_opsets.get(domain, ctx.opset) if domain else ctx.opset
    _check_schema(ctx, node, domain, version)
    outputs: list[OnnxValue | None] | None = fold_node(ctx, node, domain)  # type: ignore[assignment]
    if outputs is None:
        fn = find_importer(domain, node.op_type, version)
        ctx._attributes = Attributes(node, ctx.where)
        if fn is None:
            outputs = import_opaque(ctx, node, domain, version)
        else:
            imported: list[OnnxValue | None] = list(fn(ctx, node))
            outputs = imported
    unread = ctx._attributes.unread()
    if unread:
        raise UnsupportedModelError(
            f"{ctx.where}: attribute(s) {', '.join(unread)} are not supported (knopt never "
            "ignores an attribute; remove it from the model if it has no effect)"
        )
    return outputs


def _check_schema(ctx: ImportContext, node: onnx.NodeProto, domain: str, version: int) -> None:
    """Refuse a node that its ONNX schema does not allow.

    Counts of inputs and outputs, required inputs left empty and required attributes missing
    are checked, so that importers may read what a schema requires without looking first.
    """
    try:
        schema = onnx.defs.get_schema(node.op_type, min(version, 2**31 - 1), domain)
    except onnx.defs.SchemaError:
        return  # not an ONNX op at this version (a contrib op): its importer checks
    for what, names, low, high in (
        ("inputs", node.input, schema.min_input, schema.max_input),
        ("outputs", node.output, schema.min_output, schema.max_output),
    ):
        count = len(names)
        while count and not names[count - 1]:
            count -= 1  # trailing empty names are absent optional ones
        if not low <= count <= high:
            expected = str(low) if low == high else f"{low} to {high}"
            raise ctx.fail(f"{node.op_type} takes {expected} {what}, got {count}")
    single = onnx.defs.OpSchema.FormalParameterOption.Single
    for index, formal in enumerate(schema.inputs):
        if formal.option == single and index < len(node.input) and not node.input[index]:
            raise ctx.fail(f"input {index} ({formal.name}) is required but has no name")
    present = {a.name for a in node.attribute}
    missing = sorted(n for n, a in schema.attributes.items() if a.required and n not in present)
    if missing:
        raise ctx.fail(f"required attribute(s) {', '.join(missing)} are missing")
