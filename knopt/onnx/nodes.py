"""Importing ONNX nodes in order: the graph's, a subgraph's, or a model-local function's body.

A node is evaluated right away when its inputs are known (`fold.py`), inlined when it calls a
model-local function, and otherwise imported by its op's importer (`knopt/onnx/ops`), which
the registry in `context.py` finds at run time.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from knopt.errors import InvalidGraphError, InvalidModelError, UnsupportedModelError
from knopt.ir.dtype import DType
from knopt.ir.validate import MAX_ELEMENTS
from knopt.onnx.context import Attributes, ImportContext, Known, OnnxValue, find_importer
from knopt.onnx.fold import fold_node
from knopt.onnx.order import undefined_input_error


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
        InvalidGraphError: If it declares more than 2^34 elements.
        InvalidModelError: If its data does not match its shape.
    """
    where = f"initializer '{tensor.name}'"
    dtype = DType.from_onnx(tensor.data_type, where)
    count = int(np.prod(tensor.dims, dtype=np.float64))
    if count > MAX_ELEMENTS:
        raise InvalidGraphError(
            f"{where}: declares {count} elements, more than the 2^34 knopt allows; "
            "fix its declared shape"
        )
    try:
        array = numpy_helper.to_array(tensor)
    except (ValueError, TypeError) as err:
        raise InvalidModelError(f"{where}: data does not match its shape ({err})") from err
    return Known(np.asarray(array, dtype.numpy), dtype)


def import_nodes(ctx: ImportContext, nodes: list[onnx.NodeProto]) -> None:
    """Import nodes in order into `ctx`, binding their outputs in `ctx.env`."""
    for index, node in enumerate(nodes):
        ctx.where = f"node '{node.name or f'#{index}'}' ({node.op_type})"
        ctx.builder.current_name = node.name or f"{node.op_type}_{index}"
        for name in node.input:
            if name and name not in ctx.env:
                raise undefined_input_error(ctx.where, name, nodes, ctx.env)
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
    outputs: list[OnnxValue | None] | None = fold_node(ctx, node, domain)  # type: ignore[assignment]
    if outputs is None:
        version = ctx.domain_opsets.get(domain, ctx.opset) if domain else ctx.opset
        fn = find_importer(domain, node.op_type, version)
        if fn is None:
            name = f"{domain}.{node.op_type}" if domain else node.op_type
            raise UnsupportedModelError(
                f"{ctx.where}: op {name} is not supported at opset {version} (`knopt info "
                "MODEL` lists every unsupported node)"
            )
        ctx._attributes = Attributes(node, ctx.where)
        imported: list[OnnxValue | None] = list(fn(ctx, node))
        outputs = imported
    unread = ctx._attributes.unread()
    if unread:
        raise UnsupportedModelError(
            f"{ctx.where}: attribute(s) {', '.join(unread)} are not supported (knopt never "
            "ignores an attribute; remove it from the model if it has no effect)"
        )
    return outputs
