"""Batching: requests stacked along the batch axis, padded to compiled sizes, split back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import pytest

import knopt
from knopt.errors import InputError, KnoptError
from knopt.serve.batching import Batcher, pack, padded_size
from knopt.serve.spec import ModelSpec, TensorSpec
from tests.models import MODELS


def test_pack_keeps_order_and_bounds_rows() -> None:
    assert pack([1, 2, 3, 4, 1], 4) == [[0, 1], [2], [3], [4]]
    assert pack([1, 1, 1, 1, 1], 4) == [[0, 1, 2, 3], [4]]
    assert pack([9, 1], 4) == [[0], [1]]  # larger than a batch: alone
    assert pack([], 4) == []


def test_padded_size_reuses_compiled_sizes() -> None:
    assert padded_size(3, set(), 32) == 4  # nothing compiled: next power of two
    assert padded_size(3, {8}, 32) == 8  # a compiled size fits: no new compile
    assert padded_size(3, {2, 8, 16}, 32) == 8  # the smallest that fits
    assert padded_size(9, {8}, 32) == 16
    assert padded_size(20, set(), 24) == 24  # never above the largest batch
    assert padded_size(24, {32}, 24) == 24
    assert padded_size(40, {32}, 24) == 40  # a request over the limit runs at its own size


def test_stacked_requests_answer_like_separate_runs(rng: np.random.Generator) -> None:
    session = knopt.compile(MODELS / "mlp_ts14.onnx")
    batcher = Batcher(session, ModelSpec.of(session), max_batch_size=8)
    requests = [
        {"input": rng.standard_normal((rows, 16)).astype(np.float32)} for rows in (1, 3, 2, 5, 1)
    ]
    answers = batcher.run(requests)
    for feeds, answer in zip(requests, answers, strict=True):
        assert not isinstance(answer, KnoptError)
        (expected,) = session.run(None, feeds)
        np.testing.assert_allclose(answer["logits"], expected, rtol=1e-5, atol=1e-6)
    # 1+3+2 rows, then 5+1: two runs, padded to 8 (compiled by the first) both times.
    assert (batcher.stats.runs, batcher.stats.largest) == (2, 3)
    assert batcher.stats.sizes == {8: 2}
    assert (batcher.stats.rows, batcher.stats.padded_rows) == (12, 4)


def test_burst_of_odd_sizes_compiles_few_sizes(rng: np.random.Generator) -> None:
    session = knopt.compile(MODELS / "mlp_ts14.onnx")
    batcher = Batcher(session, ModelSpec.of(session), max_batch_size=16)
    for rows in (3, 5, 7, 9, 11, 13, 15, 6, 2, 1):
        batcher.run([{"input": rng.standard_normal((rows, 16)).astype(np.float32)}])
    (sizes,) = batcher.compiled.values()
    assert sizes == {4, 8, 16}


class _Session:
    """A stand-in session that doubles its input and refuses rows holding NaN."""

    output_names: ClassVar[list[str]] = ["y"]

    def run(self, names: object, feeds: Mapping[str, np.ndarray]) -> list[Any]:
        x = feeds["x"]
        if np.isnan(x).any():
            raise InputError("input 'x' holds NaN")
        if np.isinf(x).any():
            raise IndexError("index 850 is out of bounds for axis 0 with size 100")
        return [2 * x]


def _spec(batch: str | None = "n", width: int | str = 2) -> ModelSpec:
    first = batch if batch is not None else 4
    return ModelSpec(
        (TensorSpec("x", np.dtype(np.float32), (first, width)),),
        (TensorSpec("y", np.dtype(np.float32), (first, width)),),
        batch,
    )


def test_failing_run_is_retried_per_request_so_only_the_culprit_fails() -> None:
    batcher = Batcher(_Session(), _spec(), max_batch_size=8)  # type: ignore[arg-type]
    good = np.ones((2, 2), np.float32)
    bad = np.full((1, 2), np.nan, np.float32)
    answers = batcher.run([{"x": good}, {"x": bad}, {"x": 3 * good}])
    assert isinstance(answers[1], InputError)
    np.testing.assert_array_equal(answers[0]["y"], 2 * good)  # type: ignore[index]
    np.testing.assert_array_equal(answers[2]["y"], 6 * good)  # type: ignore[index]


def test_other_errors_of_a_run_are_the_culprits_too() -> None:
    batcher = Batcher(_Session(), _spec(), max_batch_size=8)  # type: ignore[arg-type]
    good = np.ones((1, 2), np.float32)
    answers = batcher.run([{"x": good}, {"x": np.full((1, 2), np.inf, np.float32)}])
    assert isinstance(answers[1], KnoptError)
    assert "IndexError: index 850 is out of bounds" in str(answers[1])
    np.testing.assert_array_equal(answers[0]["y"], 2 * good)  # type: ignore[index]


def test_requests_of_other_inner_sizes_run_apart() -> None:
    batcher = Batcher(_Session(), _spec(width="w"), max_batch_size=8)  # type: ignore[arg-type]
    narrow, wide = np.ones((1, 2), np.float32), np.ones((1, 3), np.float32)
    answers = batcher.run([{"x": narrow}, {"x": wide}, {"x": narrow}])
    assert [a["y"].shape for a in answers] == [(1, 2), (1, 3), (1, 2)]  # type: ignore[index]
    assert batcher.stats.runs == 2


def test_model_without_batch_axis_runs_each_request_alone() -> None:
    batcher = Batcher(_Session(), _spec(batch=None), max_batch_size=8)  # type: ignore[arg-type]
    x = np.ones((4, 2), np.float32)
    answers = batcher.run([{"x": x}, {"x": x}])
    assert batcher.stats.runs == 2 and batcher.max_batch_size == 1
    assert all(a["y"].shape == (4, 2) for a in answers)  # type: ignore[index]


def test_max_batch_size_must_be_positive() -> None:
    with pytest.raises(KnoptError, match="at least 1"):
        Batcher(_Session(), _spec(), max_batch_size=0)  # type: ignore[arg-type]
