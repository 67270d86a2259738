"""Mutants of ONNX models, for fuzzing what knopt does with files that nobody checked.

A mutant is a model with one to three random changes: bytes flipped, inserted, cut or
repeated, or a protobuf field changed in place (a dim, an attribute, a data type, an
initializer's shape or data, an integer a shape is computed from, the order of the nodes, a
name, an op type, the opset). `make_mutant(models, seed, index)` gives the same mutant for the
same arguments, so that a failure found in a long run reproduces from its two numbers.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import onnx
from google.protobuf.message import DecodeError

# Values that break careless arithmetic: zero, one, negatives, and the 32- and 64-bit limits.
EXTREMES = (0, 1, -1, 2, 3, -2, 7, 255, 2**31 - 1, 2**31, 2**32, 2**40, 2**62, 2**63 - 1, -(2**63))
FLOATS = (0.0, -0.0, 1.0, -1.0, 1e-45, 1e38, -1e38, float("inf"), float("-inf"), float("nan"))
STRINGS = ("", "x", "nearest", "constant", "NOTSET", "\u00e9", "a" * 300)


@dataclass(frozen=True)
class Mutant:
    """One mutated model.

    Attributes:
        source: The name of the model it was made from.
        seed, index: The numbers that make it again (`make_mutant`).
        changes: What was changed, in order, for reports.
        data: The mutated file's bytes.
    """

    source: str
    seed: int
    index: int
    changes: tuple[str, ...]
    data: bytes


def make_mutant(models: Sequence[tuple[str, bytes]], seed: int, index: int) -> Mutant:
    """Mutant `index` of run `seed`: a model drawn from `models` with one to three changes.

    Args:
        models: (name, serialized model) pairs to mutate.
        seed: The run's seed.
        index: Which mutant of the run.
    """
    rng = random.Random(f"{seed}:{index}")
    source, data = models[rng.randrange(len(models))]
    changes: list[str] = []
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        if rng.random() < 0.25:
            data, change = _mutate_bytes(rng, data)
        else:
            data, change = _mutate_fields(rng, data)
        changes.append(change)
    return Mutant(source, seed, index, tuple(changes), data)


# ---- bytes --------------------------------------------------------------------------------


def _mutate_bytes(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    if not data:
        return bytes([rng.randrange(256)]), "bytes: one byte"
    at = rng.randrange(len(data))
    kind = rng.choice(("flip", "set", "insert", "delete", "truncate", "repeat"))
    if kind == "flip":
        changed = data[:at] + bytes([data[at] ^ (1 << rng.randrange(8))]) + data[at + 1 :]
    elif kind == "set":
        changed = data[:at] + bytes([rng.choice((0, 1, 0x7F, 0x80, 0xFF))]) + data[at + 1 :]
    elif kind == "insert":
        changed = data[:at] + rng.randbytes(rng.randrange(1, 9)) + data[at:]
    elif kind == "delete":
        changed = data[:at] + data[at + rng.randrange(1, 17) :]
    elif kind == "truncate":
        changed = data[:at]
    else:
        length = rng.randrange(1, 65)
        changed = data[:at] + data[at : at + length] * 2 + data[at + length :]
    return changed, f"bytes: {kind} at {at}"


# ---- fields -------------------------------------------------------------------------------

Mutation = Callable[[random.Random, onnx.ModelProto], str | None]


def _mutate_fields(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except DecodeError:  # an earlier byte change broke the file: change its bytes again
        return _mutate_bytes(rng, data)
    for _ in range(8):  # a mutation may find nothing to change in this model
        mutation = rng.choice(FIELD_MUTATIONS)
        change = mutation(rng, model)
        if change is not None:
            return model.SerializeToString(), change
    return _mutate_bytes(rng, data)


def _graphs(model: onnx.ModelProto) -> Iterator[onnx.GraphProto]:
    """The main graph and every subgraph of it and of the model's functions."""
    stack: list[onnx.NodeProto] = [n for f in model.functions for n in f.node]
    yield model.graph
    stack.extend(model.graph.node)
    while stack:
        node = stack.pop()
        for attr in node.attribute:
            for graph in [attr.g] if attr.HasField("g") else list(attr.graphs):
                yield graph
                stack.extend(graph.node)


def _nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    nodes = [n for g in _graphs(model) for n in g.node]
    return nodes + [n for f in model.functions for n in f.node]


