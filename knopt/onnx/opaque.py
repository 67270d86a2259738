"""Nodes of ops knopt has no importer for, kept as opaque ops (`knopt.ir.op.Opaque`).

As onnxsim and onnxslim do, an unknown op does not reject the model: the node is kept as the
model wrote it, its inputs are optimized like any value, and its outputs are values no rule can
look inside. The ONNX writer writes it back unchanged (`knopt.onnx.export_ops`).

Each output needs a type, taken from the first of these that gives one:

1. the model's declarations (`value_info`, graph outputs), in the graph or any subgraph;
2. onnx's shape inference, run once per model and only if some opaque output needs it (it
   knows the standard ops, not custom domains such as com.microsoft).

A size neither gives becomes a symbolic size of its own (`{value}_dim{axis}`): the optimizer
costs it at the profile's symbolic size, and rules treat it as any symbolic size (equal only
to itself). Where a later op needs it equal to a known size, or to run the model, the model
must declare the output's shape. An output whose element type or rank neither gives cannot be
kept, if anything reads it: the error names it and says how to declare it.

Kept: ops of custom domains, and ops of ONNX's own domains (ai.onnx, ai.onnx.ml, ...) that knopt
lacks at the model's opset. Refused: an op of the default domain that ONNX does not define at
that opset (the written model would not be valid ONNX), and a node with a subgraph attribute
(its body reads the enclosing graph's values by name, which the writer renames).
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx

from knopt.errors import UnsupportedModelError
from knopt.ir.dtype import DType
from knopt.ir.graph import Value
from knopt.ir.op import Opaque, OpaqueCall, TensorType
from knopt.ir.shape import Dim, sym
from knopt.onnx.context import ImportContext, OnnxValue, WholeModel

_SUBGRAPHS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
_INT32_MAX = 2**31 - 1  # onnx's schema lookups take an int32 version
_INFERENCE_WEIGHT_LIMIT = 1024  # initializers above this many elements go to inference as inputs


def opaque_call(node: onnx.NodeProto, domain: str, version: int) -> OpaqueCall:
    """The `OpaqueCall` that keeps `node` (an op of `domain`, imported at `version`)."""
    return OpaqueCall(
        op_type=node.op_type,
        domain=domain,
        version=version,
        node=node.SerializeToString(),
        inputs=sum(1 for name in node.input if name),
        outputs=len(node.output),
        node_name=node.name,
    )


def import_opaque(
    ctx: ImportContext, node: onnx.NodeProto, domain: str, version: int
) -> list[OnnxValue | None]:
    """The outputs of `node`, kept as opaque ops (an output nothing reads may be None).

    Raises:
        UnsupportedModelError: If knopt imports strictly (`strict=True`, `--strict`), if the op
            is of the default domain but not an ONNX op at `version`, if the node has a
            subgraph, or if an output something reads has no element type or rank.
    """
    name = f"{domain}.{node.op_type}" if domain else node.op_type
    if ctx.strict:
        raise ctx.fail(
            f"op {name} is not supported at opset {version} (`knopt info MODEL` lists every "
            "unsupported node; without --strict, knopt keeps such nodes as they are)"
        )
    if not domain and not onnx.defs.has(node.op_type, min(version, _INT32_MAX), ""):
        raise ctx.fail(
            f"op {name} is not an ONNX op at opset {version}, nor one knopt knows; fix the op "
            "type or give it a domain (`knopt info MODEL` lists every node of an op knopt lacks)"
        )
    if any(a.type in _SUBGRAPHS for a in node.attribute):
        raise ctx.fail(
            f"op {name} is not supported at opset {version}, and a node with a subgraph "
            "cannot be kept as it is (its body reads values by name)"
        )
    ctx.attributes(node).skip(*(a.name for a in node.attribute))
    call = opaque_call(node, domain, version)
    inputs = [ctx.value(n) for n in node.input if n]
    outputs: list[OnnxValue | None] = []
    for index, out in enumerate(node.output):
        tensor_type = _output_type(ctx, out, call) if out else None
        if tensor_type is None:
            outputs.append(None)
            continue
        op = Opaque(call, index, tensor_type)
        value: Value = ctx.builder.apply(op, inputs)
        outputs.append(value)
    return outputs


def _output_type(ctx: ImportContext, name: str, call: OpaqueCall) -> TensorType | None:
    """The type of an opaque output, or None if it has none and nothing reads it.

    Raises:
        UnsupportedModelError: If something reads it and its element type or rank is unknown,
            or it is no tensor.
    """
    found = _value_type(ctx, name)
    where = f"{ctx.where}: output '{name}'"
    if found is not None and not found.HasField("tensor_type"):
        raise UnsupportedModelError(f"{where} is not a tensor; knopt's IR has tensors only")
    tensor = found.tensor_type if found is not None else None
    if tensor is None or not tensor.elem_type or not tensor.HasField("shape"):
        if name not in _read_names(ctx):
            return None
        what = "element type" if tensor is None or not tensor.elem_type else "rank"
        raise UnsupportedModelError(
            f"{where}: knopt keeps {call} as an opaque node, but the {what} of this output is "
            "unknown (the model declares none and onnx's shape inference does not know the op); "
            "declare it in the model's value_info (onnxruntime's symbolic_shape_infer writes "
            "them for its contrib ops)"
        )
    dtype = DType.from_onnx(tensor.elem_type, where)
    shape: list[Dim] = []
    for axis, dim in enumerate(tensor.shape.dim):
        if dim.HasField("dim_value") and dim.dim_value >= 0:
            shape.append(int(dim.dim_value))
        else:
            symbol = dim.dim_param or f"{name}_dim{axis}"
            shape.append(ctx.dims.get(symbol, sym(symbol)))
    return TensorType(tuple(shape), dtype)


def _value_type(ctx: ImportContext, name: str) -> onnx.TypeProto | None:
    """What the model declares of a value's type, or else what shape inference found."""
    whole = _whole(ctx)
    if whole.declared_types is None:
        whole.declared_types = dict(_declarations(whole.model.graph))
    declared = whole.declared_types.get(name)
    if declared is not None and _is_complete(declared):
        return declared
    if whole.inferred_types is None:
        whole.inferred_types = _inferred_types(whole.model)
    inferred = whole.inferred_types.get(name)
    candidates = [t for t in (declared, inferred) if t is not None]
    return max(candidates, key=_knowledge, default=None)


