"""knopt/opt/cost.py: the roofline estimates extraction compares."""

from __future__ import annotations

import pytest

from knopt.opt.cost import CPU, H200, DeviceProfile


def test_int8_products_of_two_computed_operands_have_their_own_rate() -> None:
    # Only a constant weight reaches the GPU's int8 tensor cores (knopt/cuda/gen/imma.py).
    assert H200.int8_product_rate(varying_weight=True) < H200.peak["f32"]
    assert H200.int8_product_rate() == H200.peak["i8"]
    # The CPU multiplies every 8-bit product the same way (float64 BLAS).
    assert CPU.int8_product_rate(varying_weight=True) == CPU.int8_product_rate()


@pytest.mark.parametrize("varying", [False, True])
def test_int8_rates_fall_back_to_the_integer_rate(varying: bool) -> None:
    profile = DeviceProfile("plain", 1e9, {"f32": 1.0, "f16": 1.0, "f64": 1.0, "int": 7.0}, 1e-6)
    assert profile.int8_product_rate(varying_weight=varying) == 7.0
