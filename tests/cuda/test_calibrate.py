"""`knopt calibrate --device cuda`: the profile measured through the GPU backend."""

from __future__ import annotations

import math

import pytest

from knopt.calibrate import calibrate

pytestmark = pytest.mark.cuda


def test_gpu_profile_is_measured_and_plausible() -> None:
    measured = calibrate("cuda", quick=True)
    profile = measured.profile
    # Any CUDA GPU of the last decade: 0.1-10 TB/s, and half-precision tensor cores (the
    # MatMul runs through cuBLASLt) well above strict f32.
    assert 1e11 < profile.bandwidth < 1e13
    assert 1e11 < profile.peak["f32"] < 1e15
    assert profile.peak["f16"] > profile.peak["f32"]
    assert 1e-8 < profile.launch < 1e-4
    assert all(math.isfinite(v) and v > 0 for v in profile.peak.values())
    assert not profile.per_op_launch
    # Every peak is fitted to library kernels: GEMMs at several shapes, and convolutions.
    kinds = [s.kind for s in measured.samples]
    assert kinds.count("f32") >= 5 and kinds.count("f16") >= 5 and "f64" in kinds
    assert any(s.what.startswith("2 convs f16") for s in measured.samples)
