"""DFT and STFT import: constant-matrix transforms agree with onnxruntime's FFT."""

from __future__ import annotations

import numpy as np
import pytest

from tests.onnx.ops.node_models import assert_matches, node_model


@pytest.mark.parametrize(
    ("parts", "inverse", "onesided"), [(1, 0, 0), (2, 0, 0), (1, 0, 1), (1, 1, 0), (2, 1, 0)]
)
@pytest.mark.parametrize("length", [None, 6, 10])
def test_dft_matches_onnxruntime(
    rng: np.random.Generator, parts: int, inverse: int, onesided: int, length: int | None
) -> None:
    x = rng.uniform(-1, 1, (2, 8, parts)).astype(np.float32)
    constants = {} if length is None else {"length": np.array(length, np.int64)}
    model = node_model(
        "DFT", {"x": x}, ["y"], opset=20, constants=constants, inverse=inverse, onesided=onesided
    )
    assert_matches(model, {"x": x}, rtol=1e-4, atol=1e-5)


def test_stft_with_a_window_matches_onnxruntime(rng: np.random.Generator) -> None:
    x = rng.uniform(-1, 1, (2, 32, 1)).astype(np.float32)
    constants: dict[str, np.ndarray] = {
        "step": np.array(4, np.int64),
        "window": np.hanning(8).astype(np.float32),
    }
    model = node_model("STFT", {"x": x}, ["y"], opset=17, constants=constants)
    assert_matches(model, {"x": x}, rtol=1e-4, atol=1e-5)
