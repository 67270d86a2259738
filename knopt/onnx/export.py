"""Saving optimized IR graphs as the ONNX a careful engineer would write by hand.

Every recognised pattern becomes the fused op of the target opset where one exists
(`knopt.onnx.export_fused`; for onnxruntime also its com.microsoft ops, `export_ort`), every
other op its shortest standard spelling (`export_layout`): broadcasting stays implicit and
sizes stay symbolic. Graph inputs and outputs keep their names and their dynamic axes, which
become `dim_param`s; ONNX nodes are named after the nodes they come from.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import onnx
from onnx import helper

from knopt.errors import CodegenError, KnoptError, UnsupportedModelError
from knopt.ir.dtype import DType
from knopt.ir.graph import Graph
from knopt.ir.op import TensorType
from knopt.ir.shape import Sym
from knopt.onnx.emitter import Emitter
from knopt.onnx.export_attention import ATTENTION_PATTERNS
from knopt.onnx.export_fused import STANDARD, Patterns
from knopt.onnx.export_integer import INTEGER_PATTERNS
from knopt.onnx.export_layout import HANDLERS
from knopt.onnx.export_ort import ORT_PATTERNS
from knopt.onnx.export_qdq import qdq_groups
from knopt.onnx.export_quantize import QUANTIZE_PATTERNS
from knopt.onnx.export_tidy import without_unused
from knopt.onnx.writer import Target, Writer
from knopt.version import __version__

DEFAULT_OPSET = 18
MIN_OPSET = 18  # Reduce* take their axes as inputs, and ScatterElements has max/min, from 18
NARROW_FLOATS = frozenset({DType.BF16, DType.F16})


def save_onnx(
    graph: Graph,
    path: str | os.PathLike[str] | None = None,
    *,
    opset: int = DEFAULT_OPSET,
    target: Target | str = Target.ONNX,
) -> onnx.ModelProto:
    """Convert `graph` into an ONNX model, and write it to `path` if one is given.

    Args:
        graph: The graph to export; symbolic sizes must each be the size of some input axis.
        path: Where to write the model, or None to only return it.
        opset: The version of the default ONNX domain to write (18 or newer).
        target: "onnx" for standard ops only, "onnxruntime" to also use onnxruntime's
            com.microsoft fused ops.

    Returns:
        The model, already checked by `onnx.checker` (full check).

    Raises:
        UnsupportedModelError: If the opset or target is unknown, or the graph needs
            something the opset lacks.
        CodegenError: If the model fails ONNX's checker (a knopt bug).
        KnoptError: If the file cannot be written.
    """
    check_opset(opset)
    model = write_model(graph, opset, parse_target(target))
    check(model, graph.name)
    if path is not None:
        write_file(model, path)
    return model


def parse_target(target: Target | str) -> Target:
    """The target called `target`.

    Raises:
        UnsupportedModelError: If there is no such target.
    """
    if isinstance(target, Target):
        return target
    try:
        return Target(target)
    except ValueError:
        names = ", ".join(t.value for t in Target)
        raise UnsupportedModelError(f"unknown export target '{target}'; choose {names}") from None


def check_opset(opset: int) -> None:
    """Raise UnsupportedModelError unless knopt can write `opset`."""
    newest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= newest:
        raise UnsupportedModelError(
            f"cannot export at opset {opset}; choose one from {MIN_OPSET} to {newest}"
        )


def check(model: onnx.ModelProto, what: str) -> None:
    """Raise CodegenError unless `model` passes onnx's full check."""
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as err:
        raise CodegenError(f"exported graph '{what}' is not valid ONNX: {err}") from err


def write_file(model: onnx.ModelProto, path: str | os.PathLike[str]) -> None:
    """Save `model` at `path`.

    Raises:
        KnoptError: If the file cannot be written.
    """
    try:
        onnx.save_model(model, os.fspath(path))
    except OSError as err:
        raise KnoptError(f"{path}: cannot write the model ({err.strerror})") from err


