"""HTTP bodies: JSON (typed or nested lists) and .npz in, the same format out."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from knopt.errors import InputError
from knopt.serve.protocol import (
    JSON,
    NPZ,
    UnsupportedMediaError,
    decode_request,
    encode_response,
)
from knopt.serve.spec import ModelSpec, TensorSpec

SPEC = ModelSpec(
    (
        TensorSpec("ids", np.dtype(np.int64), ("batch", "seq")),
        TensorSpec("x", np.dtype(np.float32), ("batch", 3)),
    ),
    (TensorSpec("y", np.dtype(np.float32), ("batch", 3)),),
    "batch",
)


def _json(document: object) -> bytes:
    return json.dumps(document).encode()


def test_typed_and_nested_json_inputs() -> None:
    body = _json(
        {
            "inputs": {
                "ids": {"dtype": "int64", "shape": [2, 2], "data": [1, 2, 3, 4]},
                "x": [[1, 2.5, 3], [4, 5, 6]],
            },
            "outputs": ["y"],
            "id": "r1",
        }
    )
    request = decode_request(body, "application/json; charset=utf-8", {}, SPEC)
    np.testing.assert_array_equal(request.feeds["ids"], [[1, 2], [3, 4]])
    assert request.feeds["ids"].dtype == np.int64
    assert request.feeds["x"].dtype == np.float32
    assert (request.outputs, request.request_id, request.media_type) == (["y"], "r1", JSON)


def test_npz_inputs_with_options_in_the_query() -> None:
    buffer = io.BytesIO()
    np.savez(buffer, x=np.ones((1, 3), np.float32))
    request = decode_request(buffer.getvalue(), NPZ, {"outputs": "y", "id": "r2"}, SPEC)
    assert request.feeds["x"].shape == (1, 3)
    assert (request.outputs, request.request_id, request.media_type) == (["y"], "r2", NPZ)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{", "not JSON"),
        (_json([1, 2]), '"inputs"'),
        (_json({"inputs": {"z": [1]}}), "unknown input 'z'"),
        (_json({"inputs": {"ids": [1.5]}}), "send integers"),
        (_json({"inputs": {"x": [[1, 2], [3]]}}), "unequal lengths"),
        (_json({"inputs": {"x": [["a"]]}}), "expected numbers"),
        (_json({"inputs": {"x": {"dtype": "float64", "shape": [1], "data": [1]}}}), "not float64"),
        (_json({"inputs": {"x": {"dtype": "float32", "shape": [2], "data": [1]}}}), "do not fill"),
        (_json({"inputs": {"x": {"dtype": "float32", "shape": [-1], "data": []}}}), "list of"),
        (_json({"inputs": {"x": {"dtype": "float32", "shape": [1]}}}), "got keys"),
        (_json({"inputs": {}, "outputs": "y"}), '"outputs"'),
        (_json({"inputs": {}, "id": 7}), '"id"'),
    ],
)
def test_bad_json_bodies_name_the_problem(body: bytes, message: str) -> None:
    with pytest.raises(InputError, match=message):
        decode_request(body, JSON, {}, SPEC)


def test_bad_npz_bodies_and_media_types() -> None:
    with pytest.raises(InputError, match=r"not an \.npz file"):
        decode_request(b"PK\x03\x04 truncated", NPZ, {}, SPEC)
    single = io.BytesIO()
    np.save(single, np.ones(3))
    with pytest.raises(InputError, match="one array, not named ones"):
        decode_request(single.getvalue(), NPZ, {}, SPEC)
    pickled = io.BytesIO()
    np.savez(pickled, x=np.array([{"a": 1}], dtype=object))
    with pytest.raises(InputError, match="pickle"):
        decode_request(pickled.getvalue(), NPZ, {}, SPEC)
    with pytest.raises(UnsupportedMediaError, match="text/plain"):
        decode_request(b"", "text/plain", {}, SPEC)


def test_responses_round_trip() -> None:
    y = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
    answer = json.loads(encode_response({"y": y}, JSON, "r3"))
    assert answer["id"] == "r3"
    got = answer["outputs"]["y"]
    assert (got["dtype"], got["shape"]) == ("float32", [2, 3])
    np.testing.assert_array_equal(np.array(got["data"], np.float32).reshape(2, 3), y)
    with np.load(io.BytesIO(encode_response({"y": y}, NPZ, None)), allow_pickle=False) as archive:
        np.testing.assert_array_equal(archive["y"], y)
