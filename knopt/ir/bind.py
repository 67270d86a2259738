"""Binding symbolic sizes: from actual input shapes to sizes, and from sizes to a static graph."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

from knopt.errors import InputError, InvalidGraphError
from knopt.ir.builder import GraphBuilder
from knopt.ir.graph import Graph, Value
from knopt.ir.op import Input, TensorType
from knopt.ir.program import Program, Tensor
from knopt.ir.shape import Sym, bind, evaluate, format_shape


def infer_sizes(graph: Graph, shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
    """The value of every symbolic size, read off the actual shapes of the graph inputs.

    Raises:
        InputError: If an input is missing, has the wrong rank, or sizes conflict.
    """
    sizes: dict[str, int] = {}
    declared = dict(zip(graph.input_names, graph.inputs, strict=True))
    for name, value in declared.items():
        if name not in shapes:
            raise InputError(f"input '{name}' is missing (expected {value.type})")
        actual = tuple(shapes[name])
        if len(actual) != value.rank:
            raise InputError(
                f"input '{name}' has shape {list(actual)}, expected {format_shape(value.shape)}"
            )
        for dim, size in zip(value.shape, actual, strict=True):
            symbol = dim.as_symbol() if isinstance(dim, Sym) else None
            if symbol is not None and sizes.setdefault(symbol, size) != size:
                raise InputError(
                    f"input '{name}': size '{symbol}' is {size} here but "
                    f"{sizes[symbol]} in another input"
                )
    for name, value in declared.items():
        try:
            expected = bind(value.shape, sizes)
        except InvalidGraphError as err:  # a size appears only inside products: not readable
            raise InputError(f"input '{name}': cannot read sizes from {value.type}: {err}") from err
        if expected != tuple(shapes[name]):
            raise InputError(
                f"input '{name}' has shape {list(shapes[name])}, expected "
                f"{format_shape(value.shape)} = {list(expected)}"
            )
    return sizes


def bind_symbols(graph: Graph, sizes: Mapping[str, int]) -> Graph:
    """A copy of `graph` with its symbolic sizes replaced by integers.

    Raises:
        InvalidGraphError: If a size is missing or a shape becomes invalid.
    """
    # Copy, don't mutate: the symbolic graph is kept and bound again for other sizes.
    builder = GraphBuilder(graph.name)
    mapped: dict[Value, Value] = {}
    for node in graph.nodes:
        op = bind_attributes(node.op, sizes)
        if isinstance(op, Input):
            value = builder.input(op.input_name, op.tensor_type.shape, op.tensor_type.dtype)
        else:
            value = builder.apply(op, [mapped[v] for v in node.inputs], name=node.name)
        mapped[node.output] = value
    for name, value in zip(graph.output_names, graph.outputs, strict=True):
        builder.output(mapped[value], name)
    return builder.build()


def bind_program(program: Program, sizes: Mapping[str, int]) -> Program:
    """A copy of a symbolic program with its sizes replaced by integers (constants shared).

    Binding is cheap (no optimizer): a program optimized once on symbolic sizes is bound
    to each set of actual sizes and planned for it. To bind one program to many sizes, keep
    a `ProgramBinder`, which finds where the sizes are once.

    Raises:
        InvalidGraphError: If a size is missing.
    """
    return ProgramBinder(program).bind(sizes)


class ProgramBinder:
    """Binds one symbolic program to sizes, again and again.

    It finds once which tensors have symbolic shapes and which kernels hold sizes in their
    ops' fields; a binding rebuilds only those, and shares every other tensor and kernel (all
    frozen) with the symbolic program. Bound programs equal `bind_program`'s.

    Args:
        program: The symbolic program (not changed afterwards).
    """

    def __init__(self, program: Program) -> None:
        self.program = program
        shapes: dict[tuple[Any, ...], int] = {}
        self._tensors: list[tuple[int, int]] = []  # (tensor index, index in `_shapes`)
        for index, tensor in enumerate(program.tensors):
            if _holds_size(tensor.type.shape):
                slot = shapes.setdefault((tensor.type.shape, tensor.type.dtype), len(shapes))
                self._tensors.append((index, slot))
        self._shapes = list(shapes)
        self._kernels = [
            i for i, k in enumerate(program.kernels) if k.op is not None and _holds_size(k.op)
        ]

    def bind(self, sizes: Mapping[str, int]) -> Program:
        """The program with `sizes` bound.

        Raises:
            InvalidGraphError: If a size is missing.
        """
        program = self.program
        types = [TensorType(bind(shape, sizes), dtype) for shape, dtype in self._shapes]
        tensors = list(program.tensors)
        for index, slot in self._tensors:
            old = tensors[index]
            tensors[index] = Tensor(old.id, types[slot], old.role)
        kernels = list(program.kernels)
        for index in self._kernels:
            kernels[index] = dataclasses.replace(
                kernels[index], op=bind_attributes(kernels[index].op, sizes)
            )
        return Program(
            tensors,
            kernels,
            list(program.inputs),
            list(program.input_names),
            list(program.outputs),
            list(program.output_names),
            program.constants,
            program.name,
        )


def _holds_size(value: object) -> bool:
    """Whether `bind_attributes` would find a symbolic size in `value` (an op or a field)."""
    if isinstance(value, Sym):
        return True
    if isinstance(value, TensorType):
        return _holds_size(value.shape)
    if isinstance(value, tuple):
        return any(_holds_size(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return any(_holds_size(getattr(value, name)) for name in _field_names(type(value)))
    return False


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def bind_attributes(op: Any, sizes: Mapping[str, int]) -> Any:
    """A copy of a frozen dataclass (an op, a kernel) with symbolic sizes in its fields bound."""
    if not dataclasses.is_dataclass(op):
        return op
    changes = {}
    for f in dataclasses.fields(op):
        old = getattr(op, f.name)
        new = _bind_value(old, sizes)
        if new is not old:
            changes[f.name] = new
    return dataclasses.replace(op, **changes) if changes else op  # type: ignore[type-var]


def _bind_value(value: object, sizes: Mapping[str, int]) -> object:
    if isinstance(value, Sym):
        return evaluate(value, sizes)
    if isinstance(value, TensorType):
        return TensorType(bind(value.shape, sizes), value.dtype)
    if isinstance(value, tuple):
        items = tuple(_bind_value(v, sizes) for v in value)
        return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
    return value