def write_model(graph: Graph, opset: int, target: Target) -> onnx.ModelProto:
    """The ONNX model of `graph` (not checked)."""
    w = Writer(graph, opset=opset, target=target)
    patterns = patterns_for(target)
    for node in graph.nodes:
        if w.has(node.output):
            continue
        w.em.begin(node)
        rep = None
        for pattern in patterns.get(type(node.op), ()):
            if (rep := pattern(w, node)) is not None:
                break
        w.set(node.output, rep if rep is not None else HANDLERS[type(node.op)](w, node))
    em = w.em
    names = [w.exact(v) for v in graph.outputs]
    if any(v.dtype in NARROW_FLOATS for v in graph.values()):
        carry_floats(em, graph)
    name_outputs(em, graph, names)
    em.nodes, em.initializers = without_unused(em.nodes, em.initializers, graph.output_names)
    nodes, initializers = qdq_groups(em.nodes, em.initializers, graph.output_names)
    em.nodes, em.initializers = without_unused(nodes, initializers, graph.output_names)
    return assemble(em, graph, opset)


def patterns_for(target: Target) -> Patterns:
    """The patterns to try, by the op class of the node they end at, most specific first."""
    tables = [ORT_PATTERNS] if target is Target.ONNXRUNTIME else []
    patterns: Patterns = {}
    for table in [*tables, QUANTIZE_PATTERNS, STANDARD, ATTENTION_PATTERNS, INTEGER_PATTERNS]:
        for op_class, found in table.items():
            patterns.setdefault(op_class, []).extend(found)
    return patterns


def carry_floats(em: Emitter, graph: Graph) -> None:
    """Compute in float32 the nodes whose op lacks the graph's 16-bit float types."""
    types = {name: int(v.dtype) for name, v in zip(graph.input_names, graph.inputs, strict=True)}
    em.carry_narrow_floats(0, types)


def assemble(em: Emitter, graph: Graph, opset: int) -> onnx.ModelProto:
    """The model of the emitted nodes, with the graph's inputs and outputs."""
    produced = {name for node in em.nodes for name in node.output}
    ends = set(graph.input_names) | set(graph.output_names)
    proto = helper.make_graph(
        em.nodes,
        graph.name or "knopt",
        [value_info(name, v.type) for name, v in zip(graph.input_names, graph.inputs, strict=True)],
        [
            value_info(name, v.type)
            for name, v in zip(graph.output_names, graph.outputs, strict=True)
        ],
        initializer=em.initializers,
        value_info=[
            value_info(name, t)
            for name, t in em.declared.items()
            if name in produced and name not in ends
        ],
    )
    opsets = [helper.make_opsetid("", opset)]
    domains = {node.domain for node in em.nodes if node.domain}
    opsets += [
        helper.make_opsetid(domain, em.domain_versions.get(domain, 1)) for domain in sorted(domains)
    ]
    return helper.make_model(
        proto,
        opset_imports=opsets,
        producer_name="knopt",
        producer_version=__version__,
        ir_version=helper.find_min_ir_version_for(opsets[:1]),
    )


def name_outputs(em: Emitter, graph: Graph, names: Sequence[str]) -> None:
    """Give the graph outputs their names: rename the producing node's output, or copy it."""
    produced = {name: node for node in em.nodes for name in node.output}
    renamed: dict[str, str] = {}
    for out_name, source in zip(graph.output_names, names, strict=True):
        source = renamed.get(source, source)
        if source == out_name:
            continue
        if source in produced and source not in renamed.values():
            renamed[source] = out_name
        else:
            em.op("Identity", [source])
            em.nodes[-1].output[0] = out_name
    for node in em.nodes:
        for field in (node.input, node.output):
            for i, name in enumerate(field):
                field[i] = renamed.get(name, name)
    em.declared = {renamed.get(name, name): t for name, t in em.declared.items()}


def value_info(name: str, tensor_type: TensorType) -> onnx.ValueInfoProto:
    """The typed, shaped declaration of a value (symbolic sizes as `dim_param`s)."""
    shape = [str(d) if isinstance(d, Sym) else int(d) for d in tensor_type.shape]
    return helper.make_tensor_value_info(name, int(tensor_type.dtype), shape)
