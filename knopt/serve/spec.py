"""What a served model takes and gives: names, dtypes and shapes, and which axis is the batch.

`ModelSpec.of(session)` reads them off a session. `ModelSpec.check` turns one request's arrays
into exactly what the model takes, or raises `InputError` naming the input, so that a bad
request fails alone, before it joins a batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from knopt.errors import InputError
from knopt.ir.dtype import DType
from knopt.ir.graph import Value
from knopt.ir.shape import Sym
from knopt.session import PerSizeSession, Session

Dim = int | str | None  # a fixed size, a named size, or one computed from other sizes
_NUMPY_DTYPES = {dtype.numpy.name: dtype.numpy for dtype in DType}


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output."""

    name: str
    dtype: np.dtype
    shape: tuple[Dim, ...]

    def to_json(self) -> dict[str, Any]:
        """The spec as JSON: named sizes as strings, computed ones as null."""
        return {"name": self.name, "dtype": self.dtype.name, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TensorSpec:
        """The spec `to_json` wrote."""
        return cls(data["name"], _NUMPY_DTYPES[data["dtype"]], tuple(data["shape"]))


@dataclass(frozen=True)
class ModelSpec:
    """A model's inputs and outputs, and the size that every one of them has on axis 0.

    Attributes:
        batch: The named size on axis 0 of every input and output, along which requests can be
            stacked into one batch; None when the model has no such axis (each request then
            runs alone).
    """

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    batch: str | None

    @classmethod
    def of(cls, session: Session) -> ModelSpec:
        """The spec of a session's model."""
        if isinstance(session, PerSizeSession):
            initializers = {t.name for t in session.model.graph.initializer}
            inputs = tuple(
                _proto_spec(info)
                for info in session.model.graph.input
                if info.name not in initializers
            )
            outputs = tuple(_proto_spec(info) for info in session.model.graph.output)
        else:
            graph = session.graph
            inputs = tuple(
                _value_spec(name, v)
                for name, v in zip(graph.input_names, graph.inputs, strict=True)
            )
            outputs = tuple(
                _value_spec(name, v)
                for name, v in zip(graph.output_names, graph.outputs, strict=True)
            )
        return cls(inputs, outputs, _batch_axis(inputs, outputs))

    @property
    def input_names(self) -> list[str]:
        """The input names, in order."""
        return [spec.name for spec in self.inputs]

    @property
    def output_names(self) -> list[str]:
        """The output names, in order."""
        return [spec.name for spec in self.outputs]

    def sizes(self) -> list[str]:
        """The named sizes of the inputs, in order of first use."""
        names = [d for spec in self.inputs for d in spec.shape if isinstance(d, str)]
        return list(dict.fromkeys(names))

    def input(self, name: str) -> TensorSpec:
        """The input called `name`.

        Raises:
            InputError: If the model has no such input.
        """
        for spec in self.inputs:
            if spec.name == name:
                return spec
        raise InputError(f"unknown input '{name}'; the model takes {self.input_names}")

    def check(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """One request's inputs as arrays of the model's dtypes and shapes.

        Raises:
            InputError: If an input is missing or unknown, or of the wrong dtype or shape, or
                two inputs disagree on a named size, or the batch axis is empty.
        """
        unknown = sorted(set(feeds) - set(self.input_names))
        if unknown:
            raise InputError(f"unknown input(s) {unknown}; the model takes {self.input_names}")
        missing = [name for name in self.input_names if name not in feeds]
        if missing:
            raise InputError(f"missing input(s) {missing}; the model takes {self.input_names}")
        arrays = {spec.name: _check_array(spec, feeds[spec.name]) for spec in self.inputs}
        sizes: dict[str, tuple[int, str]] = {}
        for spec in self.inputs:
            for dim, size in zip(spec.shape, arrays[spec.name].shape, strict=True):
                if not isinstance(dim, str):
                    continue
                seen, where = sizes.setdefault(dim, (size, spec.name))
                if seen != size:
                    raise InputError(
                        f"input '{spec.name}': size '{dim}' is {size} here but {seen} in "
                        f"input '{where}'"
                    )
        if self.batch is not None and sizes[self.batch][0] == 0:
            raise InputError(f"the batch axis ('{self.batch}') of the inputs is empty")
        return arrays

    def select(self, outputs: Sequence[str] | None) -> list[str]:
        """The output names a request asks for (all of them for None).

        Raises:
            InputError: If a name is not an output of the model.
        """
        if outputs is None:
            return self.output_names
        unknown = [name for name in outputs if name not in self.output_names]
        if unknown:
            raise InputError(f"unknown output(s) {unknown}; the model has {self.output_names}")
        return list(outputs)

    def rows(self, feeds: Mapping[str, np.ndarray]) -> int:
        """The size of the batch axis of checked inputs (1 when the model has none)."""
        return int(feeds[self.inputs[0].name].shape[0]) if self.batch is not None else 1

    def signature(self, feeds: Mapping[str, np.ndarray]) -> tuple[tuple[int, ...], ...]:
        """What requests must share to be stacked: every input's shape past the batch axis."""
        skip = 1 if self.batch is not None else 0
        return tuple(tuple(feeds[spec.name].shape[skip:]) for spec in self.inputs)

    def to_json(self) -> dict[str, Any]:
        """The spec as JSON (what `GET /` answers)."""
        return {
            "inputs": [spec.to_json() for spec in self.inputs],
            "outputs": [spec.to_json() for spec in self.outputs],
            "batch_axis": self.batch,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelSpec:
        """The spec `to_json` wrote."""
        return cls(
            tuple(TensorSpec.from_json(spec) for spec in data["inputs"]),
            tuple(TensorSpec.from_json(spec) for spec in data["outputs"]),
            data["batch_axis"],
        )


def _check_array(spec: TensorSpec, value: Any) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype != spec.dtype:
        raise InputError(f"input '{spec.name}' is {array.dtype}, expected {spec.dtype}")
    if array.ndim != len(spec.shape):
        raise InputError(
            f"input '{spec.name}' has shape {list(array.shape)}, expected rank "
            f"{len(spec.shape)} ({_format(spec.shape)})"
        )
    for axis, (dim, size) in enumerate(zip(spec.shape, array.shape, strict=True)):
        if isinstance(dim, int) and dim != size:
            raise InputError(
                f"input '{spec.name}' has size {size} on axis {axis}, expected {dim} "
                f"(shape {_format(spec.shape)})"
            )
    return np.ascontiguousarray(array)


def _format(shape: Sequence[Dim]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _value_spec(name: str, value: Value) -> TensorSpec:
    shape = tuple(
        d if isinstance(d, int) else d.as_symbol() if isinstance(d, Sym) else None
        for d in value.shape
    )
    return TensorSpec(name, value.dtype.numpy, shape)


def _proto_spec(info: onnx.ValueInfoProto) -> TensorSpec:
    tensor = info.type.tensor_type
    dtype = DType.from_onnx(tensor.elem_type, f"value '{info.name}'").numpy
    if not tensor.HasField("shape"):
        return TensorSpec(info.name, dtype, ())
    shape = tuple(
        d.dim_value if d.HasField("dim_value") else d.dim_param or None for d in tensor.shape.dim
    )
    return TensorSpec(info.name, dtype, shape)


def _batch_axis(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> str | None:
    """The named size on axis 0 of every input and output, if there is one."""
    firsts = {spec.shape[0] if spec.shape else None for spec in (*inputs, *outputs)}
    if len(firsts) != 1 or not inputs:
        return None
    (first,) = firsts
    return first if isinstance(first, str) else None
