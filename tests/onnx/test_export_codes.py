"""Float weights read back as the 8-bit codes a quantizer made them from."""

from __future__ import annotations

import numpy as np
import pytest

from knopt.onnx.export_codes import quantized_weights


@pytest.mark.parametrize("layout", ["tensor", "channel", "uint8"])
def test_weights_that_are_multiples_of_a_scale_are_their_codes(
    rng: np.random.Generator, layout: str
) -> None:
    codes = rng.integers(-127, 128, (6, 4, 3)).astype(np.float32)
    scale: np.ndarray = np.array(0.0123, np.float32)
    if layout == "channel":
        scale = rng.uniform(0.001, 0.1, (6, 1, 1)).astype(np.float32)
    if layout == "uint8":  # asymmetric weights: codes less a zero point, beyond int8's range
        codes = rng.integers(0, 256, (6, 4, 3)).astype(np.float32) - 200
    # As the optimizer leaves them: dequantized, then scaled by 1 / (the output's scale).
    weights = (codes * scale).astype(np.float32) * np.float32(1 / 0.0371)
    found = quantized_weights(weights, axis=0)
    assert found is not None
    assert found.codes.dtype == (np.uint8 if layout == "uint8" else np.int8)
    assert (found.axis is None) == (layout != "channel")
    shape = (-1, 1, 1) if found.axis == 0 else ()
    zero = found.zero.astype(np.float64).reshape(shape)
    dequantized = (found.codes - zero) * found.scale.reshape(shape)
    np.testing.assert_allclose(dequantized, weights, rtol=1e-6, atol=1e-7 * np.abs(weights).max())


def test_float_weights_are_not_codes(rng: np.random.Generator) -> None:
    assert quantized_weights(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), 0) is None


def test_a_few_float_values_are_not_codes(rng: np.random.Generator) -> None:
    """Four values come within a tenth of a code of some scale's multiples often; not 1e-3."""
    vectors = rng.uniform(-1, 1, (50, 4)).astype(np.float32)
    assert all(quantized_weights(v, axis=None) is None for v in vectors)
