"""The host's share of a decoding step through a cuda session, measured without a GPU.

    python benchmarks/decode_host.py             # microseconds per step, and per part
    python benchmarks/decode_host.py --profile   # then a cProfile of the steps, by own time

The loop of `benchmarks/decode.py` (input ids on the GPU, a growing numpy mask, numpy
positions, logits left on the GPU) runs through a session of the small LLaMA fixture
(`tests/fixtures/decoder/llama_kv_ts17.onnx`, resident caches, `cache_mask`) on the stand-in
GPU of the tests (`tests/cuda/fake_gpu.py`), whose driver calls do nothing: what is timed is
knopt's Python alone. On the GPU each step adds its driver calls (a graph launch, two small
uploads, DLPack views and event waits: a few microseconds each) and the consumer's work.
Issue #12 asks for well under 100 us of host Python per step.
"""

from __future__ import annotations

import argparse
import sys
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402

import knopt  # noqa: E402
from knopt.ir.kvcache import CacheSteps, widen_mask  # noqa: E402
from tests.cuda.fake_gpu import FakeGpu, fake_gpu  # noqa: E402
from tests.models import MODELS  # noqa: E402

DECODER = MODELS.parent / "decoder" / "llama_kv_ts17.onnx"
CACHES = {
    f"present.{i}.{kv}": f"past_key_values.{i}.{kv}" for i in range(2) for kv in ("key", "value")
}
PROMPT = 8
STEPS = 300  # decoding steps per timed generation (five buckets of cached lengths)


def _session() -> knopt.Session:
    return knopt.compile(
        DECODER,
        "cuda",
        precision="fp16",
        dims={"batch": (1, 1, 2), "seq": (1, PROMPT, 16), "past": (0, 16, PROMPT + 2 * STEPS)},
        resident=CACHES,
        cache_mask="attention_mask",
    )


def _generate(session: knopt.Session, ids: Any, steps: int) -> float:
    """Seconds per decoding step (after a prefill), as `benchmarks/decode.py` loops."""
    session.reset()
    prefill = {
        "input_ids": np.ones((1, PROMPT), np.int64),
        "attention_mask": np.ones((1, PROMPT), np.int64),
        "position_ids": np.arange(PROMPT)[None],
    }
    session.run(["logits"], prefill, device_outputs=True)
    began = time.perf_counter()
    for position in range(PROMPT, PROMPT + steps):
        feeds = {
            "input_ids": ids,
            "attention_mask": np.ones((1, position + 1), np.int64),
            "position_ids": np.full((1, 1), position, np.int64),
        }
        session.run(["logits"], feeds, device_outputs=True)
    return (time.perf_counter() - began) / steps


def _micro(call: Callable[[], object], number: int = 20000) -> float:
    """Microseconds per call, the best of five."""
    return min(timeit.repeat(call, number=number, repeat=5)) / number * 1e6


def _parts(session: knopt.Session) -> dict[str, float]:
    """Microseconds of the shape-dependent parts of a step, each alone."""
    layout = session._cache
    assert layout is not None
    steps = CacheSteps(session.graph, layout)
    shapes = {"input_ids": (1, 1), "attention_mask": (1, 101), "position_ids": (1, 1)}
    step = steps.step(shapes, 100)
    mask = np.ones((1, 101), np.int64)
    feeds = {"input_ids": 0, "attention_mask": 0, "position_ids": 0}
    return {
        "sizes of a step (CacheSteps.step)": _micro(lambda: steps.step(shapes, 100)),
        "the widened mask (widen_mask)": _micro(lambda: widen_mask(mask, step)),
        "the names' check (Session._wanted)": _micro(lambda: session._wanted(feeds, ["logits"])),
        "the profile's check (SizeProfile.check)": _micro(lambda: session.dims.check(step.actual)),
    }


def main() -> None:
    """Time the steps and their parts; print them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", action="store_true", help="then cProfile the steps")
    args = parser.parse_args()
    patch = pytest.MonkeyPatch()
    with fake_gpu(patch) as gpu:
        session = _session()
        ids = gpu.device_array(np.ones((1, 1), np.int64))
        patch.setattr(FakeGpu, "upload", lambda self, address, array: None)  # the driver's
        _generate(session, ids, STEPS)  # plans, compiles and captures every bucket
        per_step = min(_generate(session, ids, STEPS) for _ in range(7))
        print(f"host per decoding step (knopt's Python, no driver): {per_step * 1e6:.1f} us")
        for name, micros in _parts(session).items():
            print(f"  {name:42s} {micros:6.2f} us")
        if args.profile:
            import cProfile
            import pstats

            profiler = cProfile.Profile()
            profiler.enable()
            _generate(session, ids, STEPS)
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(20)
    patch.undo()


if __name__ == "__main__":
    main()
