"""`knopt.compile(..., device="cuda")`: numpy and GPU-array feeds, results on the host or GPU."""

from __future__ import annotations

import numpy as np
import pytest

import knopt
from knopt.errors import InputError
from tests.models import fixtures

pytestmark = pytest.mark.cuda


def _fixture(name: str):
    return next(f for f in fixtures() if f.file == name)


def test_session_runs_numpy_feeds_like_cpu() -> None:
    fixture = _fixture("resnet_ts14.onnx")
    feeds = fixture.feeds()
    (expected,) = knopt.compile(fixture.path).run(None, feeds)
    session = knopt.compile(fixture.path, device="cuda")
    assert session.device == "cuda"
    for _ in range(3):  # eager, then graph replays
        (actual,) = session.run(None, feeds)
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)
    other = fixture.feeds(seed=1)
    other["input"] = other["input"][:1]  # a new batch size binds and compiles again
    (small,) = session.run(None, other)
    (small_cpu,) = knopt.compile(fixture.path).run(None, other)
    np.testing.assert_allclose(small, small_cpu, rtol=1e-4, atol=1e-5)


def test_session_takes_torch_tensors_and_returns_device_arrays() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    fixture = _fixture("bert_dynamo18.onnx")
    feeds = fixture.feeds()
    (expected,) = knopt.compile(fixture.path).run(None, feeds)[:1]
    session = knopt.compile(fixture.path, device="best")
    gpu_feeds = {k: torch.from_numpy(v).cuda() for k, v in feeds.items()}
    for _ in range(2):
        results = session.run(None, gpu_feeds, device_outputs=True)
        tensor = torch.as_tensor(results[0], device="cuda")
        np.testing.assert_allclose(tensor.cpu().numpy(), expected, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(results[0].numpy(), expected, rtol=1e-4, atol=1e-5)
    with pytest.raises(InputError):
        session.run(None, {k: v.float() for k, v in gpu_feeds.items()})
