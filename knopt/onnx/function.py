"""Model-local ONNX functions, inlined at their call sites."""

from __future__ import annotations

import onnx

from knopt.onnx.context import ImportContext, OnnxValue


def inline_function(
    ctx: ImportContext, node: onnx.NodeProto, function: onnx.FunctionProto
) -> list[OnnxValue | None]:
    """Import the body of `function` in place of the call `node`.

    The body sees the call's inputs under the function's parameter names, and attributes that
    refer to the call's attributes (`ref_attr_name`) take the call's values or the defaults.
    """
    from knopt.onnx.load import import_nodes

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
