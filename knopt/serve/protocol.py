"""The HTTP bodies of a served model: JSON or .npz in, the same format out.

JSON request (`Content-Type: application/json`):

    {
      "inputs": {
        "input_ids": {"dtype": "int64", "shape": [2, 12], "data": [101, 2023, ...]},
        "attention_mask": [[1, 1, 1, ...], [1, 1, 0, ...]]
      },
      "outputs": ["last_hidden_state"],
      "id": "request-42"
    }

Each input is either an object with its dtype (the model's), shape and row-major flat data, or
nested lists, which are converted to the model's dtype. `outputs` (default: all) and `id` (a
request id, also accepted as the `X-Request-Id` header) are optional. The answer is
`{"id": ..., "outputs": {name: {"dtype", "shape", "data"}}}`; floats that are not finite are
written as NaN, Infinity and -Infinity, as Python's json module reads them.

.npz request (`Content-Type: application/x-npz` or `application/octet-stream`): an `np.savez`
file with one array per input, named after it; `?outputs=a,b` and `?id=...` go in the query
string. The answer is an .npz file of the outputs.

Errors are JSON in both cases: `{"error": message}` with a 4xx status for a bad request.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from knopt.errors import InputError
from knopt.serve.spec import ModelSpec

JSON = "application/json"
NPZ = "application/x-npz"
NPZ_TYPES = (NPZ, "application/octet-stream")


class UnsupportedMediaError(InputError):
    """A request body of a content type the server does not read (HTTP 415)."""


@dataclass
class DecodedRequest:
    """One inference request as the server reads it.

    Attributes:
        feeds: The input arrays by name (dtypes and shapes not yet checked against the model).
        outputs: The outputs asked for, or None for all.
        request_id: The client's id for the request, if it gave one.
        media_type: `JSON` or `NPZ`: how to write the answer.
    """

    feeds: dict[str, np.ndarray]
    outputs: list[str] | None
    request_id: str | None
    media_type: str


def decode_request(
    body: bytes, content_type: str, query: Mapping[str, str], spec: ModelSpec
) -> DecodedRequest:
    """Read a request body.

    Raises:
        UnsupportedMediaError: If the content type is neither JSON nor .npz.
        InputError: If the body does not follow the format, naming what is wrong.
    """
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type == JSON:
        return _decode_json(body, spec)
    if media_type in NPZ_TYPES:
        outputs = query.get("outputs")
        return DecodedRequest(
            _decode_npz(body),
            [name for name in outputs.split(",") if name] if outputs else None,
            query.get("id"),
            NPZ,
        )
    raise UnsupportedMediaError(
        f"content type '{content_type}' is not read: send {JSON} or {NPZ} (see GET / for the "
        "model's inputs)"
    )


def encode_response(
    outputs: Mapping[str, np.ndarray], media_type: str, request_id: str | None
) -> bytes:
    """The answer body for `outputs`, as JSON or as an .npz file."""
    if media_type == NPZ:
        buffer = io.BytesIO()
        arrays: dict[str, Any] = dict(outputs)
        np.savez(buffer, **arrays)
        return buffer.getvalue()
    encoded = {name: encode_array(array) for name, array in outputs.items()}
    return json.dumps({"id": request_id, "outputs": encoded}).encode()


def encode_array(array: np.ndarray) -> dict[str, Any]:
    """An array as `{"dtype", "shape", "data"}` with row-major flat data."""
    data = array.reshape(-1)
    # Narrow floats (bfloat16, float16) have no JSON numbers of their own: widen them.
    values = data.astype(np.float64) if data.dtype.kind == "V" or data.dtype == np.float16 else data
    return {"dtype": array.dtype.name, "shape": list(array.shape), "data": values.tolist()}


def _decode_json(body: bytes, spec: ModelSpec) -> DecodedRequest:
    try:
        document = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InputError(f"the body is not JSON ({err})") from err
    if not isinstance(document, dict) or not isinstance(document.get("inputs"), dict):
        raise InputError('the JSON body must be an object with "inputs": {name: value, ...}')
    outputs = document.get("outputs")
    if outputs is not None and (
        not isinstance(outputs, list) or not all(isinstance(o, str) for o in outputs)
    ):
        raise InputError('"outputs" must be a list of output names')
    request_id = document.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InputError('"id" must be a string')
    feeds = {name: _decode_input(name, value, spec) for name, value in document["inputs"].items()}
    return DecodedRequest(feeds, outputs, request_id, JSON)


def _decode_input(name: str, value: Any, spec: ModelSpec) -> np.ndarray:
    dtype = spec.input(name).dtype
    if isinstance(value, dict):
        return _decode_typed(name, value, dtype)
    try:
        array = np.asarray(value)
    except ValueError as err:  # ragged nested lists
        raise InputError(f"input '{name}': nested lists of unequal lengths ({err})") from err
    if array.dtype.kind not in "biuf" and array.size:
        raise InputError(f"input '{name}': expected numbers, got {array.dtype} values")
    if dtype.kind in "biu" and array.dtype.kind == "f":
        raise InputError(f"input '{name}' is {dtype}: send integers, not decimals")
    return array.astype(dtype)


def _decode_typed(name: str, value: Mapping[str, Any], dtype: np.dtype) -> np.ndarray:
    if set(value) != {"dtype", "shape", "data"}:
        raise InputError(
            f'input \'{name}\': expected {{"dtype", "shape", "data"}}, got keys {sorted(value)}'
        )
    if value["dtype"] != dtype.name:
        raise InputError(f"input '{name}' is {dtype.name}, not {value['dtype']}")
    shape = value["shape"]
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise InputError(f"input '{name}': shape must be a list of sizes, not {shape!r}")
    data = value["data"]
    if not isinstance(data, list):
        raise InputError(f"input '{name}': data must be a flat list of numbers")
    try:
        array = np.asarray(data, dtype=dtype if dtype.kind != "V" else np.float64)
    except (TypeError, ValueError, OverflowError) as err:
        raise InputError(f"input '{name}': data is not a flat list of numbers ({err})") from err
    if array.ndim != 1 or array.size != int(np.prod(shape)):
        raise InputError(
            f"input '{name}': {array.size} values do not fill shape {shape} "
            f"({int(np.prod(shape))} values)"
        )
    return array.astype(dtype).reshape(shape)


def _decode_npz(body: bytes) -> dict[str, np.ndarray]:
    try:
        archive = np.load(io.BytesIO(body), allow_pickle=False)
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise InputError("the body holds one array, not named ones; write it with np.savez")
        with archive:
            return {name: archive[name] for name in archive.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise InputError(
            f"the body is not an .npz file of arrays ({err}); write it with np.savez"
        ) from err
