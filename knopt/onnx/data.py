"""The data of a parsed ONNX model: external data read safely, and tensors read as arrays.

A model holds tensors in many places: initializers of the graph and of its subgraphs, sparse
initializers, `Constant` values and other TENSOR, TENSORS and SPARSE_TENSOR attributes, the
bodies and attribute defaults of model-local functions, training graphs. One walk over every
message of the model finds them all, so that none is left for onnx to read later relative to
the working directory. The same walk checks that every text field is UTF-8.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from onnx import numpy_helper

from knopt.errors import InvalidModelError
from knopt.ir.dtype import DType
from knopt.ir.memory import check_bytes, check_shape


def prepare_data(model: onnx.ModelProto, where: str, folder: Path | None) -> None:
    """Check every text field and read every tensor's external data into the model.

    Args:
        model: The parsed model; tensors with external data get it as `raw_data`.
        where: Names the model in messages (its path, or "the given bytes").
        folder: The model's folder, where external data must lie; None when the model came
            as bytes, which then may not have external data at all.

    Raises:
        InvalidModelError: If a text field is not UTF-8, or external data is outside the
            folder, missing, truncated or described by bad offsets.
        MemoryLimitError: If external data is larger than the memory budget.
    """
    for path, message in _messages(model):
        _check_text(message, path, where)
        if (
            isinstance(message, onnx.TensorProto)
            and message.data_location == onnx.TensorProto.EXTERNAL
        ):
            _read_external(message, f"{where}: tensor '{message.name}'", folder)


def tensor_array(tensor: onnx.TensorProto, where: str) -> np.ndarray:
    """The value of a tensor as an array of its knopt dtype, checked before anything is made.

    Raises:
        UnsupportedModelError: If its element type is not supported.
        InvalidModelError: If its data lies in an external file that was not read (load the
            model with `load_model`), or does not fill its shape.
        MemoryLimitError: If its shape is larger than the memory budget.
    """
    dtype = DType.from_onnx(tensor.data_type, where)
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        raise InvalidModelError(
            f"{where}: keeps its data in an external file that was not read; load the model "
            "with knopt.load or knopt.onnx.load_model from its file path"
        )
    dims = [int(d) for d in tensor.dims]
    if any(d < 0 for d in dims):
        raise InvalidModelError(f"{where}: declares a negative dimension {dims}")
    check_shape(dims, dtype.numpy.itemsize, where)
    try:
        array = numpy_helper.to_array(tensor)
    except (ValueError, TypeError, IndexError, OverflowError) as err:
        raise InvalidModelError(
            f"{where}: its data does not fill its shape {dims} ({err}); fix the tensor"
        ) from err
    return np.asarray(array, dtype.numpy)


def _messages(model: onnx.ModelProto) -> Iterator[tuple[str, Message]]:
    """Every message in the model with its field path, tensors included but not entered.

    Iterative: protobuf bounds how deep messages nest, but the walk need not rely on it.
    """
    stack: list[tuple[str, Message]] = [("model", model)]
    while stack:
        path, message = stack.pop()
        yield path, message
        if isinstance(message, onnx.TensorProto):
            continue  # its fields hold the data itself: listing them would copy it
        for field, value in message.ListFields():
            if field.type != FieldDescriptor.TYPE_MESSAGE:
                continue
            if isinstance(value, Message):
                stack.append((f"{path}.{field.name}", value))
            else:  # a repeated field
                stack.extend((f"{path}.{field.name}[{i}]", v) for i, v in enumerate(value))


def _check_text(message: Message, path: str, where: str) -> None:
    """Refuse text fields that are not UTF-8 (protobuf hands those over as bytes)."""
    if isinstance(message, onnx.TensorProto):
        fields = [("name", message.name), ("doc_string", message.doc_string)]
    else:
        fields = [
            (f.name, value)
            for f, value in message.ListFields()
            if f.type == FieldDescriptor.TYPE_STRING
        ]
    for name, value in fields:
        texts = (
            {name: value}
            if isinstance(value, (str, bytes))
            else {f"{name}[{i}]": v for i, v in enumerate(value)}
        )
        for field, text in texts.items():
            if isinstance(text, bytes):
                raise InvalidModelError(
                    f"{where}: {path}.{field} is not UTF-8 text; the file is corrupt or not ONNX"
                )


def _read_external(tensor: onnx.TensorProto, where: str, folder: Path | None) -> None:
    """Read a tensor's external data into `raw_data`, inside `folder` only."""
    info = {e.key: e.value for e in tensor.external_data}
    location = info.get("location", "")
    if folder is None:
        raise InvalidModelError(
            f"{where} keeps its data in '{location}'; load the model from its file path "
            "instead of bytes"
        )
    offset = _int_entry(info, "offset", 0, where)
    length = _int_entry(info, "length", -1, where)
    target = _inside(folder, location, where)
    try:
        available = max(target.stat().st_size - offset, 0)
        size = available if length < 0 else min(length, available)
        check_bytes(size, f"{where}: external data in '{location}'")
        with target.open("rb") as f:
            f.seek(min(offset, target.stat().st_size))
            raw = f.read(size)
    except OSError as err:
        raise InvalidModelError(
            f"{where}: cannot read external data from '{location}' ({err.strerror})"
        ) from err
    if length >= 0 and len(raw) != length:
        raise InvalidModelError(
            f"{where}: external data in '{location}' is truncated ({len(raw)} of {length} "
            f"bytes from offset {offset})"
        )
    tensor.raw_data = raw
    tensor.data_location = onnx.TensorProto.DEFAULT
    del tensor.external_data[:]


def _inside(folder: Path, location: str, where: str) -> Path:
    """The file `location` names, which must be a file inside `folder` (symlinks resolved)."""
    try:
        base = folder.resolve()
        target = (base / location).resolve()
        outside = not location or Path(location).is_absolute() or not target.is_relative_to(base)
        missing = not outside and not target.is_file()
    except (OSError, ValueError) as err:  # a NUL byte, a loop of symlinks, a name too long
        raise InvalidModelError(f"{where} reads external data from a bad path ({err})") from err
    if outside:
        raise InvalidModelError(
            f"{where} reads external data from '{location}', outside the model's folder; "
            "refusing to read it"
        )
    if missing:
        raise InvalidModelError(
            f"{where} needs external data file '{location}', which does not exist"
        )
    return target


def _int_entry(info: dict[str, str], key: str, default: int, where: str) -> int:
    text = info.get(key)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise InvalidModelError(
            f"{where}: external data {key} '{text}' is not a non-negative integer"
        )
    return value
