"""Resident caches: which pairs are caches, how runs are planned, and the widened mask."""

from __future__ import annotations

import numpy as np
import pytest

import knopt
from knopt.errors import InputError, KnoptError
from knopt.ir.dims import SizeProfile
from knopt.ir.kvcache import (
    BUCKET,
    CacheLayout,
    CacheSlot,
    CacheSteps,
    cache_step,
    describe_cache,
    widen_mask,
)
from tests.models import MODELS

DECODER = MODELS.parent / "decoder" / "llama_kv_ts17.onnx"
CACHES = {
    f"present.{i}.{kv}": f"past_key_values.{i}.{kv}" for i in range(2) for kv in ("key", "value")
}


def _layout(mask: str | None = "attention_mask") -> CacheLayout:
    graph = knopt.load(DECODER)
    dims = SizeProfile.parse({"past": (0, 64, 200), "seq": (1, 1, 16)}, graph.symbols())
    return describe_cache(graph, CACHES, mask, dims)


def test_a_decoders_caches_grow_along_past_by_seq() -> None:
    layout = _layout()
    assert (layout.past, layout.new, layout.rows, layout.limit) == ("past", "seq", 216, 200)
    assert layout.slots[0] == CacheSlot("present.0.key", "past_key_values.0.key", 2)


@pytest.mark.parametrize("length", [0, 1, 5, 62, 63, 64, 100, 190, 199])
@pytest.mark.parametrize("added", [1, 3, 16])
def test_planned_lengths_hold_the_real_ones_without_overlap(length: int, added: int) -> None:
    layout = _layout()
    planned = layout.planned_length(length, added)
    assert length <= planned <= max(length, layout.limit)
    # The new rows land at `planned` and move to `length`: the two ranges must not overlap.
    assert planned == length or planned >= length + added
    if added == 1 and planned != length:
        assert (planned + 1) % BUCKET == 0


def test_decoding_steps_of_a_bucket_share_their_sizes() -> None:
    layout = _layout()
    graph = knopt.load(DECODER)
    steps = [
        cache_step(graph, layout, {"input_ids": (2, 1), "attention_mask": (2, n + 1)}, n)
        for n in range(64, 127)
    ]
    assert {tuple(sorted(s.sizes.items())) for s in steps} == {
        (("batch", 2), ("past", 127), ("seq", 1), ("total", 128))
    }


def test_remembered_steps_share_one_sizes_mapping_per_bucket_and_still_check() -> None:
    layout = _layout()
    steps = CacheSteps(knopt.load(DECODER), layout)
    found = [
        steps.step({"input_ids": (2, 1), "attention_mask": (2, n + 1)}, n) for n in range(64, 130)
    ]
    assert len({id(s.sizes) for s in found[:64]}) == 1  # lengths 64 ... 127: one bucket
    assert found[64].sizes == {"batch": 2, "seq": 1, "total": 192, "past": 191}
    assert found[10].actual == {"batch": 2, "seq": 1, "total": 75, "past": 74}
    with pytest.raises(InputError, match="covers 70 positions; the cache holds 70"):
        steps.step({"input_ids": (2, 1), "attention_mask": (2, 70)}, 70)
    with pytest.raises(InputError, match="size 'batch' is 1 here but 2"):
        steps.step({"input_ids": (2, 1), "attention_mask": (1, 71)}, 70)


def test_the_widened_mask_hides_the_padding() -> None:
    layout = _layout()
    graph = knopt.load(DECODER)
    step = cache_step(graph, layout, {"input_ids": (1, 1), "attention_mask": (1, 4)}, 3)
    mask = np.array([[0, 1, 1, 1]])
    widened = widen_mask(mask, step)
    assert widened.shape == (1, step.planned + 1)
    np.testing.assert_array_equal(widened[0, :3], [0, 1, 1])
    assert not widened[0, 3 : step.planned].any() and widened[0, -1] == 1


@pytest.mark.parametrize("length", [0, 3, 62, 63, 64, 150])
def test_the_widened_mask_is_the_past_then_zeros_then_the_new_positions(length: int) -> None:
    layout = _layout()
    step = cache_step(
        knopt.load(DECODER),
        layout,
        {"input_ids": (2, 2), "attention_mask": (2, length + 2)},
        length,
    )
    mask = np.random.default_rng(length).integers(0, 2, (2, length + 2))
    padding = np.zeros((2, step.planned - length), mask.dtype)
    expected = np.concatenate([mask[:, :length], padding, mask[:, length:]], axis=-1)
    np.testing.assert_array_equal(widen_mask(mask, step), expected)


def test_a_mask_that_does_not_cover_the_cache_is_refused() -> None:
    layout = _layout()
    graph = knopt.load(DECODER)
    with pytest.raises(InputError, match="covers 3 positions; the cache holds 3"):
        cache_step(graph, layout, {"input_ids": (1, 1), "attention_mask": (1, 3)}, 3)


@pytest.mark.parametrize(
    ("resident", "mask", "message"),
    [
        ({"logits": "input_ids"}, None, "types differ"),
        ({"nope": "input_ids"}, None, "'nope' is not an output"),
        ({"present.0.key": "nope"}, None, "'nope' is not an input"),
        (CACHES, "position_ids_typo", "is not a \\(non-resident\\) input"),
    ],
)
def test_pairs_that_are_not_caches_are_refused(
    resident: dict, mask: str | None, message: str
) -> None:
    graph = knopt.load(DECODER)
    dims = SizeProfile.parse({"past": (0, 64, 200), "seq": (1, 1, 16)}, graph.symbols())
    with pytest.raises(KnoptError, match=message):
        describe_cache(graph, resident, mask, dims)
