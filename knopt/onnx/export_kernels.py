"""A kernel program as ONNX, each fused kernel a model-local function of the `knopt` domain.

An inspection format: Netron shows each kernel as one node that opens onto its body. The
bodies are standard ops, one IR node after the other (`knopt.onnx.export_ops`), so
onnxruntime runs the model too, but `knopt.onnx.export` writes faster files.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import onnx
from onnx import helper

from knopt.errors import UnsupportedModelError
from knopt.ir.graph import Graph, Node, Value
from knopt.onnx.emitter import Emitter
from knopt.onnx.export import (
    DEFAULT_OPSET,
    NARROW_FLOATS,
    assemble,
    check,
    check_opset,
    name_outputs,
    write_file,
)
from knopt.onnx.export_ops import EXPORTERS

DOMAIN = "knopt"


def save_kernels(
    graph: Graph,
    groups: Mapping[Node, int],
    kinds: Mapping[int, str],
    path: str | os.PathLike[str] | None = None,
    *,
    opset: int = DEFAULT_OPSET,
) -> onnx.ModelProto:
    """Export `graph` with the nodes of each group wrapped in a function.

    Args:
        graph: The optimized graph (fused kernels written out as their ops).
        groups: IR node to kernel key, for the nodes of fused kernels.
        kinds: Kernel key to the kernel's kind ("elementwise", "layer_norm", ...), which names
            the function.
        path: Where to write the model, or None to only return it.
        opset: The version of the default ONNX domain.

    Raises:
        UnsupportedModelError: If the opset is unknown or the graph needs something it lacks.
        CodegenError: If the result is not valid ONNX (a knopt bug).
        KnoptError: If the file cannot be written.
    """
    check_opset(opset)
    spans: dict[Node, tuple[int, int]] = {}
    model = _per_node_model(graph, opset, spans)
    nodes = list(model.graph.node)
    owner: dict[int, int] = {}
    for node in graph.nodes:
        key = groups.get(node)
        if key is not None:
            start, end = spans[node]
            owner.update(dict.fromkeys(range(start, end), key))
    for i, node in enumerate(nodes):
        # Size arithmetic is shared by several kernels: it stays outside.
        if node.name.startswith("size_"):
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
    check(model, f"kernel program of {graph.name}")
    if path is not None:
        write_file(model, path)
    return model


def _per_node_model(
    graph: Graph, opset: int, spans: dict[Node, tuple[int, int]]
) -> onnx.ModelProto:
    """The model with each IR node written on its own.

    `spans` receives, per IR node, the range of its ONNX nodes.
    """
    emitter = Emitter(graph, opset=opset)
    names: dict[Value, str] = {}
    types = {name: int(v.dtype) for name, v in zip(graph.input_names, graph.inputs, strict=True)}
    for node in graph.nodes:
        exporter = EXPORTERS.get(type(node.op))
        if exporter is None:
            raise UnsupportedModelError(f"{node.describe()}: op cannot be exported to ONNX")
        emitter.begin(node)
        start = len(emitter.nodes)
        names[node.output] = exporter(emitter, node.op, node, [names[v] for v in node.inputs])
        if any(v.dtype in NARROW_FLOATS for v in (*node.inputs, node.output)):
            emitter.carry_narrow_floats(start, types)
        types[names[node.output]] = int(node.output.dtype)
        spans[node] = (start, len(emitter.nodes))
    name_outputs(emitter, graph, [names[v] for v in graph.outputs])
    return assemble(emitter, graph, opset)


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