def _whole(ctx: ImportContext) -> WholeModel:
    assert ctx.whole is not None, "opaque ops are imported from a model, not while folding"
    return ctx.whole


def _declarations(graph: onnx.GraphProto) -> Iterator[tuple[str, onnx.TypeProto]]:
    """Every declared value type of a graph and of its nodes' subgraphs."""
    for info in [*graph.input, *graph.output, *graph.value_info]:
        if info.HasField("type"):
            yield info.name, info.type
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                yield from _declarations(sub)


def _is_complete(found: onnx.TypeProto) -> bool:
    """Whether a tensor type gives its element type and every size."""
    if not found.HasField("tensor_type"):
        return True  # nothing more to learn: it is refused as no tensor
    tensor = found.tensor_type
    return (
        bool(tensor.elem_type)
        and tensor.HasField("shape")
        and all(d.HasField("dim_value") or d.dim_param for d in tensor.shape.dim)
    )


def _knowledge(found: onnx.TypeProto) -> tuple[bool, bool, int]:
    """How much a type tells: its element type, its rank, then how many sizes."""
    tensor = found.tensor_type
    if not found.HasField("tensor_type") or not tensor.HasField("shape"):
        return bool(tensor.elem_type), False, 0
    known = sum(d.HasField("dim_value") or bool(d.dim_param) for d in tensor.shape.dim)
    return bool(tensor.elem_type), True, known


def _inferred_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Value types from onnx's shape inference, or none where it fails.

    Inference runs on a copy whose large weights are graph inputs of their type: it needs their
    shapes, not their data (which would be copied, and may pass protobuf's 2 GB).
    """
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    graph = light.graph
    graph.node.extend(model.graph.node)
    graph.input.extend(model.graph.input)
    graph.output.extend(model.graph.output)
    graph.value_info.extend(model.graph.value_info)
    inputs = {info.name for info in model.graph.input}
    for tensor in model.graph.initializer:
        if _numel(tensor) <= _INFERENCE_WEIGHT_LIMIT:
            graph.initializer.append(tensor)
        elif tensor.name not in inputs:
            graph.input.append(
                onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims)
            )
    try:
        inferred = onnx.shape_inference.infer_shapes(light, strict_mode=False, data_prop=True)
    except (onnx.shape_inference.InferenceError, ValueError, RuntimeError):
        return {}
    return dict(_declarations(inferred.graph))


def _numel(tensor: onnx.TensorProto) -> int:
    count = 1
    for dim in tensor.dims:
        count *= dim
    return count


def _read_names(ctx: ImportContext) -> frozenset[str]:
    """The value names something reads: a node (of any graph or function) or a graph output."""
    whole = _whole(ctx)
    if whole.read_names is None:
        names: set[str] = set()
        graphs = [whole.model.graph]
        nodes = [node for function in whole.model.functions for node in function.node]
        names.update(name for function in whole.model.functions for name in function.output)
        while graphs or nodes:
            if graphs:
                graph = graphs.pop()
                names.update(info.name for info in graph.output)
                nodes.extend(graph.node)
                continue
            node = nodes.pop()
            names.update(node.input)
            for attr in node.attribute:
                graphs.extend([attr.g] if attr.HasField("g") else list(attr.graphs))
        whole.read_names = frozenset(names)
    return whole.read_names
