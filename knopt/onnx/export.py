"""Saving IR graphs as standard ONNX models that onnxruntime runs with the same results.

Every IR node becomes one or a few standard ONNX nodes named after it (`knopt.onnx.export_ops`).
Symbolic sizes stay symbolic: input and output axes carry them as `dim_param`s, and the ops that
hold them as attributes compute them from the inputs' shapes at run time.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import onnx
from onnx import helper

from knopt.errors import CodegenError, KnoptError, UnsupportedModelError
from knopt.ir.dtype import DType
from knopt.ir.graph import Graph, Value
from knopt.ir.shape import Sym
from knopt.onnx.emitter import Emitter
from knopt.onnx.export_ops import EXPORTERS

DEFAULT_OPSET = 18
MIN_OPSET = 18  # Reduce* take their axes as inputs, and ScatterElements has max/min, from 18
_NARROW_FLOATS = frozenset({DType.BF16, DType.F16})


def save_onnx(
    graph: Graph, path: str | os.PathLike[str] | None = None, *, opset: int = DEFAULT_OPSET
) -> onnx.ModelProto:
    """Convert `graph` into a standard ONNX model, and write it to `path` if one is given.

    Args:
        graph: The graph to export; symbolic sizes must each be the size of some input axis.
        path: Where to write the model, or None to only return it.
        opset: The version of the default ONNX domain to write (18 or newer).

    Returns:
        The model, already checked by `onnx.checker`.

    Raises:
        UnsupportedModelError: If the opset is too old or too new, or the graph needs
            something the opset lacks.
        CodegenError: If the model fails ONNX's checker (a knopt bug).
        KnoptError: If the file cannot be written.
    """
    check_opset(opset)
    model = _model(graph, opset)
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as err:
        raise CodegenError(f"exported graph '{graph.name}' is not valid ONNX: {err}") from err
    if path is not None:
        try:
            onnx.save_model(model, os.fspath(path))
        except OSError as err:
            raise KnoptError(f"{path}: cannot write the model ({err.strerror})") from err
    return model


def check_opset(opset: int) -> None:
    """Refuse an opset that knopt cannot export at.

    Raises:
        UnsupportedModelError: If the opset is older than 18 or newer than onnx knows.
    """
    newest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= newest:
        raise UnsupportedModelError(
            f"cannot export at opset {opset}; choose one from {MIN_OPSET} to {newest}"
        )


def _model(
    graph: Graph, opset: int, spans: dict[int, tuple[int, int]] | None = None
) -> onnx.ModelProto:
    """The ONNX model of a graph; `spans` receives, per IR node id, the range of its nodes."""
    from knopt import __version__

    emitter = Emitter(graph, opset=opset)
    names: dict[int, str] = {}
    types = {name: int(v.dtype) for name, v in zip(graph.input_names, graph.inputs, strict=True)}
    for node in graph.nodes:
        exporter = EXPORTERS.get(type(node.op))
        if exporter is None:
            raise UnsupportedModelError(f"{node.describe()}: op cannot be exported to ONNX")
        emitter.begin(node)
        start = len(emitter.nodes)
        names[id(node.output)] = exporter(
            emitter, node.op, node, [names[id(v)] for v in node.inputs]
        )
        if any(v.dtype in _NARROW_FLOATS for v in (*node.inputs, node.output)):
            emitter.carry_narrow_floats(start, types)
        types[names[id(node.output)]] = int(node.output.dtype)
        if spans is not None:
            spans[id(node)] = (start, len(emitter.nodes))
    _name_outputs(emitter, graph, names)
    proto = helper.make_graph(
        emitter.nodes,
        graph.name or "knopt",
        [_value_info(name, v) for name, v in zip(graph.input_names, graph.inputs, strict=True)],
        [_value_info(name, v) for name, v in zip(graph.output_names, graph.outputs, strict=True)],
        initializer=emitter.initializers,
    )
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(
        proto,
        opset_imports=opsets,
        producer_name="knopt",
        producer_version=__version__,
        ir_version=helper.find_min_ir_version_for(opsets),
    )
    return model


def _name_outputs(emitter: Emitter, graph: Graph, names: Mapping[int, str]) -> None:
    """Give the graph outputs their names: rename the producing node's output, or copy it."""
    produced = {name: node for node in emitter.nodes for name in node.output}
    renamed: dict[str, str] = {}
    for out_name, value in zip(graph.output_names, graph.outputs, strict=True):
        source = renamed.get(names[id(value)], names[id(value)])
        if source == out_name:
            continue
        if source in produced and source not in renamed.values():
            renamed[source] = out_name
        else:
            emitter.op("Identity", [source])
            emitter.nodes[-1].output[0] = out_name
    for node in emitter.nodes:
        for field in (node.input, node.output):
            for i, name in enumerate(field):
                field[i] = renamed.get(name, name)


def _value_info(name: str, value: Value) -> onnx.ValueInfoProto:
    shape = [str(d) if isinstance(d, Sym) else int(d) for d in value.shape]
    return helper.make_tensor_value_info(name, int(value.dtype), shape)
