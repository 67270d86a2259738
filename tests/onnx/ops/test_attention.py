"""Attention import: masks, caches, grouped heads and softcaps agree with the ONNX reference."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.onnx.ops.node_models import assert_matches, node_model


def _qkv(rng: np.random.Generator, q_heads: int = 4, kv_heads: int = 2) -> dict[str, np.ndarray]:
    return {
        "Q": rng.uniform(-1, 1, (2, q_heads, 3, 8)).astype(np.float32),
        "K": rng.uniform(-1, 1, (2, kv_heads, 5, 8)).astype(np.float32),
        "V": rng.uniform(-1, 1, (2, kv_heads, 5, 6)).astype(np.float32),
    }


@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("mask", ["none", "bool", "float"])
def test_grouped_attention_with_masks_matches_the_reference(
    rng: np.random.Generator, causal: int, mask: str
) -> None:
    feeds = _qkv(rng)
    if mask == "bool":
        feeds["mask"] = rng.random((3, 5)) < 0.7
    elif mask == "float":
        feeds["mask"] = rng.uniform(-2, 0, (2, 1, 3, 5)).astype(np.float32)
    model = node_model("Attention", feeds, ["Y"], opset=23, is_causal=causal)
    assert_matches(model, feeds, oracle="reference", rtol=1e-5, atol=1e-6)


def test_attention_with_cache_and_softcap_exposes_present_and_scores(
    rng: np.random.Generator,
) -> None:
    feeds = _qkv(rng, 2, 2)
    constants = {
        "mask": np.zeros((3, 9), np.float32),
        "past_key": rng.uniform(-1, 1, (2, 2, 4, 8)).astype(np.float32),
        "past_value": rng.uniform(-1, 1, (2, 2, 4, 6)).astype(np.float32),
    }
    model = node_model(
        "Attention",
        feeds,
        ["Y", "present_key", "present_value", "qk"],
        opset=23,
        constants=constants,
        softcap=2.0,
        qk_matmul_output_mode=3,
    )
    assert_matches(model, feeds, oracle="reference", rtol=1e-5, atol=1e-6)


def test_three_d_attention_with_padding_lengths_matches_the_reference(
    rng: np.random.Generator,
) -> None:
    feeds = {
        "Q": rng.uniform(-1, 1, (2, 3, 16)).astype(np.float32),
        "K": rng.uniform(-1, 1, (2, 5, 8)).astype(np.float32),
        "V": rng.uniform(-1, 1, (2, 5, 8)).astype(np.float32),
    }
    model = _with_lengths(feeds)
    assert_matches(model, feeds, oracle="reference", rtol=1e-5, atol=1e-6)


def _with_lengths(feeds: dict[str, np.ndarray]) -> onnx.ModelProto:
    """3-D grouped attention whose keys are padded: batch 1 has 3 valid keys of 5."""
    model = node_model("Attention", feeds, ["Y"], opset=24, q_num_heads=4, kv_num_heads=2)
    node = model.graph.node[0]
    node.input.extend(["", "", "", "lengths"])
    model.graph.initializer.append(
        helper.make_tensor("lengths", onnx.TensorProto.INT64, [2], [5, 3])
    )
    return model
