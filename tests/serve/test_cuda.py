"""On a GPU: the cache keeps programs and cubins per GPU; a served model answers like compile."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from ray import serve

import knopt
import knopt.cuda
import knopt.serve
from knopt.cache.key import device_fingerprint
from tests.models import MODELS

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not knopt.cuda.is_available(), reason="no usable NVIDIA GPU"),
]

RESNET = MODELS / "resnet_ts14.onnx"


def _images(seed: int, rows: int = 2) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 3, 32, 32)).astype(np.float32)


def test_fingerprint_names_the_gpu_and_its_versions() -> None:
    fingerprint = device_fingerprint("cuda")
    name, arch, driver, nvrtc = fingerprint.split("|")
    assert name.startswith("cuda:") and arch.startswith("sm_")
    assert driver.startswith("driver ") and nvrtc.startswith("nvrtc ")


def test_cuda_sessions_share_programs_and_cubins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KNOPT_CACHE_DIR", str(tmp_path / "before"))  # restored after the test
    x = _images(0)
    first = knopt.compile(RESNET, "cuda", precision="fp16", cache=tmp_path)
    (expected,) = first.run(None, {"input": x})
    assert any((tmp_path / "cubin").iterdir())
    second = knopt.compile(RESNET, "cuda", precision="fp16", cache=tmp_path)
    (got,) = second.run(None, {"input": x})
    assert first.cache is not None and second.cache is not None
    assert (first.cache.stats.writes, second.cache.stats.hits) == (1, 1)
    np.testing.assert_array_equal(got, expected)
    (reference,) = knopt.compile(RESNET).run(None, {"input": x})
    np.testing.assert_allclose(got, reference, rtol=2e-2, atol=2e-2)


def test_served_on_cuda_answers_like_compile(serve_url: str, tmp_path: Path) -> None:
    app = knopt.serve.deployment(
        RESNET, device="cuda", num_replicas="auto", max_batch_size=8, cache=tmp_path
    )
    handle = serve.run(app, name="resnet-cuda", route_prefix="/resnet-cuda")
    try:
        reference = knopt.compile(RESNET)
        inputs = [_images(seed, rows=1 + seed % 3) for seed in range(16)]
        responses = [handle.run.remote({"input": x}) for x in inputs]
        for x, response in zip(inputs, responses, strict=True):
            (expected,) = reference.run(None, {"input": x})
            got = response.result()["logits"]
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
        stats = handle.stats.remote().result()
        assert stats["runs"] < stats["requests"]
    finally:
        serve.delete("resnet-cuda")
