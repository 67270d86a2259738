"""A kernel program as ONNX, each fused kernel a model-local function of the `knopt` domain.

The functions' bodies are standard ops, so onnxruntime runs the model and Netron shows the
kernels.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import onnx
from onnx import helper

from knopt.errors import CodegenError, KnoptError
from knopt.ir.graph import Graph
from knopt.onnx.export import DEFAULT_OPSET, _model, check_opset

DOMAIN = "knopt"


def save_kernels(
    graph: Graph,
    groups: Mapping[int, int],
    kinds: Mapping[int, str],
    path: str | os.PathLike[str] | None = None,
    *,
    opset: int = DEFAULT_OPSET,
) -> onnx.ModelProto:
    """Export `graph` with the nodes of each group wrapped in a function.

    Args:
        graph: The optimized graph (fused kernels written out as their ops).
        groups: IR node id to kernel key, for the nodes of fused kernels.
        kinds: Kernel key to the kernel's kind ("elementwise", "layer_norm", ...), which names
            the function.
        path: Where to write the model, or None to only return it.
        opset: The version of the default ONNX domain.

    Raises:
        UnsupportedModelError: If the opset is too old or too new.
        CodegenError: If the result is not valid ONNX (a knopt bug).
        KnoptError: If the file cannot be written.
    """
    check_opset(opset)
    spans: dict[int, tuple[int, int]] = {}
    model = _model(graph, opset, spans)
    nodes = list(model.graph.node)
    owner: dict[int, int] = {}
    for node in graph.nodes:
        key = groups.get(id(node))
        if key is not None:
            start, end = spans[id(node)]
            owner.update(dict.fromkeys(range(start, end), key))
    for i, node in enumerate(nodes):
        # Constants and size arithmetic are shared by several kernels: they stay outside.
        if node.op_type == "Constant" or node.name.startswith("size_"):
            owner.pop(i, None)
    members: dict[int, list[int]] = {}
    for i, key in sorted(owner.items()):
        members.setdefault(key, []).append(i)
    last = {indices[-1]: key for key, indices in members.items()}
    used_after: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for name in node.input:
            used_after[name] = i
    outputs = {o.name for o in model.graph.output}
    new_nodes: list[onnx.NodeProto] = []
    functions: list[onnx.FunctionProto] = []
    for i, node in enumerate(nodes):
        if i not in owner:
            new_nodes.append(node)
        elif i in last:
            key = last[i]
            body = [nodes[j] for j in members[key]]
            function, call = _function(
                body, f"{kinds[key]}_{len(functions)}", opset, used_after, outputs, members[key]
            )
            functions.append(function)
            new_nodes.append(call)
    del model.graph.node[:]
    model.graph.node.extend(new_nodes)
    model.functions.extend(functions)
    model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as err:
        raise CodegenError(f"kernel program of '{graph.name}' is not valid ONNX: {err}") from err
    if path is not None:
        try:
            onnx.save_model(model, os.fspath(path))
        except OSError as err:
            raise KnoptError(f"{path}: cannot write the model ({err.strerror})") from err
    return model


def _function(
    body: list[onnx.NodeProto],
    name: str,
    opset: int,
    used_after: Mapping[str, int],
    graph_outputs: set[str],
    indices: list[int],
) -> tuple[onnx.FunctionProto, onnx.NodeProto]:
    produced = [o for node in body for o in node.output]
    inputs: list[str] = []
    for node in body:
        for value in node.input:
            if value and value not in produced and value not in inputs:
                inputs.append(value)
    last = indices[-1]
    results = [o for o in produced if used_after.get(o, -1) > last or o in graph_outputs]
    function = helper.make_function(
        DOMAIN, name, inputs, results, body, opset_imports=[helper.make_opsetid("", opset)]
    )
    call = helper.make_node(name, inputs, results, name=name, domain=DOMAIN)
    return function, call
