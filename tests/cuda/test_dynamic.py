"""One cuda session for every size: size-generic kernels against the CPU, and decoding with a
resident key/value cache (GPU tests)."""

from __future__ import annotations

import numpy as np
import pytest

import knopt
from tests.models import MODELS

pytestmark = pytest.mark.cuda

BERT = MODELS / "bert_ts14.onnx"
DECODERS = MODELS.parent / "decoder"
CACHES = {
    f"present.{i}.{kv}": f"past_key_values.{i}.{kv}" for i in range(2) for kv in ("key", "value")
}
TOLERANCE = {"f32": (1e-4, 1e-4), "fp16": (2e-2, 2e-2)}


def _bert_feeds(rng: np.random.Generator, batch: int, seq: int) -> dict[str, np.ndarray]:
    mask = np.ones((batch, seq), np.int64)
    mask[:, seq // 2 + 1 :] = rng.integers(0, 2, (batch, seq - seq // 2 - 1))
    return {
        "input_ids": rng.integers(0, 100, (batch, seq)).astype(np.int64),
        "attention_mask": mask,
    }


@pytest.mark.parametrize("precision", ["f32", "fp16"])
def test_one_session_serves_every_size_like_the_cpu(precision: str) -> None:
    from knopt.cuda import nvrtc

    rng = np.random.default_rng(0)
    session = knopt.compile(
        BERT, "cuda", precision=precision, dims={"batch": (1, 4, 8), "seq": (1, 12, 16)}
    )
    reference = knopt.compile(BERT)
    rtol, atol = TOLERANCE[precision]
    pairs = [(2, 12), (1, 1), (5, 16), (3, 7), (1, 13), (8, 2), (2, 12), (4, 9), (7, 16)]
    compiles = None
    for index, (batch, seq) in enumerate(pairs):
        feeds = _bert_feeds(rng, batch, seq)
        (ours,) = session.run(None, feeds)
        (expected,) = reference.run(None, feeds)
        np.testing.assert_allclose(ours, expected, rtol=rtol, atol=atol, err_msg=f"{batch, seq}")
        if index == 0:
            compiles = nvrtc.stats.compiles + nvrtc.stats.cache_hits
    assert nvrtc.stats.compiles + nvrtc.stats.cache_hits == compiles
    assert session.stats.optimizer_runs == 1


def _inputs(ids: np.ndarray, start: int, stop: int) -> dict[str, np.ndarray]:
    batch = ids.shape[0]
    return {
        "input_ids": ids[:, start:stop],
        "attention_mask": np.ones((batch, stop), np.int64),
        "position_ids": np.arange(start, stop)[None].repeat(batch, 0),
    }


@pytest.mark.parametrize(
    ("name", "precision", "static"),
    [
        ("llama_kv_ts17.onnx", "f32", True),
        ("llama_kv_ts17.onnx", "fp16", True),
        ("llama_kv_ts17.onnx", "f32", False),
        ("llama_kv_dynamo18.onnx", "fp16", True),
    ],
)
def test_decoding_on_the_gpu_equals_the_whole_sequence_on_the_cpu(
    name: str, precision: str, static: bool
) -> None:
    from knopt.cuda import nvrtc

    rng = np.random.default_rng(1)
    batch, prompt, steps = 2, 5, 70 if static else 6
    ids = rng.integers(0, 64, (batch, prompt + steps)).astype(np.int64)
    whole = _inputs(ids, 0, prompt + steps)
    whole.update({n: np.zeros((batch, 2, 0, 8), np.float32) for n in CACHES.values()})
    (expected,) = knopt.compile(DECODERS / name).run(["logits"], whole)
    session = knopt.compile(
        DECODERS / name,
        "cuda",
        precision=precision,
        dims={"batch": (1, 2, 4), "seq": (1, 8, 16), "past": (0, 64, 128)},
        resident=CACHES,
        cache_mask="attention_mask" if static else None,
    )
    logits = [session.run(["logits"], _inputs(ids, 0, prompt))[0]]
    compiles = nvrtc.stats.compiles + nvrtc.stats.cache_hits
    for i in range(prompt, prompt + steps):
        logits.append(session.run(["logits"], _inputs(ids, i, i + 1))[0])
    rtol, atol = TOLERANCE[precision]
    np.testing.assert_allclose(np.concatenate(logits, axis=1), expected, rtol=rtol, atol=atol)
    if static:
        assert nvrtc.stats.compiles + nvrtc.stats.cache_hits == compiles
        assert session.stats.bindings == 1 + 2  # the prefill, then lengths 5..74 in two buckets
    assert session.stats.optimizer_runs == 1
    (present,) = session.run(
        ["present.1.value"],
        _inputs(ids, 0, 1)
        | {
            "attention_mask": np.ones((batch, prompt + steps + 1), np.int64),
            "position_ids": np.full((batch, 1), prompt + steps),
        },
    )
    cpu = knopt.compile(DECODERS / name)
    (expected_present,) = cpu.run(["present.1.value"], whole)
    np.testing.assert_allclose(
        present[:, :, : prompt + steps], expected_present, rtol=rtol, atol=atol
    )
