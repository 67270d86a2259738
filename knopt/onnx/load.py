"""Reading ONNX files and turning their graphs into IR graphs.

`load_model` reads and checks a file (or bytes) without writing anything; `import_model` walks
the graph in order and hands each node to the importer registered for its op type.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from knopt.errors import (
    InputError,
    InvalidGraphError,
    InvalidModelError,
    SymbolicSizeError,
    UnsupportedModelError,
)
from knopt.ir.builder import GraphBuilder
from knopt.ir.dtype import DType
from knopt.ir.graph import Graph, Value
from knopt.ir.memory import check_shape
from knopt.ir.shape import Dim, sym
from knopt.ir.validate import validate
from knopt.onnx import ops as _ops  # noqa: F401  (registers the importers)
from knopt.onnx.context import (
    ImportContext,
    Known,
    KnownValueRequired,
    SizeComputationRequired,
    WholeModel,
)
from knopt.onnx.data import prepare_data
from knopt.onnx.function import check_functions
from knopt.onnx.nodes import import_nodes, initializer_value

MIN_OPSET = 7


def load_model(source: str | os.PathLike[str] | bytes) -> onnx.ModelProto:
    """Read an ONNX model from a path or bytes, with its external data.

    External data (of any tensor anywhere in the model) must lie inside the model's own
    folder; a model given as bytes may have none.

    Raises:
        InvalidModelError: If the file is missing, truncated, not ONNX, has text that is not
            UTF-8, its external data is missing or points outside the model's folder, or a
            model-local function calls itself.
        MemoryLimitError: If external data is larger than the memory budget.
    """
    if isinstance(source, bytes):
        return _parse(source, "the given bytes", None)
    path = Path(source)
    if not path.is_file():
        raise InvalidModelError(f"{path}: no such file")
    return _parse(path.read_bytes(), str(path), path.parent)


def _parse(data: bytes, where: str, folder: Path | None) -> onnx.ModelProto:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as err:
        raise InvalidModelError(f"{where}: not a readable ONNX model ({err})") from err
    if not model.HasField("graph") or not model.opset_import:
        raise InvalidModelError(
            f"{where}: not an ONNX model (no graph or no opset); is the file truncated?"
        )
    prepare_data(model, where, folder)
    check_functions(model)
    return model


def default_opset(model: onnx.ModelProto) -> int:
    """The model's version of the default ONNX domain.

    A model that uses only other domains reads as opset 7, the oldest knopt supports.

    Raises:
        UnsupportedModelError: If it is older than opset 7, or missing while nodes use it.
    """
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            if entry.version < MIN_OPSET:
                raise UnsupportedModelError(
                    f"model uses ONNX opset {entry.version}; knopt reads opset {MIN_OPSET} "
                    "and newer (convert it with onnx.version_converter)"
                )
            return int(entry.version)
    if any(node.domain in ("", "ai.onnx") for node in model.graph.node):
        raise UnsupportedModelError("model imports no version of the default ONNX domain")
    return MIN_OPSET  # the model only uses other domains (such as ai.onnx.ml)


def import_model(
    model: onnx.ModelProto,
    dims: Mapping[str, int] | None = None,
    known_inputs: Mapping[str, np.ndarray] | None = None,
    *,
    strict: bool = False,
) -> Graph:
    """Convert an ONNX model into a validated IR graph.

    A node of an op knopt has no importer for is kept as it is, an opaque op (see
    `knopt.onnx.opaque`), unless `strict` is set.

    Input sizes that the exporter named apart (one name per input and axis, as TorchScript's
    list-form `dynamic_axes` and dynamo's `Dim.AUTO` write them) but that the model needs
    equal (it broadcasts them together, or views a mask as `[batch, -1]`) are taken to be one
    size: each input keeps the name of the first input that has it, and a run whose inputs
    disagree is refused (`InputError`).

    Args:
        model: The model, as returned by `load_model`.
        dims: Values for symbolic input dimensions, by name; the rest stay symbolic.
        known_inputs: Values for graph inputs, by name, which become constants of the graph
            (and leave its inputs), so that shapes or axes computed from them are known.
        strict: Refuse ops knopt has no importer for instead of keeping them.

    Raises:
        InvalidModelError: If a model-local function calls itself.
        UnsupportedModelError: If the model uses an op (with `strict`, or one that cannot be
            kept as it is), attribute or type knopt lacks.
        SymbolicSizeError: If a step needs a size fixed (pass it in `dims`).
        InvalidGraphError: If the graph is malformed (a cycle, a dangling input, bad shapes).
    """
    check_functions(model)  # also for models built in memory, not read by load_model
    axes = input_symbols(model)
    order = {name: i for i, name in enumerate(axes)}
    same: dict[str, Dim] = {}
    whole = WholeModel(model)  # what is learned of the whole model, kept across the retries
    while True:
        try:
            return _import_model(model, {**same, **(dims or {})}, known_inputs, strict, whole)
        except KnownValueRequired as err:
            if isinstance(err, SizeComputationRequired) or not is_computed_from_sizes(
                model, err.value_name
            ):
                raise
            raise SizeComputationRequired(
                f"{err}; it is computed from symbolic input sizes: fix them when loading "
                "(dims=..., or --dims NAME=SIZE)",
                err.value_name,
            ) from err
        except SymbolicSizeError as err:
            pairs = [p for p in err.same if p[0] != p[1] and all(n in order for n in p)]
            if len(pairs) > 1:  # a division: the size on the same axis of its input
                pairs = [p for p in pairs if axes[p[0]] == axes[p[1]]]
            if len(pairs) != 1:
                raise
            keep, rename = sorted(pairs[0], key=order.__getitem__)
            same = {k: sym(keep) if v == sym(rename) else v for k, v in same.items()}
            same[rename] = sym(keep)


def input_symbols(model: onnx.ModelProto) -> dict[str, int]:
    """The names of the symbolic input sizes, in order of first appearance, with their axes."""
    names: dict[str, int] = {}
    for info in model.graph.input:
        if info.type.HasField("tensor_type") and info.type.tensor_type.HasField("shape"):
            for axis, dim in enumerate(info.type.tensor_type.shape.dim):
                if not dim.HasField("dim_value"):
                    names.setdefault(_dim_name(info, axis), axis)
    return names


def _import_model(
    model: onnx.ModelProto,
    dims: Mapping[str, Dim],
    known_inputs: Mapping[str, np.ndarray] | None,
    strict: bool,
    whole: WholeModel,
) -> Graph:
    graph = model.graph
    builder = GraphBuilder(graph.name)
    ctx = ImportContext(builder, default_opset(model), whole=whole, dims=dims, strict=strict)
    ctx.functions = {(f.domain, f.name): f for f in model.functions}
    ctx.domain_opsets = {entry.domain: int(entry.version) for entry in model.opset_import}
    for tensor in graph.initializer:
        if tensor.name in ctx.env:
            raise InvalidGraphError(f"initializer '{tensor.name}' is defined twice")
        ctx.env[tensor.name] = initializer_value(tensor)
    initializer_names = {t.name for t in graph.initializer}
    known_inputs = known_inputs or {}
    for info in graph.input:
        if info.name in known_inputs:
            ctx.env[info.name] = _known_input(info, known_inputs[info.name])
        elif info.name not in initializer_names:
            ctx.env[info.name] = _graph_input(builder, info, dims)
    import_nodes(ctx, graph.node)
    for info in graph.output:
        if info.name not in ctx.env:
            raise InvalidGraphError(
                f"graph output '{info.name}' is not computed by any node, nor a graph input or "
                "initializer; fix its name or remove it from the outputs"
            )
        builder.output(ctx.value(info.name), info.name)
    result = builder.build()
    validate(result)
    return result


def _known_input(info: onnx.ValueInfoProto, array: np.ndarray) -> Known:
    where = f"graph input '{info.name}'"
    if not info.type.HasField("tensor_type"):
        raise UnsupportedModelError(f"{where}: only tensor inputs are supported")
    dtype = DType.from_onnx(info.type.tensor_type.elem_type, where)
    return Known(np.asarray(array, dtype.numpy), dtype)


def _graph_input(
    builder: GraphBuilder, info: onnx.ValueInfoProto, dims: Mapping[str, Dim]
) -> Value:
    where = f"graph input '{info.name}'"
    if not info.type.HasField("tensor_type"):
        raise UnsupportedModelError(f"{where}: only tensor inputs are supported")
    tensor_type = info.type.tensor_type
    dtype = DType.from_onnx(tensor_type.elem_type, where)
    if not tensor_type.HasField("shape"):
        raise UnsupportedModelError(f"{where}: has no declared shape (rank unknown)")
    shape: list[Dim] = []
    for axis, dim in enumerate(tensor_type.shape.dim):
        if dim.HasField("dim_value"):
            if dim.dim_value < 0:
                raise InvalidGraphError(f"{where}: dimension {axis} is negative")
            shape.append(int(dim.dim_value))
        else:
            name = _dim_name(info, axis)
            shape.append(dims[name] if name in dims else sym(name))
    # Symbolic sizes are at least 1: the static dims alone must fit.
    check_shape([d if isinstance(d, int) else 1 for d in shape], dtype.numpy.itemsize, where)
    return builder.input(info.name, tuple(shape), dtype)


def _dim_name(info: onnx.ValueInfoProto, axis: int) -> str:
    """The symbol of a graph input axis without a fixed size (unnamed ones get a name)."""
    return info.type.tensor_type.shape.dim[axis].dim_param or f"{info.name}_dim{axis}"


def input_sizes(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
    """The value of every symbolic input size of `model`, read off actual input shapes.

    Raises:
        InputError: If an input is missing or has the wrong rank, or two inputs disagree on
            the value of one size.
    """
    initializers = {t.name for t in model.graph.initializer}
    sizes: dict[str, int] = {}
    for info in model.graph.input:
        if info.name in initializers or not info.type.tensor_type.HasField("shape"):
            continue
        dims = info.type.tensor_type.shape.dim
        if info.name not in shapes or len(shapes[info.name]) != len(dims):
            got = list(shapes[info.name]) if info.name in shapes else "nothing"
            raise InputError(f"input '{info.name}': got {got}, expected rank {len(dims)}")
        for axis, dim in enumerate(dims):
            if dim.HasField("dim_value"):
                continue
            name, size = _dim_name(info, axis), int(shapes[info.name][axis])
            if sizes.setdefault(name, size) != size:
                raise InputError(
                    f"input '{info.name}': size '{name}' is {size} here but {sizes[name]} "
                    "in another input"
                )
    return sizes


def is_computed_from_sizes(model: onnx.ModelProto, name: str) -> bool:
    """Whether the value `name` reads the graph inputs only through their shapes.

    Such a value (a Reshape target from `min(seq, 64)`, say) is known once the input sizes
    are fixed, even where symbolic shape arithmetic cannot follow it.
    """
    producers = {out: node for node in model.graph.node for out in node.output if out}
    initializers = {t.name for t in model.graph.initializer}
    inputs = {i.name for i in model.graph.input} - initializers
    if name not in producers and name not in inputs:
        return False  # local to a function or a subgraph: assume the worst
    seen: set[str] = set()
    stack = [name]
    while stack:
        current = stack.pop()
        if current in seen or not current:
            continue
        seen.add(current)
        if current in inputs:
            return False
        node = producers.get(current)
        if node is None or node.op_type in ("Shape", "Size"):
            continue
        if any(a.HasField("g") or a.graphs for a in node.attribute):
            return False  # a subgraph may read anything of the enclosing graph
        stack.extend(node.input)
    return True
