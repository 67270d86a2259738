"""Cast import: float8 targets saturate (or not) as the ONNX reference does."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from tests.onnx.ops.node_models import assert_matches, node_model


@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("to", [TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2])
def test_cast_to_float8_saturates_out_of_range_values_when_asked(saturate: int, to: int) -> None:
    x = np.array([0.3, -1.7, 1e6, -1e6, np.inf, -np.inf, np.nan, 1e-7], np.float32)
    model = node_model("Cast", {"x": x}, ["y"], opset=19, to=to, saturate=saturate)
    assert_matches(model, {"x": x}, oracle="reference", rtol=0, atol=0)


def test_float_modulo_follows_the_divisor_sign(rng: np.random.Generator) -> None:
    a = rng.uniform(-5, 5, 8).astype(np.float32)
    b = rng.choice([-2.5, 1.5], 8).astype(np.float32)
    model = node_model("Mod", {"a": a, "b": b}, ["y"], opset=13, fmod=0)
    assert_matches(model, {"a": a, "b": b}, oracle="reference", rtol=1e-6, atol=1e-6)
