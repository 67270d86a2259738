"""What every ONNX op importer works with: the registry, the import context and attributes.

An importer is one small function per ONNX op type, registered with `@importer("Relu")`. It reads
its inputs and attributes through the context and returns the values of the node's outputs,
built with the context's `GraphBuilder`. An attribute that is present but never read is an
error, so nothing is silently ignored.

Values known while importing (shapes, shape arithmetic, small integer constants) are `Known`
arrays. A `folder` evaluates an op on known inputs, so that `Shape -> Gather -> Concat ->
Reshape` chains become plain attributes instead of runtime work.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np
import onnx

from knopt.errors import SymbolicSizeError, UnsupportedModelError
from knopt.ir import op as ops
from knopt.ir.builder import GraphBuilder
from knopt.ir.dtype import DType
from knopt.ir.graph import Value
from knopt.ir.shape import Dim, Sym
from knopt.onnx.data import tensor_array


@dataclass(frozen=True, eq=False)
class Known:
    """A value known at import time.

    Attributes:
        array: The value. Integer tensors that depend on symbolic sizes hold `int`/`Sym` objects
            (numpy dtype object); all others are ordinary numpy arrays.
        dtype: The ONNX element type the value has in the model.
    """

    array: np.ndarray
    dtype: DType

    @property
    def is_symbolic(self) -> bool:
        """True if some element is a symbolic size."""
        return self.array.dtype == object and any(isinstance(v, Sym) for v in self.array.flat)

    def concrete(self) -> np.ndarray:
        """The value as an ordinary array of its dtype (it must not be symbolic)."""
        assert not self.is_symbolic
        return np.asarray(
            self.array.astype(self.dtype.numpy) if self.array.dtype == object else self.array
        )


class KnownValueRequired(UnsupportedModelError):
    """An importer needs a value at import time (a shape, axes, a condition) that is computed.

    Attributes:
        value_name: The ONNX name of that value, so that a caller can fix the graph inputs it
            depends on and import again (as `knopt.onnx_backend` does).
    """

    def __init__(self, message: str, value_name: str) -> None:
        super().__init__(message)
        self.value_name = value_name


class SizeComputationRequired(KnownValueRequired, SymbolicSizeError):
    """A value needed at import time is computed from input sizes that are symbolic."""


OnnxValue: TypeAlias = Value | Known
Importer: TypeAlias = Callable[["ImportContext", onnx.NodeProto], Sequence[OnnxValue | None]]
Folder: TypeAlias = Callable[
    ["ImportContext", onnx.NodeProto, list[Known | None]], Sequence[Known] | None
]

_IMPORTERS: dict[tuple[str, str], list[tuple[int, Importer]]] = {}
_FOLDERS: dict[tuple[str, str], Folder] = {}

KNOWN_LIMIT = 4096  # larger float results of folding stay in the graph, for the optimizer


def importer(op_type: str, since: int = 1, domain: str = "") -> Callable[[Importer], Importer]:
    """Register an importer for `op_type` from opset version `since` on."""

    def register(fn: Importer) -> Importer:
        versions = _IMPORTERS.setdefault((domain, op_type), [])
        versions.append((since, fn))
        versions.sort(key=lambda item: item[0])
        return fn

    return register


def folder(op_type: str, domain: str = "") -> Callable[[Folder], Folder]:
    """Register an import-time evaluator for `op_type` on known inputs.

    A folder returns None when it cannot evaluate these inputs (then the importer runs).
    """

    def register(fn: Folder) -> Folder:
        _FOLDERS[(domain, op_type)] = fn
        return fn

    return register


def find_importer(domain: str, op_type: str, opset: int) -> Importer | None:
    """The importer registered for this op at the newest version not above `opset`."""
    chosen = None
    for since, fn in _IMPORTERS.get((domain, op_type), []):
        if since <= opset:
            chosen = fn
    return chosen


def find_folder(domain: str, op_type: str) -> Folder | None:
    """The folder registered for this op, if any."""
    return _FOLDERS.get((domain, op_type))


def supported_op_types() -> list[str]:
    """Every ONNX op type of the default domain that has an importer, sorted."""
    return sorted(op for domain, op in _IMPORTERS if domain == "")


class Attributes:
    """A node's attributes, read by type; records which were read.

    Raises:
        UnsupportedModelError: From a getter, if the attribute has the wrong type.
    """

    def __init__(self, node: onnx.NodeProto, where: str) -> None:
        self._attrs = {a.name: a for a in node.attribute}
        self._read: set[str] = set()
        self.where = where

    def has(self, name: str) -> bool:
        """True if the node sets `name`."""
        return name in self._attrs

    def _get(self, name: str, kind: int) -> onnx.AttributeProto | None:
        self._read.add(name)
        attr = self._attrs.get(name)
        if attr is not None and attr.type != kind:
            expected = onnx.AttributeProto.AttributeType.Name(kind)
            raise UnsupportedModelError(
                f"{self.where}: attribute '{name}' should be {expected}, "
                f"got {onnx.AttributeProto.AttributeType.Name(attr.type)}"
            )
        return attr

    def int(self, name: str, default: int | None = None) -> int:
        """An INT attribute (or the default)."""
        attr = self._get(name, onnx.AttributeProto.INT)
        return self._require(name, default) if attr is None else int(attr.i)

    def float(self, name: str, default: float | None = None) -> float:
        """A FLOAT attribute (or the default)."""
        attr = self._get(name, onnx.AttributeProto.FLOAT)
        return self._require(name, default) if attr is None else float(attr.f)

    def string(self, name: str, default: str | None = None) -> str:
        """A STRING attribute, decoded (or the default)."""
        attr = self._get(name, onnx.AttributeProto.STRING)
        return self._require(name, default) if attr is None else attr.s.decode()

    def ints(self, name: str, default: Sequence[builtins.int] | None = None) -> list[builtins.int]:
        """An INTS attribute (or the default)."""
        attr = self._get(name, onnx.AttributeProto.INTS)
        if attr is None:
            return list(self._require(name, default))
        return [int(v) for v in attr.ints]

    def floats(
        self, name: str, default: Sequence[builtins.float] | None = None
    ) -> list[builtins.float]:
        """A FLOATS attribute (or the default)."""
        attr = self._get(name, onnx.AttributeProto.FLOATS)
        if attr is None:
            return list(self._require(name, default))
        return [float(v) for v in attr.floats]

    def strings(self, name: str, default: Sequence[str] | None = None) -> list[str]:
        """A STRINGS attribute, decoded (or the default)."""
        attr = self._get(name, onnx.AttributeProto.STRINGS)
        if attr is None:
            return list(self._require(name, default))
        return [v.decode() for v in attr.strings]

    def tensor(self, name: str) -> np.ndarray | None:
        """A TENSOR attribute as an array, or None."""
        attr = self._get(name, onnx.AttributeProto.TENSOR)
        return None if attr is None else tensor_array(attr.t, f"{self.where}: attribute '{name}'")

    def tensor_proto(self, name: str) -> onnx.TensorProto | None:
        """A TENSOR attribute as its proto, or None."""
        attr = self._get(name, onnx.AttributeProto.TENSOR)
        return None if attr is None else attr.t

    def graph(self, name: str) -> onnx.GraphProto | None:
        """A GRAPH attribute (a subgraph), or None."""
        attr = self._get(name, onnx.AttributeProto.GRAPH)
        return None if attr is None else attr.g

    def skip(self, *names: str) -> None:
        """Mark attributes as read that do not change inference results (such as `momentum`)."""
        self._read.update(names)

    def unread(self) -> list[str]:
        """Names of attributes present but never read."""
        return sorted(set(self._attrs) - self._read)

    def _require(self, name: str, default: Any) -> Any:
        if default is None:
            raise UnsupportedModelError(f"{self.where}: required attribute '{name}' is missing")
        return default


@dataclass
class WholeModel:
    """The model being imported, for what a node's importer learns beyond the node.

    `knopt.onnx.opaque` fills the rest on first need: the value types the model declares and
    those onnx's shape inference finds, and the value names something reads.
    """

    model: onnx.ModelProto
    declared_types: dict[str, onnx.TypeProto] | None = None
    inferred_types: dict[str, onnx.TypeProto] | None = None
    read_names: frozenset[str] | None = None


@dataclass
class ImportContext:
    """State shared by the importers while one graph is imported.

    Attributes:
        builder: Builds the IR graph.
        opset: The model's version of the default ONNX domain.
        domain_opsets: The model's versions of every domain it imports, by domain name.
        env: ONNX value names to what is known of them.
        whole: The model (None for a scratch context that folds one node).
        dims: Fixed values of symbolic sizes, by name (what `import_model` was given).
        strict: Refuse ops knopt has no importer for, instead of keeping them as opaque ops.
    """

    builder: GraphBuilder
    opset: int
    env: dict[str, OnnxValue] = field(default_factory=dict)
    where: str = ""
    _attributes: Attributes | None = None
    _materialized: dict[Known, Value] = field(default_factory=dict)  # by identity
    functions: dict[tuple[str, str], onnx.FunctionProto] = field(default_factory=dict)
    domain_opsets: dict[str, int] = field(default_factory=dict)  # versions of other domains
    whole: WholeModel | None = None
    dims: Mapping[str, Dim] = field(default_factory=dict)
    strict: bool = False

    def fail(self, message: str) -> UnsupportedModelError:
        """An error about the node being imported, naming it."""
        return UnsupportedModelError(f"{self.where}: {message}")

    def fail_symbolic(self, message: str) -> SymbolicSizeError:
        """An error about the node being imported that fixed input sizes would avoid."""
        return SymbolicSizeError(
            f"{self.where}: {message}; fix the sizes when loading (dims=..., or --dims NAME=SIZE)"
        )

    def needs_known(self, name: str, what: str) -> KnownValueRequired:
        """An error saying that the ONNX value `name` (`what`) must be known when loading."""
        return KnownValueRequired(
            f"{self.where}: {what} must be known when loading, not computed", name
        )

    def attributes(self, node: onnx.NodeProto) -> Attributes:
        """The node's attributes (one object per node, so reads are tracked)."""
        assert self._attributes is not None
        return self._attributes

    def lookup(self, name: str) -> OnnxValue:
        """What is known of the ONNX value `name`."""
        if name not in self.env:
            raise self.fail(f"reads '{name}', which is not defined before it")
        return self.env[name]

    def value(self, name: str) -> Value:
        """The ONNX value `name` as a graph value (known values become constants)."""
        found = self.lookup(name)
        if isinstance(found, Value):
            return found
        return self.materialize(found)

    def materialize(self, known: Known) -> Value:
        """A graph value holding `known` (a constant, or computed from symbolic sizes)."""
        if (cached := self._materialized.get(known)) is not None:
            return cached
        if known.is_symbolic:
            value = self._materialize_symbolic(known)
        else:
            value = self.builder.constant(known.concrete())
        self._materialized[known] = value
        return value

    def _materialize_symbolic(self, known: Known) -> Value:
        """A graph value equal to `known`, an integer tensor with symbolic entries.

        Raises:
            UnsupportedModelError: If the known value is not an integer tensor.
        """
        if not known.dtype.is_int:
            raise self.fail(
                f"a {known.dtype.short} value computed from symbolic sizes is not supported; "
                "fix the sizes when loading (dims=...)"
            )
        flat: tuple[Dim, ...] = tuple(
            v if isinstance(v, Sym) else int(v) for v in known.array.reshape(-1)
        )
        sizes = self.builder.apply(ops.Sizes(flat, known.dtype))
        return self.builder.view(sizes, known.array.shape)

    def inputs(self, node: onnx.NodeProto, count: int | tuple[int, int | None]) -> list[Value]:
        """The node's inputs as graph values; `count` is exact or a (min, max) range.

        Absent optional inputs (beyond the node's list or named '') are returned as None, so
        the list always has `max` entries. A max of None takes any number (variadic ops).
        """
        names = self._input_names(node, count)
        return [self.value(n) if n else None for n in names]  # type: ignore[misc]

    def known_input(self, node: onnx.NodeProto, index: int, what: str) -> np.ndarray | None:
        """Input `index` as an array known at import time, or None if absent.

        Raises:
            UnsupportedModelError: If the input is present but only known at run time, or
                depends on a symbolic size.
        """
        if index >= len(node.input) or not node.input[index]:
            return None
        found = self.lookup(node.input[index])
        if isinstance(found, Value):
            raise self.needs_known(node.input[index], f"input {index} ({what})")
        if found.is_symbolic:
            raise self.fail(
                f"input {index} ({what}) depends on symbolic sizes; fix them when loading "
                "(dims=...)"
            )
        return found.concrete()

    def shape_of(self, value: Value, rank: builtins.int, what: str) -> tuple[Dim, ...]:
        """The shape of `value`, which must have `rank` dimensions.

        Raises:
            UnsupportedModelError: If it has another rank.
        """
        if value.rank != rank:
            raise self.fail(f"{what} must have rank {rank}, not {value.rank} ({value.type})")
        return value.shape

    def require_rank(self, value: Value, at_least: builtins.int, what: str) -> None:
        """Check that `value` has at least `at_least` dimensions.

        Raises:
            UnsupportedModelError: If it has fewer.
        """
        if value.rank < at_least:
            raise self.fail(f"{what} needs rank {at_least} or more, not {value.rank}")

    def known_number(self, node: onnx.NodeProto, index: int, what: str) -> builtins.float:
        """Required input `index` as one number known at import time.

        Raises:
            UnsupportedModelError: If it is absent, only known at run time, or does not hold
                exactly one number.
        """
        value = self.optional_number(node, index, what)
        if value is None:
            raise self.fail(f"input {index} ({what}) is required")
        return value

    def optional_number(self, node: onnx.NodeProto, index: int, what: str) -> builtins.float | None:
        """Input `index` as one number known at import time, or None if absent.

        Raises:
            UnsupportedModelError: If it is only known at run time, or does not hold exactly
                one number.
        """
        array = self.known_input(node, index, what)
        if array is None:
            return None
        if array.size != 1:
            raise self.fail(f"input {index} ({what}) must hold one value, not {array.size}")
        if array.dtype.kind == "c":
            raise self.fail(f"input {index} ({what}) is complex")
        return builtins.float(array.reshape(-1)[0])

    def known_int(self, node: onnx.NodeProto, index: int, what: str) -> builtins.int:
        """Required input `index` as one integer known at import time.

        Raises:
            UnsupportedModelError: As `known_number`, or if it is not a finite number.
        """
        value = self.optional_int(node, index, what)
        if value is None:
            raise self.fail(f"input {index} ({what}) is required")
        return value

    def optional_int(self, node: onnx.NodeProto, index: int, what: str) -> builtins.int | None:
        """Input `index` as one integer known at import time, or None if absent.

        Raises:
            UnsupportedModelError: As `optional_number`, or if it is not a finite number.
        """
        array = self.known_input(node, index, what)
        if array is None:
            return None
        if array.dtype.kind in "iub":
            if array.size != 1:
                raise self.fail(f"input {index} ({what}) must hold one value, not {array.size}")
            return builtins.int(array.reshape(-1)[0])
        value = self.optional_number(node, index, what)
        assert value is not None
        if not math.isfinite(value):
            raise self.fail(f"input {index} ({what}) is {value}, not an integer")
        return builtins.int(value)

    def known_ints(self, node: onnx.NodeProto, index: int, what: str) -> list[builtins.int] | None:
        """Input `index`, an integer tensor known at import time, flattened; None if absent.

        Raises:
            UnsupportedModelError: If it is only known at run time, depends on a symbolic size,
                or is not of an integer type.
        """
        known = self._integer_input(node, index, what)
        if known is None:
            return None
        if known.is_symbolic:
            raise self.fail(
                f"input {index} ({what}) depends on symbolic sizes; fix them when loading "
                "(dims=...)"
            )
        return [builtins.int(v) for v in known.concrete().reshape(-1)]

    def symbolic_ints(self, node: onnx.NodeProto, index: int, what: str) -> list[Dim] | None:
        """Input `index`, an integer tensor known at import time, flattened; None if absent.

        Its entries are integers or symbolic sizes.

        Raises:
            UnsupportedModelError: If it is only known at run time or not of an integer type.
        """
        known = self._integer_input(node, index, what)
        if known is None:
            return None
        return [v if isinstance(v, Sym) else builtins.int(v) for v in known.array.reshape(-1)]

    def _integer_input(self, node: onnx.NodeProto, index: int, what: str) -> Known | None:
        # Shapes, axes, pads, sizes and steps are int32 or int64 in every ONNX schema; read as
        # integers, floats would need rounding and NaN has no integer at all.
        known = self.symbolic_input(node, index, what)
        if known is not None and not known.dtype.is_int:
            raise self.fail(f"input {index} ({what}) must hold integers, not {known.dtype.short}")
        return known

    def symbolic_input(self, node: onnx.NodeProto, index: int, what: str) -> Known | None:
        """Input `index` as a known value that may hold symbolic sizes, or None if absent."""
        if index >= len(node.input) or not node.input[index]:
            return None
        found = self.lookup(node.input[index])
        if isinstance(found, Value):
            raise self.needs_known(node.input[index], f"input {index} ({what})")
        return found

    def _input_names(self, node: onnx.NodeProto, count: int | tuple[int, int | None]) -> list[str]:
        low, high = (count, count) if isinstance(count, int) else count
        names = list(node.input)
        while names and not names[-1]:
            names.pop()
        if len(names) < low or (high is not None and len(names) > high):
            expected = str(low) if low == high else f"{low} to {high or 'any'}"
            raise self.fail(f"takes {expected} inputs, got {len(names)}")
        return names + [""] * ((high or len(names)) - len(names))
