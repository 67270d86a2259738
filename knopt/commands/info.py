"""`knopt info`: what a model takes and gives, which ops it uses, and what knopt lacks for it."""

from __future__ import annotations

import argparse
from collections import Counter

import onnx

from knopt.commands.common import parse_dims
from knopt.errors import KnoptError
from knopt.onnx.load import default_opset, import_model, input_symbols, load_model
from knopt.onnx.support import UnsupportedNode, find_unsupported


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the `info` subcommand."""
    parser = subparsers.add_parser(
        "info",
        help="describe a model: inputs, outputs, op counts and unsupported ops",
        description="Describe an ONNX model, with the nodes of ops knopt lacks (kept as they "
        "are). Exits with status 1 if knopt cannot import it.",
    )
    parser.add_argument("model", help="the .onnx file")
    parser.add_argument(
        "--dims",
        action="append",
        default=[],
        metavar="NAME=SIZE",
        help="fix a symbolic input size when loading, such as batch=2 (repeatable)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Print the description; 1 if the import fails, else 0 (ops knopt lacks are kept)."""
    model = load_model(args.model)
    dims = parse_dims(args.dims, input_symbols(model))
    opset = default_opset(model)
    print(f"model: {args.model} (opset {opset}, producer {_producer(model)})")
    print("inputs:")
    initializers = {t.name for t in model.graph.initializer}
    for info in model.graph.input:
        if info.name not in initializers:
            print(f"  {info.name}: {_type_text(info)}")
    print("outputs:")
    for info in model.graph.output:
        print(f"  {info.name}: {_type_text(info)}")
    print(f"ONNX ops ({len(model.graph.node)} nodes):")
    _print_histogram(Counter(_op_name(node) for node in model.graph.node))
    unsupported = find_unsupported(model, opset)
    try:
        graph = import_model(model, dims)
    except KnoptError as err:
        _print_nodes("unsupported ops", unsupported)
        print(f"cannot import: {err}")
        return 1
    _print_nodes(
        "ops knopt lacks, kept as they are (optimized around; `knopt optimize --strict` refuses "
        "them)",
        unsupported,
    )
    print(f"IR ops ({len(graph.nodes)} nodes):")
    _print_histogram(graph.op_histogram())
    return 0


def _print_nodes(heading: str, entries: list[UnsupportedNode]) -> None:
    """The nodes of ops knopt has no importer for, by op."""
    if not entries:
        return
    print(f"{heading} ({len(entries)} nodes):")
    by_op: dict[str, list[str]] = {}
    for entry in entries:
        by_op.setdefault(entry.op_type, []).append(entry.node)
    for op_type, nodes in sorted(by_op.items()):
        print(f"  {op_type}: {', '.join(repr(n) for n in nodes)}")


def _producer(model: onnx.ModelProto) -> str:
    text = f"{model.producer_name} {model.producer_version}".strip()
    return text or "unknown"


def _op_name(node: onnx.NodeProto) -> str:
    domain = "" if node.domain == "ai.onnx" else node.domain
    return f"{domain}.{node.op_type}" if domain else node.op_type


def _type_text(info: onnx.ValueInfoProto) -> str:
    if not info.type.HasField("tensor_type"):
        return "not a tensor"
    tensor = info.type.tensor_type
    dtype = _dtype_name(tensor.elem_type)
    if not tensor.HasField("shape"):
        return f"{dtype} (shape unknown)"
    dims = [
        str(d.dim_value) if d.HasField("dim_value") else d.dim_param or "?"
        for d in tensor.shape.dim
    ]
    return f"{dtype} [{', '.join(dims)}]"


def _dtype_name(code: int) -> str:
    try:
        return str(onnx.TensorProto.DataType.Name(code)).lower()
    except ValueError:
        return f"type {code}"


def _print_histogram(counts: dict[str, int]) -> None:
    for name, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {count:6d}  {name}")
