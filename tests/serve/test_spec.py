"""What a served model takes: read off sessions, checked per request with clear errors."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

import knopt
from knopt.errors import InputError
from knopt.serve.spec import ModelSpec
from tests.models import MODELS
from tests.test_session import _same_padded_conv


def test_spec_of_a_symbolic_session() -> None:
    spec = ModelSpec.of(knopt.compile(MODELS / "bert_ts14.onnx"))
    assert spec.input_names == ["input_ids", "attention_mask"]
    assert spec.inputs[0].shape == ("batch", "seq")
    assert spec.inputs[0].dtype == np.int64
    assert spec.batch == "batch"
    assert spec.sizes() == ["batch", "seq"]
    assert ModelSpec.from_json(spec.to_json()) == spec


def test_spec_of_a_session_that_imports_per_size() -> None:
    spec = ModelSpec.of(knopt.compile(_same_padded_conv().SerializeToString()))
    assert [s.shape for s in spec.inputs] == [("n", 2, "h", "w"), ("n", 2)]
    assert spec.batch is None  # the output's shape is not declared


def test_static_model_has_no_batch_axis() -> None:
    spec = ModelSpec.of(knopt.compile(knopt.load(MODELS / "mlp_ts14.onnx", {"batch": 2})))
    assert spec.batch is None
    assert spec.rows({"input": np.ones((2, 16), np.float32)}) == 1


def test_check_accepts_good_inputs_and_names_what_is_wrong() -> None:
    spec = ModelSpec.of(knopt.compile(MODELS / "bert_ts14.onnx"))
    ids = np.ones((2, 5), np.int64)
    checked = spec.check({"input_ids": ids, "attention_mask": ids})
    assert spec.rows(checked) == 2
    assert spec.signature(checked) == ((5,), (5,))
    cases: dict[str, dict[str, Any]] = {
        "missing input(s) ['attention_mask']": {"input_ids": ids},
        "unknown input(s) ['mask']": {"input_ids": ids, "attention_mask": ids, "mask": ids},
        "input 'input_ids' is int32, expected int64": {
            "input_ids": ids.astype(np.int32),
            "attention_mask": ids,
        },
        "expected rank 2": {"input_ids": ids[0], "attention_mask": ids},
        "size 'seq' is 4 here but 5 in input 'input_ids'": {
            "input_ids": ids,
            "attention_mask": ids[:, :4],
        },
        "batch axis ('batch') of the inputs is empty": {
            "input_ids": ids[:0],
            "attention_mask": ids[:0],
        },
    }
    for message, feeds in cases.items():
        with pytest.raises(InputError, match=re.escape(message)):
            spec.check(feeds)


def test_select_outputs() -> None:
    spec = ModelSpec.of(knopt.compile(MODELS / "mlp_ts14.onnx"))
    assert spec.select(None) == ["logits"]
    with pytest.raises(InputError, match=r"unknown output\(s\) \['probs'\]"):
        spec.select(["probs"])
