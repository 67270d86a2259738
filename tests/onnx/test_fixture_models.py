"""Every committed real-model fixture loads, runs on the CPU executor and matches onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import knopt
from tests.models import Fixture, fixtures


@pytest.mark.parametrize("fixture", fixtures(), ids=lambda f: f.file)
def test_fixture_matches_onnxruntime(fixture: Fixture) -> None:
    feeds = fixture.feeds()
    session = knopt.compile(fixture.path)
    ours = session.run(None, feeds)
    reference = ort.InferenceSession(str(fixture.path), providers=["CPUExecutionProvider"])
    theirs = reference.run(None, feeds)
    assert len(ours) == len(theirs)
    for mine, expected in zip(ours, theirs, strict=True):
        assert mine.shape == expected.shape
        assert mine.dtype == expected.dtype
        np.testing.assert_allclose(mine, expected, rtol=1e-4, atol=1e-5)
