"""Programmatic dependent launch: on exactly where it should be, and results unchanged by it."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import knopt
from tests.models import MODELS, fixtures

pytest.importorskip("cuda.core", reason="needs cuda-python")

from knopt.cuda.driver import PDL_ENV, launch_config, pdl_enabled


@pytest.mark.parametrize("setting", [None, "1", "0", " 0 "])
@pytest.mark.parametrize("arch", [75, 80, 89, 90, 100, 120])
def test_pdl_is_on_from_sm_90_unless_turned_off(
    arch: int, setting: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if setting is None:
        monkeypatch.delenv(PDL_ENV, raising=False)
    else:
        monkeypatch.setenv(PDL_ENV, setting)
    expected = arch >= 90 and (setting is None or setting.strip() != "0")
    assert pdl_enabled(arch) is expected


@pytest.mark.parametrize("pdl", [False, True])
def test_the_launch_config_carries_the_attribute_exactly_when_asked(pdl: bool) -> None:
    config = launch_config((3, 2, 1), (128, 1, 1), 4096, pdl)
    assert config.programmatic_stream_serialization is pdl
    assert (config.grid, config.block, config.shmem_size) == ((3, 2, 1), (128, 1, 1), 4096)
    assert not config.is_cooperative


def test_only_the_driver_launches_kernels() -> None:
    # Gpu.launch sets the attribute for kernels compiled from codegen/, which wait for the one
    # ahead; a kernel launched another way could get it without waiting, or skip the driver.
    launches = re.compile(r"\bcore\.launch\(|\bcuLaunchKernel(?:Ex)?\(")
    package = Path(knopt.__file__).parent
    found = [p for p in package.rglob("*.py") if launches.search(p.read_text())]
    assert [p.relative_to(package).as_posix() for p in found] == ["cuda/driver.py"]


# ---- on the GPU: results are the same with programmatic dependent launch on and off --------

# Each launch reads one buffer and writes the other, so a kernel let in early that did not wait
# would read what the kernel ahead has not written yet, or overwrite what it still reads.
PING_PONG = """#include "common.cuh"
extern "C" __global__ void __launch_bounds__(256) add_one(const float* a, float* b, long long n) {
  KN_PDL_BEGIN();
  for (long long i = (long long)blockIdx.x * 256 + threadIdx.x; i < n; i += 256LL * gridDim.x) {
    b[i] = a[i] + 1.0f;
  }
}
"""
DECODER = MODELS.parent / "decoder" / "llama_kv_ts17.onnx"
CACHES = {
    f"present.{i}.{kv}": f"past_key_values.{i}.{kv}" for i in range(2) for kv in ("key", "value")
}
PROMPT = 5


def _skip_before_hopper() -> None:
    from cuda import core

    if int(core.Device().arch) < 90:
        pytest.skip("programmatic dependent launch needs sm_90 or later")


@pytest.mark.cuda
def test_kernels_let_in_early_see_the_writes_of_the_kernel_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _skip_before_hopper()
    from knopt.cuda import nvrtc
    from knopt.cuda.driver import Gpu

    monkeypatch.setenv("KNOPT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(PDL_ENV, raising=False)
    gpu = Gpu()
    assert gpu.pdl
    kernel = gpu.load(nvrtc.compile_cubin(PING_PONG, gpu.arch), ["add_one"])["add_one"]
    n = 1 << 22  # 16 MiB a buffer: many waves of blocks
    start = np.random.default_rng(0).integers(-1000, 1000, n).astype(np.float32)  # sums exact
    buffers = [gpu.allocate(4 * n), gpu.allocate(4 * n)]
    gpu.upload(buffers[0], start)
    launches = 64

    def queue() -> None:
        for i in range(launches):
            a, b = buffers[i % 2], buffers[1 - i % 2]
            gpu.launch(kernel, (1024, 1, 1), (256, 1, 1), 0, [a, b, np.int64(n)])

    queue()  # eager
    expected = start + np.float32(launches)
    np.testing.assert_array_equal(gpu.download(buffers[0], np.empty_like(start)), expected)
    gpu.begin_capture()
    queue()
    graph = gpu.end_capture()
    for _ in range(20):
        gpu.replay(graph)
        expected = expected + np.float32(launches)
        np.testing.assert_array_equal(gpu.download(buffers[0], np.empty_like(start)), expected)
    gpu.release_graph(graph)


def _results(
    path: Path, pdl: str, feeds: dict[str, np.ndarray], runs: int, monkeypatch: pytest.MonkeyPatch
) -> list[list[np.ndarray]]:
    """Every run's outputs of a new fp16 session with `KNOPT_PDL` set to `pdl`."""
    monkeypatch.setenv(PDL_ENV, pdl)
    monkeypatch.setenv("KNOPT_TUNE", "0")  # the same library algorithms in both sessions
    session = knopt.compile(path, device="cuda", precision="fp16")
    return [session.run(None, feeds) for _ in range(runs)]  # eager, then graph replays


@pytest.mark.cuda
def test_a_transformer_gives_identical_results_with_pdl_on_and_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _skip_before_hopper()
    fixture = next(f for f in fixtures() if f.file == "llama_ts14.onnx")
    feeds = fixture.feeds()
    (without,) = _results(fixture.path, "0", feeds, 1, monkeypatch)
    for run in _results(fixture.path, "1", feeds, 30, monkeypatch):
        for mine, theirs in zip(run, without, strict=True):
            np.testing.assert_array_equal(mine, theirs)
    cpu = knopt.compile(fixture.path).run(None, feeds)[0]
    scale = float(np.abs(cpu).max())
    np.testing.assert_allclose(without[0], cpu, rtol=1e-2, atol=1e-2 * scale)


def _decode(pdl: str, monkeypatch: pytest.MonkeyPatch, steps: int) -> list[np.ndarray]:
    """Greedy decoding's logits at every step, through resident caches and captured graphs."""
    monkeypatch.setenv(PDL_ENV, pdl)
    monkeypatch.setenv("KNOPT_TUNE", "0")
    session = knopt.compile(
        DECODER,
        "cuda",
        dims={"batch": (1, 2, 2), "seq": (1, PROMPT, 8), "past": (0, 16, 160)},
        resident=CACHES,
        cache_mask="attention_mask",
    )
    prompt = np.random.default_rng(0).integers(0, 64, (2, PROMPT))
    feeds = {
        "input_ids": prompt,
        "attention_mask": np.ones((2, PROMPT), np.int64),
        "position_ids": np.tile(np.arange(PROMPT), (2, 1)),
    }
    logits = [session.run(["logits"], feeds)[0][:, -1]]
    for position in range(PROMPT, PROMPT + steps):
        feeds = {
            "input_ids": logits[-1].argmax(-1)[:, None].astype(np.int64),
            "attention_mask": np.ones((2, position + 1), np.int64),
            "position_ids": np.full((2, 1), position, np.int64),
        }
        logits.append(session.run(["logits"], feeds)[0][:, -1])
    return logits


@pytest.mark.cuda
def test_decoding_with_resident_caches_is_identical_with_pdl_on_and_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _skip_before_hopper()
    steps = 70  # replays of each bucket's captured graph, and a new bucket on the way
    without = _decode("0", monkeypatch, steps)
    for mine, theirs in zip(_decode("1", monkeypatch, steps), without, strict=True):
        np.testing.assert_array_equal(mine, theirs)
