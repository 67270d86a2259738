"""Einsum import: contractions, diagonals, sums and broadcasting agree with onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from tests.onnx.ops.node_models import assert_matches, node_model

CASES = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 8), (2, 3, 6, 8)]),
    ("ij->ji", [(3, 4)]),
    ("ii->i", [(4, 4)]),
    ("ii", [(4, 4)]),
    ("ij->", [(3, 4)]),
    ("i,i", [(5,), (5,)]),
    ("i,j->ij", [(3,), (4,)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (2, 5, 4, 2)]),
    ("bii->bi", [(2, 3, 3)]),
    ("ijk,ikl,jl->ij", [(2, 3, 4), (2, 4, 5), (3, 5)]),
    ("abc,cd", [(2, 3, 4), (4, 5)]),
]


@pytest.mark.parametrize(("equation", "shapes"), CASES, ids=[c[0] for c in CASES])
def test_einsum_matches_onnxruntime(
    rng: np.random.Generator, equation: str, shapes: list[tuple[int, ...]]
) -> None:
    feeds = {f"x{i}": rng.uniform(-2, 2, s).astype(np.float32) for i, s in enumerate(shapes)}
    model = node_model("Einsum", feeds, ["y"], opset=12, equation=equation)
    assert_matches(model, feeds, rtol=1e-5, atol=1e-5)


def test_integer_einsum_is_exact(rng: np.random.Generator) -> None:
    feeds = {
        "a": rng.integers(-5, 6, (3, 4)).astype(np.int64),
        "b": rng.integers(-5, 6, (4, 2)).astype(np.int64),
    }
    model = node_model("Einsum", feeds, ["y"], opset=12, equation="ij,jk->ik")
    assert_matches(model, feeds, rtol=0, atol=0)
