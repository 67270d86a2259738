"""rules/fusion.egg's caps on fused bodies, as benchmarks/fusion_caps.py varies them."""

from __future__ import annotations

import pytest

from benchmarks.fusion_caps import caps, chain, fusion_rules, optimize_row


def test_the_benchmark_finds_every_cap_guard() -> None:
    (fusion,) = [f for f in fusion_rules(5, 3) if f.name == "fusion.egg"]
    assert " 12)" not in fusion.text
    assert "(< (body-size ep) 3)" in fusion.text


@pytest.mark.parametrize(("body", "kernels"), [(16, 1), (12, 2), (4, 4)])
def test_a_chain_longer_than_the_body_cap_is_cut(body: int, kernels: int) -> None:
    row, _ = optimize_row(chain(length=16, elements=64), body, 8)
    assert row["kernels"] == kernels
    assert row["longest body"] <= body


def test_the_caps_are_restored_after_the_benchmark_varies_them() -> None:
    with caps(4, 2):
        pass
    assert optimize_row(chain(length=16, elements=64), 12, 8)[0]["kernels"] == 2
