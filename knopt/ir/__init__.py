"""The graph IR: values, nodes, ops, shapes, dtypes, a builder, validation and a text dump."""

from knopt.ir.bind import bind_symbols, infer_sizes
from knopt.ir.builder import GraphBuilder
from knopt.ir.dtype import DType
from knopt.ir.graph import Graph, Node, Value
from knopt.ir.op import (
    Binary,
    ConstData,
    Op,
    PadMode,
    PoolKind,
    Reduction,
    ScatterReduction,
    TensorType,
    Unary,
)
from knopt.ir.shape import Dim, Shape, Sym, sym
from knopt.ir.text import format_graph
from knopt.ir.validate import validate

__all__ = [
    "Binary",
    "ConstData",
    "DType",
    "Dim",
    "Graph",
    "GraphBuilder",
    "Node",
    "Op",
    "PadMode",
    "PoolKind",
    "Reduction",
    "ScatterReduction",
    "Shape",
    "Sym",
    "TensorType",
    "Unary",
    "Value",
    "bind_symbols",
    "format_graph",
    "infer_sizes",
    "sym",
    "validate",
]
