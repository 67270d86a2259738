"""`Emitter`: the state of one ONNX export (nodes, initializers, names, size tensors).

The per-op exporters (`knopt.onnx.export_ops`) call `op` to add ONNX nodes and `constant`,
`sizes` and `scalar_size` for the tensors they need. Symbolic sizes become run-time
arithmetic on the `Shape` of the graph input axis that carries them, so that an exported model
keeps its dynamic axes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from knopt.errors import UnsupportedModelError
from knopt.ir.dtype import DType
from knopt.ir.graph import Graph, Node
from knopt.ir.op import Input, OpaqueCall, TensorType
from knopt.ir.shape import Dim, Sym, sym
from knopt.onnx.legalize import carry_narrow_floats


class Emitter:
    """Collects the ONNX nodes and initializers of one exported graph.

    Attributes:
        opset: The version of the default ONNX domain being written.
        nodes: The ONNX nodes so far, in topological order.
        initializers: The large constants so far.
    """

    def __init__(self, graph: Graph, *, opset: int) -> None:
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._value_names: set[str] = set(graph.input_names) | set(graph.output_names)
        self._node_names: set[str] = set()
        self._constants: dict[tuple[str, tuple[int, ...], bytes], str] = {}
        self._sizes: dict[Dim, str] = {}
        self._symbols = _symbol_sources(graph)
        self._producers: dict[str, onnx.NodeProto] = {}
        self._base = "node"
        self._opaque: dict[tuple[OpaqueCall, tuple[str, ...]], list[str]] = {}
        self.domain_versions: dict[str, int] = {}  # of the domains opaque nodes were kept at
        # Types of opaque nodes' outputs, which no schema gives a reader of the written model.
        self.declared: dict[str, TensorType] = {}

    def begin(self, node: Node) -> None:
        """Name the ONNX nodes emitted next after the IR node `node`."""
        self._base = node.name or node.op.name

    def op(self, op_type: str, inputs: Sequence[str], *, domain: str = "", **attrs: Any) -> str:
        """Add an ONNX node with one output and return the output's name.

        Args:
            op_type: The op.
            inputs: Value names; '' for an absent optional input.
            domain: The op's domain; '' for the default one.
            **attrs: The node's attributes; None values are left out.
        """
        return self.op_outputs(op_type, inputs, domain=domain, **attrs)[0]

    def op_outputs(
        self,
        op_type: str,
        inputs: Sequence[str],
        *,
        outputs: int | Sequence[bool] = 1,
        domain: str = "",
        **attrs: Any,
    ) -> list[str]:
        """Add an ONNX node and return the names of its outputs.

        Args:
            op_type: The op.
            inputs: Value names; '' for an absent optional input.
            outputs: How many outputs the node has, or which of its outputs are wanted ('' is
                written, and returned, for the others).
            domain: The op's domain; '' for the default one.
            **attrs: The node's attributes; None values are left out.
        """
        name = self._unique(self._base, self._node_names)
        wanted = [True] * outputs if isinstance(outputs, int) else list(outputs)
        while len(wanted) > 1 and not wanted[-1]:
            wanted.pop()
        results = [
            self._unique(f"{name}_output_{i}", self._value_names) if keep else ""
            for i, keep in enumerate(wanted)
        ]
        kept = {key: value for key, value in attrs.items() if value is not None}
        node = helper.make_node(op_type, list(inputs), results, name=name, domain=domain, **kept)
        self.nodes.append(node)
        self._producers.update((result, node) for result in results if result)
        return results

    def opaque(self, call: OpaqueCall, inputs: Sequence[str]) -> list[str]:
        """Write an opaque op's node as the model wrote it, once; the names of its outputs.

        Its attributes, op type and domain are kept, its name where it had one; its values
        get new names ('' stays '': an absent optional input or output).

        Raises:
            UnsupportedModelError: If the node's op means something else at the opset being
                written (or is not there), or its domain was kept at two versions.
        """
        key = (call, tuple(inputs))
        if (found := self._opaque.get(key)) is not None:
            return found
        self._check_version(call)
        node = onnx.NodeProto()
        node.ParseFromString(call.node)
        node.name = self._unique(call.node_name or self._base, self._node_names)
        given = iter(inputs)
        node.input[:] = [next(given) if name else "" for name in node.input]
        node.output[:] = [
            self._unique(f"{node.name}_output_{i}", self._value_names) if name else ""
            for i, name in enumerate(node.output)
        ]
        self.nodes.append(node)
        self._producers.update((result, node) for result in node.output if result)
        self._opaque[key] = list(node.output)
        return self._opaque[key]

    def _check_version(self, call: OpaqueCall) -> None:
        where = f"node '{call.node_name}' ({call})" if call.node_name else f"a {call} node"
        if not call.domain:
            if _since(call.op_type, self.opset) != _since(call.op_type, call.version):
                raise UnsupportedModelError(
                    f"{where}: knopt keeps this op as the model wrote it at opset "
                    f"{call.version}, and opset {self.opset} does not define it the same way; "
                    f"write opset {call.version} (--opset {call.version})"
                )
            return
        known = self.domain_versions.setdefault(call.domain, call.version)
        if known != call.version:
            raise UnsupportedModelError(
                f"{where}: domain {call.domain} is kept at version {call.version} here and "
                f"{known} elsewhere; one model imports a domain at one version"
            )

    def producer(self, name: str) -> onnx.NodeProto | None:
        """The node that computes the value `name`; None for an input or initializer."""
        return self._producers.get(name)

    def carry_narrow_floats(self, start: int, types: dict[str, int]) -> None:
        """Compute the nodes added since `start` in float32 where their op lacks 16-bit floats.

        Args:
            start: Index in `nodes` of the first node to check.
            types: Element types of the value names known so far; updated.
        """
        types.update({t.name: t.data_type for t in self.initializers})
        self.nodes[start:] = carry_narrow_floats(
            self.nodes[start:],
            types,
            self.opset,
            lambda wanted: self._unique(wanted, self._value_names),
            lambda wanted: self._unique(wanted, self._node_names),
        )

    def constant(self, array: np.ndarray) -> str:
        """A value holding `array`: an initializer, shared by every reader of equal contents.

        Initializers rather than Constant nodes: a node is one more step for a runtime, and
        onnxruntime, onnxsim and onnxslim all count it.
        """
        array = np.asarray(array, order="C")  # not ascontiguousarray: it makes 0-d 1-d
        key = (array.dtype.str, tuple(array.shape), array.tobytes())
        if (found := self._constants.get(key)) is not None:
            return found
        name = self._unique(f"{self._base}_weight", self._value_names)
        self.initializers.append(numpy_helper.from_array(array, name))
        self._constants[key] = name
        return name

    def scalar(self, value: float | int | bool, dtype: DType) -> str:
        """A 0-d constant of `dtype`."""
        return self.constant(np.array(value).astype(dtype.numpy))

    def ints(self, values: Sequence[int]) -> str:
        """A 1-D int64 constant (axes, steps and other integer operands)."""
        return self.constant(np.array(values, dtype=np.int64))

    def sizes(self, dims: Sequence[Dim]) -> str:
        """A 1-D int64 tensor holding `dims`, computed at run time where they are symbolic."""
        static = [d for d in dims if isinstance(d, int)]
        if len(static) == len(dims):
            return self.ints(static)
        if len(dims) == 1:
            return self._size(dims[0])
        return self.op("Concat", [self._size(d) for d in dims], axis=0)

    def scalar_size(self, dim: Dim) -> str:
        """A 0-d int64 tensor holding `dim`."""
        if isinstance(dim, int):
            return self.scalar(dim, DType.I64)
        return self.op("Squeeze", [self._size(dim), self.ints([0])])

    def _size(self, dim: Dim) -> str:
        """A `[1]` int64 tensor holding `dim`."""
        if isinstance(dim, int):
            return self.ints([dim])
        if (found := self._sizes.get(dim)) is not None:
            return found
        base, self._base = self._base, f"size_{dim}".replace(" ", "")
        try:
            total = None
            for monomial, coefficient in dim.terms:
                term = self._monomial(monomial, coefficient)
                total = term if total is None else self.op("Add", [total, term])
        finally:
            self._base = base
        assert total is not None
        self._sizes[dim] = total
        return total

    def _monomial(self, monomial: tuple[str, ...], coefficient: int) -> str:
        factors = [self._symbol(name) for name in monomial]
        if coefficient != 1 or not factors:
            factors.append(self.ints([coefficient]))
        product = factors[0]
        for factor in factors[1:]:
            product = self.op("Mul", [product, factor])
        return product

    def _symbol(self, name: str) -> str:
        key = sym(name)
        if (found := self._sizes.get(key)) is not None:
            return found
        if name not in self._symbols:
            raise UnsupportedModelError(
                f"symbolic size '{name}' is not the size of any graph input axis, so the "
                "exported model could not compute it; bind it first (knopt.ir.bind_symbols)"
            )
        input_name, axis = self._symbols[name]
        base, self._base = self._base, f"size_{name}"
        try:
            found = self.op("Shape", [input_name], start=axis, end=axis + 1)
        finally:
            self._base = base
        self._sizes[key] = found
        return found

    @staticmethod
    def _unique(wanted: str, taken: set[str]) -> str:
        name, count = wanted, 0
        while name in taken:
            count += 1
            name = f"{wanted}_{count}"
        taken.add(name)
        return name


def _since(op_type: str, opset: int) -> int | None:
    """The version of the default domain's `op_type` in force at `opset` (None: no such op)."""
    try:
        return int(onnx.defs.get_schema(op_type, min(opset, 2**31 - 1), "").since_version)
    except onnx.defs.SchemaError:
        return None


def _symbol_sources(graph: Graph) -> dict[str, tuple[str, int]]:
    """For each symbolic size, the first graph input axis whose size is exactly that symbol."""
    sources: dict[str, tuple[str, int]] = {}
    for value in graph.inputs:
        op = value.producer.op
        assert isinstance(op, Input)
        for axis, dim in enumerate(value.shape):
            name = dim.as_symbol() if isinstance(dim, Sym) else None
            if name is not None:
                sources.setdefault(name, (op.input_name, axis))
    return sources
