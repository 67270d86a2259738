"""`knopt.compile(..., device="cuda")`: numpy and GPU-array feeds, results on the host or GPU."""

from __future__ import annotations

import numpy as np
import pytest

import knopt
from knopt.errors import InputError
from tests.models import MODELS, fixtures

pytestmark = pytest.mark.cuda


def _fixture(name: str):
    return next(f for f in fixtures() if f.file == name)


def test_session_runs_numpy_feeds_like_cpu() -> None:
    fixture = _fixture("resnet_ts14.onnx")
    feeds = fixture.feeds()
    (expected,) = knopt.compile(fixture.path).run(None, feeds)
    session = knopt.compile(fixture.path, device="cuda")
    assert session.device == "cuda"
    for _ in range(3):  # eager, then graph replays
        (actual,) = session.run(None, feeds)
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)
    other = fixture.feeds(seed=1)
    other["input"] = other["input"][:1]  # a new batch size binds and compiles again
    (small,) = session.run(None, other)
    (small_cpu,) = knopt.compile(fixture.path).run(None, other)
    np.testing.assert_allclose(small, small_cpu, rtol=1e-4, atol=1e-5)


def test_session_takes_torch_tensors_and_returns_device_arrays() -> None:
    torch = pytest.importorskip("torch", reason="feeds and reads CUDA tensors through torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    fixture = _fixture("bert_dynamo18.onnx")
    feeds = fixture.feeds()
    (expected,) = knopt.compile(fixture.path).run(None, feeds)[:1]
    session = knopt.compile(fixture.path, device="best")
    gpu_feeds = {k: torch.from_numpy(v).cuda() for k, v in feeds.items()}
    for _ in range(2):
        results = session.run(None, gpu_feeds, device_outputs=True)
        tensor = torch.as_tensor(results[0], device="cuda")
        np.testing.assert_allclose(tensor.cpu().numpy(), expected, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(results[0].numpy(), expected, rtol=1e-4, atol=1e-5)
    with pytest.raises(InputError):
        session.run(None, {k: v.float() for k, v in gpu_feeds.items()})


DECODER = MODELS.parent / "decoder" / "llama_kv_ts17.onnx"
CACHES = {
    f"present.{i}.{kv}": f"past_key_values.{i}.{kv}" for i in range(2) for kv in ("key", "value")
}
PROMPT = 5


def _decoder_session() -> knopt.Session:
    return knopt.compile(
        DECODER,
        "cuda",
        dims={"batch": (1, 2, 2), "seq": (1, PROMPT, 8), "past": (0, 16, 160)},
        resident=CACHES,
        cache_mask="attention_mask",
    )


def _decode_waiting(
    session: knopt.Session, prompt: np.ndarray, steps: int
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Greedy decoding with numpy feeds and results: every run waits for the GPU."""
    batch = prompt.shape[0]
    feeds = {
        "input_ids": prompt,
        "attention_mask": np.ones((batch, PROMPT), np.int64),
        "position_ids": np.tile(np.arange(PROMPT), (batch, 1)),
    }
    logits = [session.run(["logits"], feeds)[0][:, -1]]
    tokens = [logits[-1].argmax(-1)]
    for position in range(PROMPT, PROMPT + steps):
        feeds = {
            "input_ids": tokens[-1][:, None].astype(np.int64),
            "attention_mask": np.ones((batch, position + 1), np.int64),
            "position_ids": np.full((batch, 1), position, np.int64),
        }
        logits.append(session.run(["logits"], feeds)[0][:, -1])
        tokens.append(logits[-1].argmax(-1))
    return np.stack(tokens, axis=1), logits


def test_decoding_on_device_outputs_without_waiting_equals_the_waiting_path() -> None:
    torch = pytest.importorskip("torch", reason="feeds and reads CUDA tensors through torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    prompt = np.random.default_rng(0).integers(0, 64, (2, PROMPT))
    steps = 70  # crosses a bucket: a new plan, capture and graph on the way
    session = _decoder_session()  # one session: the same plans and library choices
    expected_tokens, expected_logits = _decode_waiting(session, prompt, steps)
    session.reset()
    side = torch.cuda.Stream()  # neither knopt's stream nor torch's default one
    with torch.cuda.stream(side):
        ids = torch.empty((2, 1), dtype=torch.int64, device="cuda")
        positions = torch.arange(PROMPT, device="cuda").expand(2, PROMPT).contiguous()
        feeds = {
            "input_ids": torch.from_numpy(prompt).cuda(),
            "attention_mask": np.ones((2, PROMPT), np.int64),
            "position_ids": positions,
        }
        (logits,) = session.run(["logits"], feeds, device_outputs=True)
        del feeds, positions  # held by knopt until the prefill is done, whatever torch reuses
        torch.full((2, PROMPT), 63, dtype=torch.int64, device="cuda")
        kept = [torch.from_dlpack(logits)[:, -1].clone()]
        ids.copy_(kept[-1].argmax(-1, keepdim=True))
        tokens = [ids.clone()]
        for position in range(PROMPT, PROMPT + steps):
            step = {
                "input_ids": ids,
                "attention_mask": np.ones((2, position + 1), np.int64),
                "position_ids": torch.full((2, 1), position, dtype=torch.int64, device="cuda"),
            }
            (logits,) = session.run(["logits"], step, device_outputs=True)
            kept.append(torch.from_dlpack(logits)[:, -1].clone())
            ids.copy_(kept[-1].argmax(-1, keepdim=True))  # written while knopt may still read
            tokens.append(ids.clone())
        side.synchronize()
    np.testing.assert_array_equal(torch.cat(tokens, dim=1).cpu().numpy(), expected_tokens)
    for actual, expected in zip(kept, expected_logits, strict=True):
        np.testing.assert_allclose(actual.cpu().numpy(), expected, rtol=1e-5, atol=1e-6)


def test_a_device_array_is_handed_over_in_stream_order_until_the_next_run() -> None:
    torch = pytest.importorskip("torch", reason="feeds and reads CUDA tensors through torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    fixture = _fixture("bert_dynamo18.onnx")
    feeds = fixture.feeds()
    (expected,) = knopt.compile(fixture.path).run(None, feeds)[:1]
    session = knopt.compile(fixture.path, device="cuda")
    session.run(None, feeds)  # the eager run and the capture
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        first = session.run(None, feeds, device_outputs=True)[0]
        tensor = torch.from_dlpack(first)
        assert tensor.device.type == "cuda" and tuple(tensor.shape) == first.shape
        copy = tensor.clone()  # queued on `side`, after the run
        session.run(None, fixture.feeds(seed=1), device_outputs=True)  # overwrites, after `side`
        np.testing.assert_allclose(copy.cpu().numpy(), expected, rtol=1e-4, atol=1e-5)
    with pytest.raises(knopt.ResultError, match="overwritten"):
        torch.from_dlpack(first)
    with pytest.raises(knopt.ResultError):
        first.numpy()
