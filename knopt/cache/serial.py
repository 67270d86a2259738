"""IR graphs as JSON plus raw constant bytes: a pickle-free form that is safe to read back.

A graph is written as its nodes in order, each with its op's class name, its attributes and the
indices of its inputs; constants go to a separate list of arrays (raw bytes with a dtype and a
shape), so the JSON stays small and no Python object is ever unpickled. Reading builds nodes
only from the op classes of `knopt.ir.op.OP_CLASSES` and the enums of `ENUMS`, recomputes every
type with the ops' own `infer`, and validates the graph, so a damaged or hostile file raises
`CacheFormatError` instead of running anything.

The same encoding, with each constant replaced by its content digest, gives `graph_digest`: a
hash of everything that determines what a graph computes.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from knopt.errors import InvalidGraphError, KnoptError
from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.graph import Graph, Node, Value
from knopt.ir.shape import Dim, Sym, sym
from knopt.ir.validate import validate


class CacheFormatError(KnoptError):
    """A cache entry is not a graph knopt wrote (damaged, truncated, or not ours)."""


# Every enum an op attribute can hold, by class name (tests prove the table complete).
ENUMS: dict[str, type[enum.Enum]] = {
    cls.__name__: cls
    for cls in (
        DType,
        ops.Unary,
        ops.Binary,
        ops.Reduction,
        ops.PadMode,
        ops.PoolKind,
        ops.ScatterReduction,
    )
}
OPS: dict[str, type[ops.Op]] = {cls.__name__: cls for cls in ops.OP_CLASSES}

Encoded = Any  # JSON-ready data


def encode_graph(graph: Graph, constant: Callable[[ops.ConstData], Encoded]) -> Encoded:
    """The graph as JSON-ready data; `constant` encodes each constant (an index, a digest).

    Raises:
        KnoptError: If an op attribute has a type this encoding lacks (a knopt bug).
    """
    index = {node.output: i for i, node in enumerate(graph.nodes)}
    nodes = [
        {
            "op": type(node.op).__name__,
            # An op's instance dict holds exactly its dataclass fields (`arity` is a ClassVar).
            "attributes": {name: _encode(v, constant) for name, v in vars(node.op).items()},
            "inputs": [index[v] for v in node.inputs],
            "name": node.name,
        }
        for node in graph.nodes
    ]
    return {
        "name": graph.name,
        "nodes": nodes,
        "inputs": [index[v] for v in graph.inputs],
        "outputs": [index[v] for v in graph.outputs],
        "output_names": list(graph.output_names),
    }


def graph_digest(graph: Graph) -> str:
    """A SHA-256 of the graph's ops, attributes, constants (by content), sizes and names."""
    encoded = encode_graph(graph, lambda data: data.digest)
    return hashlib.sha256(json.dumps(encoded, sort_keys=True).encode()).hexdigest()


def dump_graph(graph: Graph) -> tuple[Encoded, list[np.ndarray]]:
    """The graph as JSON-ready data and the list of constant arrays it refers to by index."""
    arrays: list[np.ndarray] = []
    seen: dict[str, int] = {}

    def store(data: ops.ConstData) -> Encoded:
        if data.digest not in seen:
            seen[data.digest] = len(arrays)
            arrays.append(data.array)
        return seen[data.digest]

    return encode_graph(graph, store), arrays


def load_graph(encoded: Encoded, arrays: Sequence[np.ndarray]) -> tuple[Graph, list[Node]]:
    """Rebuild a graph written by `dump_graph`; returns it and its nodes in written order.

    Raises:
        CacheFormatError: If the data is not a well-formed graph.
    """
    try:
        nodes: list[Node] = []
        for item in encoded["nodes"]:
            cls = OPS[item["op"]]
            attributes = {
                name: _decode(value, arrays) for name, value in item["attributes"].items()
            }
            node = Node(cls(**attributes), tuple(nodes[i].output for i in item["inputs"]))
            if cls.arity is not None and len(node.inputs) != cls.arity:
                raise ValueError(f"{cls.__name__} takes {cls.arity} inputs")
            node.name = str(item["name"])
            node.output = Value(node.op.infer([v.type for v in node.inputs], "cached"), node)
            nodes.append(node)
        graph = Graph(
            nodes,
            [nodes[i].output for i in encoded["inputs"]],
            [nodes[i].output for i in encoded["outputs"]],
            [str(name) for name in encoded["output_names"]],
            str(encoded["name"]),
        )
        validate(graph)
    except (KeyError, IndexError, TypeError, ValueError, InvalidGraphError) as err:
        raise CacheFormatError(f"not a graph knopt wrote ({type(err).__name__}: {err})") from err
    return graph, nodes


def _encode(value: Any, constant: Callable[[ops.ConstData], Encoded]) -> Encoded:
    # Enums first: DType is an IntEnum, which would otherwise pass for an int.
    if isinstance(value, enum.Enum) and type(value).__name__ in ENUMS:
        return {"enum": [type(value).__name__, value.name]}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, tuple):
        return {"tuple": [_encode(v, constant) for v in value]}
    if isinstance(value, Sym):
        return {"sym": [[list(monomial), c] for monomial, c in value.terms]}
    if isinstance(value, ops.TensorType):
        return {"type": [_encode(value.shape, constant), _encode(value.dtype, constant)]}
    if isinstance(value, ops.ConstData):
        return {"const": constant(value)}
    if isinstance(value, ops.OpaqueCall):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return {"opaque": {**fields, "node": base64.b64encode(value.node).decode()}}
    raise KnoptError(f"cannot encode an op attribute of type {type(value).__name__}")


def _decode(value: Encoded, arrays: Sequence[np.ndarray]) -> Any:
    if not isinstance(value, dict):
        if value is None or isinstance(value, bool | int | float | str):
            return value
        raise ValueError(f"unexpected attribute value {value!r}")
    ((tag, body),) = value.items()
    if tag == "enum":
        kind, name = body
        return ENUMS[kind][name]
    if tag == "tuple":
        return tuple(_decode(v, arrays) for v in body)
    if tag == "sym":
        return _polynomial(body)
    if tag == "type":
        shape, dtype = body
        return ops.TensorType(_decode(shape, arrays), _decode(dtype, arrays))
    if tag == "const":
        return ops.ConstData(arrays[body])
    if tag == "opaque":
        return ops.OpaqueCall(**{**body, "node": base64.b64decode(body["node"], validate=True)})
    raise ValueError(f"unknown attribute tag {tag!r}")


def _polynomial(terms: Encoded) -> Dim:
    """A `Sym` from its terms, built by arithmetic so that it comes out in canonical form."""
    total: Dim = 0
    for monomial, coefficient in terms:
        term: Dim = int(coefficient)
        for name in monomial:
            term = term * sym(str(name))
        total = total + term
    return total
