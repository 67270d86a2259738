"""The graph IR (values, nodes, ops, shapes, dtypes, builder, validation) and kernel Programs.

A `Program` is what extraction chooses: kernels over tensors, each of a `KernelKind`.
"""

from knopt.ir.bind import bind_symbols, infer_sizes
from knopt.ir.builder import GraphBuilder
from knopt.ir.dtype import DType
from knopt.ir.graph import Graph, Node, Value
from knopt.ir.kernel import KernelKind
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
from knopt.ir.program import Kernel, Program, format_program, program_from_graph
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
    "Kernel",
    "KernelKind",
    "Node",
    "Op",
    "PadMode",
    "PoolKind",
    "Program",
    "Reduction",
    "ScatterReduction",
    "Shape",
    "Sym",
    "TensorType",
    "Unary",
    "Value",
    "bind_symbols",
    "format_graph",
    "format_program",
    "infer_sizes",
    "program_from_graph",
    "sym",
    "validate",
]
