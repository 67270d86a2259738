"""Float32 carriers for exported nodes whose op lacks a 16-bit float type at the export opset.

ONNX added bfloat16 to Conv, the pools, HardSwish and others only at opset 22, so a bfloat16
graph saved at opset 18 would not be valid ONNX. Such a node computes in float32 between Casts:
its 16-bit inputs are widened and its outputs rounded back, which is also how knopt's CPU
executor computes 16-bit floats.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping, Sequence

import onnx
from onnx import TensorProto, defs, helper, shape_inference

_NARROW = frozenset({TensorProto.BFLOAT16, TensorProto.FLOAT16})
_FLOAT = "tensor(float)"
Formal = defs.OpSchema.FormalParameter


def carry_narrow_floats(
    nodes: list[onnx.NodeProto],
    types: MutableMapping[str, int],
    opset: int,
    fresh: Callable[[str], str],
    fresh_node: Callable[[str], str],
) -> list[onnx.NodeProto]:
    """`nodes` with each node that cannot take its 16-bit float inputs wrapped in Casts.

    Args:
        nodes: Default-domain nodes in topological order.
        types: Element type of each value name known so far; the nodes' outputs are added.
        opset: The version of the default domain being written.
        fresh: Makes an unused value name from a wanted one.
        fresh_node: Makes an unused node name from a wanted one.
    """
    result: list[onnx.NodeProto] = []
    for node in nodes:
        if node.domain:  # onnxruntime's ops take what its kernels take
            result.append(node)
            continue
        schema = defs.get_schema(node.op_type, opset, "")
        narrow = _unsupported_params(schema, node, types)
        if not narrow:
            result.append(node)
            _record_outputs(schema, node, types)
            continue
        carried = onnx.NodeProto()
        carried.CopyFrom(node)
        for i, name in enumerate(node.input):
            if name and _formal(schema.inputs, i).type_str in narrow:
                wide = fresh(f"{name}_f32")
                result.append(_cast(name, wide, TensorProto.FLOAT, fresh_node))
                types[wide] = TensorProto.FLOAT
                carried.input[i] = wide
        back = []
        for i, name in enumerate(node.output):
            param = _formal(schema.outputs, i).type_str
            if name and param in narrow:
                wide = fresh(f"{name}_f32")
                carried.output[i] = wide
                back.append(_cast(wide, name, narrow[param], fresh_node))
        result.append(carried)
        _record_outputs(schema, carried, types)
        for cast in back:
            result.append(cast)
            types[cast.output[0]] = cast.attribute[0].i
    return result


def _formal(params: Sequence[Formal], index: int) -> Formal:
    return params[min(index, len(params) - 1)]  # the last one may be variadic


def _unsupported_params(
    schema: defs.OpSchema, node: onnx.NodeProto, types: MutableMapping[str, int]
) -> dict[str, int]:
    """Type parameters bound to a 16-bit float they do not allow, but that allow float32."""
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    narrow: dict[str, int] = {}
    for i, name in enumerate(node.input):
        dtype = types.get(name)
        if not name or dtype not in _NARROW:
            continue
        param = _formal(schema.inputs, i).type_str
        options = allowed.get(param, set())
        if _FLOAT in options and _type_str(dtype) not in options:
            narrow[param] = dtype
    return narrow


def _record_outputs(
    schema: defs.OpSchema, node: onnx.NodeProto, types: MutableMapping[str, int]
) -> None:
    """Add the element types of the node's outputs, where onnx can infer them."""
    if any(name and name not in types for name in node.input):
        return  # an input of unknown type: its outputs stay unknown, and are never carried
    known = {name: helper.make_tensor_type_proto(types[name], None) for name in node.input if name}
    try:
        inferred = shape_inference.infer_node_outputs(schema, node, known)
    except (shape_inference.InferenceError, onnx.checker.ValidationError, RuntimeError):
        return  # inference needs more than element types (a shape, a value): outputs unknown
    for name, proto in inferred.items():
        if proto.tensor_type.elem_type:
            types[name] = proto.tensor_type.elem_type


def _type_str(dtype: int) -> str:
    return f"tensor({helper.tensor_dtype_to_string(dtype).removeprefix('TensorProto.').lower()})"


def _cast(source: str, target: str, to: int, fresh_node: Callable[[str], str]) -> onnx.NodeProto:
    return helper.make_node("Cast", [source], [target], name=fresh_node(f"{target}_cast"), to=to)
