"""The ingress retries a request once, with the same id, when the model replica dies under it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from ray.exceptions import ActorDiedError

from knopt.errors import InputError
from knopt.serve.replica import Ingress, ReplicaLostError


class _Method:
    """A stand-in for `handle.infer`: each call takes the next scripted answer."""

    def __init__(self, answers: Sequence[Any]) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[Any, ...]] = []

    def remote(self, *args: Any) -> Any:
        self.calls.append(args)
        answer = self.answers.pop(0)

        async def respond() -> Any:
            if isinstance(answer, BaseException):
                raise answer
            return answer

        return respond()


class _Handle:
    def __init__(self, answers: Sequence[Any]) -> None:
        self.infer = _Method(answers)


def _run(handle: _Handle, request_id: str | None = None) -> Any:
    ingress = Ingress(handle)  # type: ignore[arg-type]
    return asyncio.run(ingress.run({"x": np.ones(2)}, None, request_id)), ingress


def test_lost_replica_is_retried_once_with_the_same_id() -> None:
    outputs = {"y": np.zeros(2)}
    handle = _Handle([ActorDiedError(), outputs])
    result, ingress = _run(handle, "request-1")
    assert result is outputs
    assert [call[0] for call in handle.infer.calls] == ["request-1", "request-1"]
    assert ingress.retries == 1


def test_requests_get_an_id_when_the_client_gives_none() -> None:
    handle = _Handle([ActorDiedError(), {"y": np.zeros(2)}])
    _run(handle)
    first, second = (call[0] for call in handle.infer.calls)
    assert first == second and len(first) == 32


def test_second_loss_is_reported_not_retried_again() -> None:
    handle = _Handle([ActorDiedError(), ActorDiedError(), {"y": np.zeros(2)}])
    with pytest.raises(ReplicaLostError, match="died under it twice"):
        _run(handle, "request-2")
    assert len(handle.infer.calls) == 2


def test_a_refused_request_is_raised_and_not_retried() -> None:
    handle = _Handle([InputError("input 'x' is float64, expected float32")])
    with pytest.raises(InputError, match="float64"):
        _run(handle)
    assert len(handle.infer.calls) == 1