def _pick(rng: random.Random, items: Sequence[object]) -> object | None:
    return rng.choice(items) if items else None


def _integer(rng: random.Random, old: int) -> int:
    return rng.choice((*EXTREMES, old + 1, old - 1, old * 2, -old, rng.randrange(-9, 65)))


def _dim(rng: random.Random, model: onnx.ModelProto) -> str | None:
    dims = [
        d
        for g in _graphs(model)
        for v in (*g.input, *g.output, *g.value_info)
        if v.type.HasField("tensor_type")
        for d in v.type.tensor_type.shape.dim
    ]
    dim = _pick(rng, dims)
    if not isinstance(dim, onnx.TensorShapeProto.Dimension):
        return None
    if rng.random() < 0.25:
        dim.dim_param = rng.choice(("n", "batch", "other", ""))
        return f"dim: symbol '{dim.dim_param}'"
    dim.dim_value = _integer(rng, dim.dim_value)
    return f"dim: {dim.dim_value}"


def _initializer_shape(rng: random.Random, model: onnx.ModelProto) -> str | None:
    tensor = _pick(rng, [t for g in _graphs(model) for t in g.initializer])
    if not isinstance(tensor, onnx.TensorProto):
        return None
    dims = list(tensor.dims)
    if dims and rng.random() < 0.5:
        at = rng.randrange(len(dims))
        dims[at] = _integer(rng, dims[at])
    elif rng.random() < 0.5:
        dims.insert(rng.randrange(len(dims) + 1), rng.choice((1, 2, 0)))
    else:
        dims = dims[:-1]
    del tensor.dims[:]
    tensor.dims.extend(dims)
    return f"initializer '{tensor.name}': dims {dims}"


def _initializer_data(rng: random.Random, model: onnx.ModelProto) -> str | None:
    tensor = _pick(rng, [t for g in _graphs(model) for t in g.initializer if t.raw_data])
    if not isinstance(tensor, onnx.TensorProto):
        return None
    raw = tensor.raw_data
    cut = rng.randrange(len(raw) + 1)
    tensor.raw_data = raw[:cut] if rng.random() < 0.5 else raw + raw[:cut]
    return f"initializer '{tensor.name}': {len(tensor.raw_data)} of {len(raw)} bytes"


def _integer_value(rng: random.Random, model: onnx.ModelProto) -> str | None:
    """An element of a small integer tensor (a shape, axes, pads, starts) becomes extreme."""
    tensors = [
        t
        for g in _graphs(model)
        for t in g.initializer
        if t.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) and len(t.raw_data) <= 64
    ]
    tensors += [
        a.t
        for n in _nodes(model)
        if n.op_type == "Constant"
        for a in n.attribute
        if a.HasField("t") and a.t.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32)
    ]
    tensor = _pick(rng, tensors)
    if not isinstance(tensor, onnx.TensorProto):
        return None
    try:
        array = onnx.numpy_helper.to_array(tensor).copy()
    except ValueError:  # an earlier change left its data short of its shape
        return None
    if array.size == 0:
        return None
    flat = array.reshape(-1)
    at = rng.randrange(flat.size)
    bits = 63 if array.dtype.itemsize == 8 else 31
    value = max(min(_integer(rng, int(flat[at])), 2**bits - 1), -(2**bits))
    flat[at] = value
    tensor.CopyFrom(onnx.numpy_helper.from_array(array, tensor.name))
    return f"integer in '{tensor.name}': element {at} = {value}"


def _attribute(rng: random.Random, model: onnx.ModelProto) -> str | None:
    attrs = [a for n in _nodes(model) for a in n.attribute]
    attr = _pick(rng, attrs)
    if not isinstance(attr, onnx.AttributeProto):
        return None
    kind = attr.type
    if rng.random() < 0.1:
        attr.type = rng.choice(list(onnx.AttributeProto.AttributeType.values()))
        return f"attribute '{attr.name}': type {attr.type}"
    if rng.random() < 0.1:
        attr.name = rng.choice(("", "axis", "to", "perm", attr.name + "_"))
        return f"attribute renamed '{attr.name}'"
    if kind == onnx.AttributeProto.INT:
        attr.i = max(min(_integer(rng, attr.i), 2**63 - 1), -(2**63))
        return f"attribute '{attr.name}': {attr.i}"
    if kind == onnx.AttributeProto.INTS:
        values = list(attr.ints)
        if values and rng.random() < 0.7:
            at = rng.randrange(len(values))
            values[at] = max(min(_integer(rng, values[at]), 2**63 - 1), -(2**63))
        elif values and rng.random() < 0.5:
            values = values[:-1]
        else:
            values = [*values, rng.choice(EXTREMES)]
        del attr.ints[:]
        attr.ints.extend(values)
        return f"attribute '{attr.name}': {values}"
    if kind == onnx.AttributeProto.FLOAT:
        attr.f = rng.choice(FLOATS)
        return f"attribute '{attr.name}': {attr.f}"
    if kind == onnx.AttributeProto.STRING:
        attr.s = rng.choice(STRINGS).encode()
        return f"attribute '{attr.name}': {attr.s!r}"
    return None


