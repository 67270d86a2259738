"""The cuda runner's bookkeeping, dry-run on a stand-in GPU (tests/cuda/fake_gpu.py).

Nothing is computed here (GPU tests check numbers): these check that a new size plans and
reuses compiled kernels, that launches match their kernels' signatures, that memory is
allocated and freed as planned, and that decoding steps replay one CUDA graph per bucket.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import knopt

pytest.importorskip("cuda.core", reason="the cuda runner needs cuda-python (not a GPU)")

from knopt.cuda import nvrtc
from knopt.cuda.executor import DeviceArray
from knopt.cuda.runner import PROGRAMS_KEPT, SIZES_KEPT, CudaRunner, probe_sizes, warm_sizes
from knopt.ir.bind import bind_program
from knopt.ir.dims import SizeProfile
from knopt.ir.program import Program
from knopt.opt.optimize import optimize
from tests.cuda.fake_gpu import FakeGpu, fake_gpu
from tests.models import MODELS

DECODER = MODELS.parent / "decoder" / "llama_kv_ts17.onnx"
CACHES = {
    f"present.{i}.{kv}": f"past_key_values.{i}.{kv}" for i in range(2) for kv in ("key", "value")
}


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeGpu]:
    with fake_gpu(monkeypatch) as fake:
        yield fake


@functools.cache
def _bert() -> Program:
    return optimize(knopt.load(MODELS / "bert_ts14.onnx"), profile="h200-graph").program


def _feeds(batch: int, seq: int) -> dict[str, np.ndarray]:
    ids = np.arange(batch * seq, dtype=np.int64).reshape(batch, seq) % 50
    return {"input_ids": ids, "attention_mask": np.ones((batch, seq), np.int64)}


def test_new_sizes_reuse_the_kernels_of_their_kind(gpu: FakeGpu) -> None:
    runner = CudaRunner("fp16")
    runner.dims = SizeProfile.parse({"batch": (1, 4, 8), "seq": (1, 8, 16)}, {"batch", "seq"})
    runner.run(_bert(), {"batch": 2, "seq": 12}, _feeds(2, 12))
    compiles = nvrtc.stats.compiles
    for batch, seq in ((3, 12), (5, 16), (2, 9), (8, 3), (1, 13), (4, 1), (7, 15)):
        (out,) = runner.run(_bert(), {"batch": batch, "seq": seq}, _feeds(batch, seq))
        assert out.shape == (batch, seq, 32)
    assert nvrtc.stats.compiles == compiles  # the profile's kinds were prepared at the start


def test_a_size_seen_before_replays_its_graph(gpu: FakeGpu) -> None:
    runner = CudaRunner("f32")
    runner.run(_bert(), {"batch": 2, "seq": 12}, _feeds(2, 12))
    assert (gpu.captures, gpu.replays) == (0, 0)  # a first run launches eagerly
    launches = len(gpu.launches)
    for _ in range(3):
        runner.run(_bert(), {"batch": 2, "seq": 12}, _feeds(2, 12))
    assert (gpu.captures, gpu.replays) == (1, 3)  # captured on the second run
    assert len(gpu.launches) == 2 * launches  # the eager run's launches, then the capture's


def test_plans_beyond_the_bound_are_forgotten_and_their_memory_freed(gpu: FakeGpu) -> None:
    runner = CudaRunner("f32")
    for seq in range(1, SIZES_KEPT + 4):
        runner.run(_bert(), {"batch": 1, "seq": seq % 16 + 1}, _feeds(1, seq % 16 + 1))
    state = runner.state(_bert())
    assert len(state.executables) <= SIZES_KEPT
    inputs = {e.inputs for e in state.executables.values()}
    pools = {p.address for p in state.runtime.pools.values()}
    resident = {state.runtime.weights, *pools} - {0}
    assert set(gpu.live) == inputs | resident


def test_programs_beyond_the_bound_free_their_memory(gpu: FakeGpu) -> None:
    runner = CudaRunner("f32")
    program = _bert()
    for batch in range(1, PROGRAMS_KEPT + 3):  # a program per size, as PerSizeSession makes
        sized = bind_program(program, {"batch": batch, "seq": 4})
        runner.run(sized, {}, _feeds(batch, 4))
    held = set()
    for state in runner._states.values():
        held |= {e.inputs for e in state.executables.values()}
        runtime = state.runtime
        held |= {runtime.weights, *(p.address for p in runtime.pools.values())} - {0}
    assert set(gpu.live) == held


def test_probes_keep_sizes_of_one_and_move_together() -> None:
    dims = SizeProfile.parse({"seq": (1, 8, 16)}, {"batch", "seq", "past", "total"})
    first = next(probe_sizes({"batch": 1, "seq": 1, "past": 63, "total": 64}, dims))
    assert first == {"batch": 1, "seq": 1, "past": 71, "total": 72}
    probes = list(probe_sizes({"batch": 4, "seq": 12}, dims))
    assert probes[:2] == [{"batch": 12, "seq": 12}, {"batch": 4, "seq": 4}]


def test_warm_sizes_cover_the_profile_around_opt() -> None:
    dims = SizeProfile.parse({"batch": (1, 4, 8), "seq": (1, 8, 16)}, {"batch", "seq"})
    sizes = warm_sizes({"batch": 3, "seq": 5}, dims)
    assert sizes[0] == {"batch": 4, "seq": 8}
    assert {"batch": 1, "seq": 9} in sizes
    assert {s["seq"] for s in sizes} == {1, 2, 4, 8, 9, 10, 12, 16}
    assert len(sizes) == len({tuple(s.items()) for s in sizes})


@pytest.mark.parametrize("precision", ["f32", "fp16"])
def test_decoding_compiles_nothing_after_the_prefill(gpu: FakeGpu, precision: str) -> None:
    session = knopt.compile(
        DECODER,
        "cuda",
        precision=precision,
        dims={"batch": (1, 2, 4), "seq": (1, 8, 32), "past": (0, 16, 200)},
        resident=CACHES,
        cache_mask="attention_mask",
    )
    rng = np.random.default_rng(0)
    feeds = {
        "input_ids": rng.integers(0, 64, (2, 5)),
        "attention_mask": np.ones((2, 5), np.int64),
        "position_ids": np.tile(np.arange(5), (2, 1)),
    }
    session.run(["logits"], feeds)
    compiles, runs = nvrtc.stats.compiles, session.stats.optimizer_runs
    for position in range(5, 140):
        step = {
            "input_ids": rng.integers(0, 64, (2, 1)),
            "attention_mask": np.ones((2, position + 1), np.int64),
            "position_ids": np.full((2, 1), position),
        }
        (logits,) = session.run(["logits"], step)
        assert logits.shape == (2, 1, 64)
    assert (nvrtc.stats.compiles, session.stats.optimizer_runs) == (compiles, runs)
    # Lengths 5 ... 139 fall in three buckets of 64 rows: one plan and capture each. A plan
    # is captured on its second run, so the prefill (run once, eagerly) has no graph.
    assert session.stats.bindings == 1 + 3
    assert gpu.captures == 3
    last = {"attention_mask": np.ones((2, 141), np.int64), "position_ids": np.full((2, 1), 140)}
    (present,) = session.run(["present.1.value"], step | last)
    assert present.shape == (2, 2, 141, 8)


def test_a_bucketed_step_moves_its_rows_to_the_real_length(gpu: FakeGpu) -> None:
    session = knopt.compile(
        DECODER,
        "cuda",
        dims={"past": (0, 16, 100), "seq": (1, 1, 8)},
        resident=CACHES,
        cache_mask="attention_mask",
    )
    feeds = {
        "input_ids": np.ones((1, 3), np.int64),
        "attention_mask": np.ones((1, 3), np.int64),
        "position_ids": np.arange(3)[None],
    }
    session.run(["logits"], feeds)
    step = {
        "input_ids": np.ones((1, 1), np.int64),
        "attention_mask": np.ones((1, 4), np.int64),
        "position_ids": np.array([[3]]),
    }
    session.run(["logits"], step)
    relocation = [a for k, _, a in gpu.launches if k.startswith("kn_g_")][-1]
    # The last launch copies the step's rows of all four caches (planned at 63) at once.
    sizes = [int(a) for a in relocation[3:8]]
    assert sizes == [1, 2, 1, 8, 4]
    position = [address for address, data in gpu.uploads if data.dtype == np.int32][-1]
    assert relocation[2] == position


def test_a_second_prompt_plans_nothing_again(gpu: FakeGpu, monkeypatch: pytest.MonkeyPatch) -> None:
    from knopt.cuda import runner

    plans: list[object] = []
    build = runner.build_plan

    def counted(*args: object, **kwargs: object) -> object:
        plans.append(args[0])
        return build(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(runner, "build_plan", counted)
    session = knopt.compile(
        DECODER,
        "cuda",
        dims={"batch": (1, 1, 2), "seq": (1, 4, 8), "past": (0, 8, 100)},
        resident=CACHES,
        cache_mask="attention_mask",
    )
    rng = np.random.default_rng(1)

    def generate() -> None:
        session.reset()
        session.run(
            ["logits"],
            {
                "input_ids": rng.integers(0, 64, (1, 4)),
                "attention_mask": np.ones((1, 4), np.int64),
                "position_ids": np.arange(4)[None],
            },
        )
        for position in range(4, 12):
            step = {
                "input_ids": rng.integers(0, 64, (1, 1)),
                "attention_mask": np.ones((1, position + 1), np.int64),
                "position_ids": np.array([[position]]),
            }
            session.run(["logits"], step)

    generate()
    first = len(plans)
    assert first > 0
    generate()  # the prefill warms the decoding steps again: they are planned already
    assert len(plans) == first


def _decoding_session() -> knopt.Session:
    return knopt.compile(
        DECODER,
        "cuda",
        dims={"batch": (1, 1, 2), "seq": (1, 4, 8), "past": (0, 8, 100)},
        resident=CACHES,
        cache_mask="attention_mask",
    )


def _prefill(session: knopt.Session) -> None:
    session.run(
        ["logits"],
        {
            "input_ids": np.ones((1, 4), np.int64),
            "attention_mask": np.ones((1, 4), np.int64),
            "position_ids": np.arange(4)[None],
        },
        device_outputs=True,
    )


def _decode(session: knopt.Session, gpu: FakeGpu, position: int, ids: object = None) -> DeviceArray:
    feeds = {
        "input_ids": ids if ids is not None else np.ones((1, 1), np.int64),
        "attention_mask": np.ones((1, position + 1), np.int64),
        "position_ids": np.array([[position]]),
    }
    (logits,) = session.run(["logits"], feeds, device_outputs=True)
    assert isinstance(logits, DeviceArray)
    return logits


def test_decoding_steps_with_device_outputs_never_wait_for_the_gpu(gpu: FakeGpu) -> None:
    session = _decoding_session()
    _prefill(session)
    _decode(session, gpu, 4)  # the bucket's first step runs eagerly, then captures
    syncs, replays = gpu.syncs, gpu.replays
    for position in range(5, 40):
        _decode(session, gpu, position)
    assert gpu.syncs == syncs
    assert gpu.replays == replays + 35


def test_a_result_orders_its_dlpack_consumer_and_the_next_run_waits_for_it(
    gpu: FakeGpu,
) -> None:
    session = _decoding_session()
    _prefill(session)
    _decode(session, gpu, 4)
    logits = _decode(session, gpu, 5)
    gpu.stream_log.clear()
    assert logits.__dlpack_device__() == (2, 0)
    logits.__dlpack__(stream=11, max_version=(1, 0))
    logits.__dlpack__()  # None: the legacy default stream
    assert gpu.stream_log == [("make_wait", 11), ("make_wait", 1)]
    _decode(session, gpu, 6)
    waits = {entry for entry in gpu.stream_log if entry[0] == "wait_for"}
    assert waits == {("wait_for", 11), ("wait_for", 1)}
    assert gpu.stream_log.index(("wait_for", 11)) < gpu.stream_log.index(("replay", 7))
    gpu.stream_log.clear()
    _decode(session, gpu, 7)  # nobody took the last result: nothing to wait for
    assert [e for e in gpu.stream_log if e[0] == "wait_for"] == []


def test_an_output_pool_read_by_a_consumer_is_freed_only_after_it(gpu: FakeGpu) -> None:
    session = _decoding_session()
    _prefill(session)
    logits = _decode(session, gpu, 4)
    logits.__dlpack__(stream=11)
    old = session._cuda.state(session._program()).runtime.pools["output"].address
    gpu.stream_log.clear()
    session.reset()
    prompt = {
        "input_ids": np.ones((1, 8), np.int64),
        "attention_mask": np.ones((1, 8), np.int64),
        "position_ids": np.arange(8)[None],
    }
    session.run(["logits"], prompt, device_outputs=True)  # longer logits: the pool grows
    assert gpu.stream_log.index(("wait_for", 11)) < gpu.stream_log.index(("release", old))
    with pytest.raises(knopt.ResultError):
        logits.__dlpack__(stream=11)


def test_a_result_taken_without_ordering_or_on_knopts_stream_adds_no_wait(gpu: FakeGpu) -> None:
    session = _decoding_session()
    _prefill(session)
    logits = _decode(session, gpu, 4)
    gpu.stream_log.clear()
    logits.__dlpack__(stream=-1)
    logits.__dlpack__(stream=gpu.stream_handle)
    _decode(session, gpu, 5)
    assert [e for e in gpu.stream_log if e[0] in ("wait_for", "make_wait")] == []


def test_a_result_overwritten_by_a_later_run_is_refused(gpu: FakeGpu) -> None:
    session = _decoding_session()
    _prefill(session)
    old = _decode(session, gpu, 4)
    _decode(session, gpu, 5)
    with pytest.raises(knopt.ResultError, match="overwritten"):
        old.__dlpack__(stream=11)
    with pytest.raises(BufferError):
        old.__dlpack__(stream=-1)
    with pytest.raises(knopt.ResultError):
        old.numpy()
    with pytest.raises(knopt.ResultError):
        old.__cuda_array_interface__  # noqa: B018


@pytest.mark.parametrize(
    "request_",
    [{"stream": 0}, {"dl_device": (1, 0)}, {"dl_device": (2, 1)}, {"copy": True}],
    ids=["stream 0", "to the host", "to another GPU", "a copy"],
)
def test_dlpack_requests_knopt_cannot_serve_are_refused(
    gpu: FakeGpu, request_: dict[str, Any]
) -> None:
    session = _decoding_session()
    _prefill(session)
    logits = _decode(session, gpu, 4)
    with pytest.raises(knopt.ResultError):
        logits.__dlpack__(**request_)
    logits.__dlpack__(stream=5, dl_device=(2, 0), copy=False)


def test_the_cuda_array_interface_waits_for_the_run_on_the_host(gpu: FakeGpu) -> None:
    session = _decoding_session()
    _prefill(session)
    logits = _decode(session, gpu, 4)
    syncs = gpu.syncs
    interface = logits.__cuda_array_interface__
    assert gpu.syncs == syncs + 1
    assert interface["stream"] is None  # ready: torch.as_tensor ignores a stream anyway
    assert interface["shape"] == (1, 1, 64)


def test_gpu_feeds_are_viewed_in_order_and_held_until_their_run_is_done(gpu: FakeGpu) -> None:
    session = _decoding_session()
    _prefill(session)
    ids = gpu.device_array(np.ones((1, 1), np.int64))
    _decode(session, gpu, 4, ids)
    gpu.held.clear()
    _decode(session, gpu, 5, ids)
    assert ids.streams[-1] == gpu.stream_handle  # its producer orders knopt's stream after it
    assert gpu.held == [(ids,)]
    wrong = gpu.device_array(np.ones((1, 1), np.int32))  # checked though a view passed before
    with pytest.raises(knopt.InputError, match="input 'input_ids' is int32"):
        _decode(session, gpu, 6, wrong)