def _data_type(rng: random.Random, model: onnx.ModelProto) -> str | None:
    code = rng.choice((*range(27), 99, -1))
    targets: list[object] = [t for g in _graphs(model) for t in g.initializer]
    targets += [
        v.type.tensor_type
        for g in _graphs(model)
        for v in (*g.input, *g.output)
        if v.type.HasField("tensor_type")
    ]
    targets += [a for n in _nodes(model) if n.op_type == "Cast" for a in n.attribute]
    target = _pick(rng, targets)
    if isinstance(target, onnx.TensorProto):
        target.data_type = code
    elif isinstance(target, onnx.TypeProto.Tensor):
        target.elem_type = code
    elif isinstance(target, onnx.AttributeProto):
        target.i = code
    else:
        return None
    return f"data type {code}"


def _node_order(rng: random.Random, model: onnx.ModelProto) -> str | None:
    nodes = model.graph.node
    if len(nodes) < 2:
        return None
    i, j = rng.sample(range(len(nodes)), 2)
    first, second = onnx.NodeProto(), onnx.NodeProto()
    first.CopyFrom(nodes[i])
    second.CopyFrom(nodes[j])
    nodes[i].CopyFrom(second)
    nodes[j].CopyFrom(first)
    return f"nodes {i} and {j} swapped"


def _name(rng: random.Random, model: onnx.ModelProto) -> str | None:
    nodes = _nodes(model)
    # A name an earlier byte change left invalid UTF-8 reads back as bytes: not offered.
    names = sorted(
        {n for node in nodes for n in (*node.input, *node.output) if isinstance(n, str)} - {""}
    )
    node = _pick(rng, [n for n in nodes if n.input or n.output])
    if not isinstance(node, onnx.NodeProto) or not names:
        return None
    field = node.output if rng.random() < 0.3 and node.output else node.input
    if not field:
        return None
    at = rng.randrange(len(field))
    field[at] = rng.choice((*names, "", "missing"))
    return f"node '{node.name}': name {at} = '{field[at]}'"


def _op_type(rng: random.Random, model: onnx.ModelProto) -> str | None:
    nodes = _nodes(model)
    node = _pick(rng, nodes)
    if not isinstance(node, onnx.NodeProto):
        return None
    node.op_type = rng.choice([n.op_type for n in nodes] + ["Relu", "Reshape", "If", "Nope"])
    return f"node '{node.name}': op {node.op_type}"


def _node_count(rng: random.Random, model: onnx.ModelProto) -> str | None:
    nodes = model.graph.node
    if not nodes:
        return None
    at = rng.randrange(len(nodes))
    if rng.random() < 0.5:
        copy = onnx.NodeProto()
        copy.CopyFrom(nodes[at])
        nodes.insert(rng.randrange(len(nodes) + 1), copy)
        return f"node {at} repeated"
    del nodes[at]
    return f"node {at} removed"


def _opset(rng: random.Random, model: onnx.ModelProto) -> str | None:
    entry = _pick(rng, list(model.opset_import))
    if not isinstance(entry, onnx.OperatorSetIdProto):
        return None
    entry.version = rng.choice((1, 6, 7, 9, 11, 13, 17, 18, 21, 23, 99, 2**40, -1))
    return f"opset '{entry.domain}': {entry.version}"


FIELD_MUTATIONS: tuple[Mutation, ...] = (
    _dim,
    _initializer_shape,
    _initializer_data,
    _integer_value,
    _integer_value,  # twice: shapes and axes computed from integers are where models break
    _attribute,
    _attribute,
    _data_type,
    _node_order,
    _name,
    _op_type,
    _node_count,
    _opset,
)
