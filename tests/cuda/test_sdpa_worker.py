"""cuDNN attention plans built in a helper process: its protocol (a real child process, a
stand-in build), the runtime taking a later size's plan when it arrives (a stand-in GPU), and on
the GPU a new size that switches from knopt's kernel to cuDNN's with equal results."""

from __future__ import annotations

import sys
import types
from typing import Any, ClassVar, cast

import numpy as np
import pytest

from knopt.cuda import sdpa_worker
from knopt.cuda.gen import attention
from knopt.cuda.planner import build_plan
from knopt.cuda.sdpa_worker import BuildFailed, PlanBuilder
from knopt.cuda.steps import Sdpa
from knopt.ir.dtype import DType
from tests.cuda.fake_gpu import FakeLibraryPlan, fake_gpu
from tests.cuda.test_attention import Case, _mask, attention_program

# A helper whose "plan" is the request's graph spec written back twice, with a newline and a
# zero byte in it (the reply is framed by its size, not by lines); a negative scale is
# declined as cuDNN declines a graph.
_ECHO = """
import json, sys
from knopt.cuda.sdpa_worker import serve
def build(spec):
    if spec["scale"] < 0:
        raise ValueError("no engine for this graph")
    return json.dumps(spec).encode() + b"\\n\\x00" + json.dumps(spec).encode()
serve(sys.stdin.buffer, sys.stdout.buffer, build)
"""


@pytest.fixture(autouse=True)
def _cudnn_and_helper_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(attention.SDPA_ENV, raising=False)
    monkeypatch.delenv(sdpa_worker.WORKER_ENV, raising=False)


def _spec(scale: float) -> dict[str, Any]:
    return {"dtype": "f16", "q": [[1, 2, 3, 4], [24, 12, 4, 1]], "scale": scale}


def test_the_helper_answers_each_request_with_its_plan_or_why_not() -> None:
    builder = PlanBuilder(command=[sys.executable, "-c", _ECHO])
    try:
        first, declined, second = (builder.submit(_spec(s)) for s in (0.125, -1.0, 0.5))
        assert len({first, declined, second}) == 3
        got = builder.result(second, timeout=30)
        assert isinstance(got, bytes)
        text = got.decode()
        assert text.count('"scale": 0.5') == 2 and "\n\x00" in text
        failed = builder.result(declined, timeout=30)
        assert failed == BuildFailed("no engine for this graph", lost=False)
        assert builder.result(first, timeout=30) == (
            b'{"dtype": "f16", "q": [[1, 2, 3, 4], [24, 12, 4, 1]], "scale": 0.125}\n\x00'
            b'{"dtype": "f16", "q": [[1, 2, 3, 4], [24, 12, 4, 1]], "scale": 0.125}'
        )
        assert not builder.lost
    finally:
        builder.close()
    gone = builder.result(builder.submit(_spec(1.0)), timeout=30)
    assert isinstance(gone, BuildFailed) and gone.lost
    assert builder.lost


def test_a_helper_that_dies_is_reported_lost_not_waited_for() -> None:
    builder = PlanBuilder(command=[sys.executable, "-c", "import sys; sys.exit(3)"])
    try:
        found = builder.result(builder.submit(_spec(1.0)), timeout=30)
        assert isinstance(found, BuildFailed) and found.lost
    finally:
        builder.close()


def test_one_helper_serves_the_process_until_it_is_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    class Helper:
        lost = False

        def __init__(self, device: int) -> None:
            self.device = device

    monkeypatch.setattr(sdpa_worker, "PlanBuilder", Helper)
    monkeypatch.setattr(sdpa_worker, "_SHARED", {})
    first = cast(Any, sdpa_worker.shared_builder(0))
    assert id(sdpa_worker.shared_builder(0)) == id(first)
    assert id(sdpa_worker.shared_builder(1)) != id(first)
    first.lost = True
    again = cast(Any, sdpa_worker.shared_builder(0))
    assert id(again) != id(first) and again.device == 0


def test_an_answer_discarded_is_not_kept() -> None:
    builder = PlanBuilder(command=[sys.executable, "-c", _ECHO])
    try:
        early, late = builder.submit(_spec(0.125)), builder.submit(_spec(0.25))
        builder.discard(early)  # before its answer came
        assert isinstance(builder.result(late, timeout=30), bytes)
        assert builder.result(early, timeout=0.0) is None
        assert not builder._results and not builder._dropped
    finally:
        builder.close()


def test_a_graph_spec_is_the_steps_views_scale_and_mask() -> None:
    case = Case(DType.BF16, 2, 4, 64, 64, 64, 64, "export", "padding")
    plan = build_plan(attention_program(case, _mask(case, np.random.default_rng(0))))
    (step,) = (s for s in plan.steps if isinstance(s, Sdpa))
    spec = sdpa_worker.graph_spec(step)
    assert spec["dtype"] == "bf16" and spec["causal"] is False
    assert spec["scale"] == pytest.approx(step.scale)
    assert spec["q"] == [list(step.q_view.dims), list(step.q_view.strides)]
    assert step.bias_view is not None
    assert spec["bias"] == [list(step.bias_view.dims), list(step.bias_view.strides)]


# ---- the runtime taking plans built elsewhere (a stand-in GPU) --------------------------------


class _Dnn:
    """A cuDNN that serves every graph, built here or loaded from the helper's bytes."""

    def __init__(self, gpu: object = None) -> None:
        self.built: list[object] = []
        self.loaded: list[tuple[object, bytes]] = []
        self.declined: dict[object, str] = {}

    def plan(self, step: object) -> FakeLibraryPlan:
        self.built.append(step)
        return FakeLibraryPlan(step)

    def load_attention(self, step: object, blob: bytes) -> FakeLibraryPlan:
        self.loaded.append((step, blob))
        return FakeLibraryPlan(step)


class _Builder:
    """A helper process whose answers the test hands out."""

    made: ClassVar[list[_Builder]] = []

    def __init__(self, device: int = 0) -> None:
        self.specs: list[dict[str, Any]] = []
        self.answers: dict[int, bytes | BuildFailed] = {}
        self.lost = False
        _Builder.made.append(self)

    def submit(self, spec: dict[str, Any]) -> int:
        self.specs.append(spec)
        return len(self.specs) - 1

    def result(self, ticket: int, timeout: float | None = 0.0) -> bytes | BuildFailed | None:
        return self.answers.get(ticket)

    def discard(self, ticket: int) -> None:
        self.answers.pop(ticket, None)


def _executables(monkeypatch: pytest.MonkeyPatch, lengths: tuple[int, ...]) -> tuple[Any, ...]:
    """A fake runtime, its cuDNN, and an executable per sequence length (one attention each)."""
    pytest.importorskip("cuda.core", reason="the executor needs cuda-python (not a GPU)")
    from knopt.cuda import executor

    module = types.ModuleType("knopt.cuda.dnn")
    module.Dnn = _Dnn  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "knopt.cuda.dnn", module)
    _Builder.made.clear()

    def shared(device: int) -> _Builder:
        return _Builder.made[0] if _Builder.made else _Builder(device)

    monkeypatch.setattr(executor, "shared_builder", shared)
    runtime = executor.Runtime()
    made = []
    for length in lengths:
        case = Case(DType.F16, 2, 4, length, length, 64, 64, "dense", "padding")
        program = attention_program(case, _mask(case, np.random.default_rng(length)))
        feeds = {
            name: np.ones(program.tensors[tid].type.shape, np.float16)  # type: ignore[type-var]
            for name, tid in zip(program.input_names, program.inputs, strict=True)
        }
        made.append((executor.Executable(build_plan(program), runtime=runtime), feeds))
    return runtime, made


def _ran(gpu: Any, executable: Any, feeds: dict[str, Any]) -> tuple[bool, bool]:
    """Run once; whether knopt's attention kernel and the NaN-rows fixup were launched."""
    (step,) = (s for s in executable.plan.steps if isinstance(s, Sdpa))
    gpu.launches.clear()
    executable.run(feeds)
    names = {name for name, _, _ in gpu.launches}
    assert step.fixup is not None
    direct = executable.launches[step.direct][0].name
    fixup = executable.launches[step.fixup][0].name
    return direct in names, fixup in names


def test_a_later_size_runs_knopts_kernel_until_cudnns_plan_arrives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with fake_gpu(monkeypatch) as gpu:
        runtime, [(first, first_feeds), (later, feeds)] = _executables(monkeypatch, (64, 96))
        # The first plan's attention is built here; no helper is started for it.
        assert runtime.dnn is not None and len(runtime.dnn.built) == 1
        (builder,) = _Builder.made
        assert len(builder.specs) == 1 and builder.specs[0]["q"][0][2] == 96
        assert _ran(gpu, first, first_feeds) == (False, True)
        # The later size: knopt's kernel (which writes its NaN rows itself) until the plan is in.
        assert "(cuDNN's plan on its way)" in later.describe()
        assert _ran(gpu, later, feeds) == (True, False)
        assert _ran(gpu, later, feeds) == (True, False)  # captured, replayed
        assert gpu.captures == 1
        assert not runtime.wait_for_plans(timeout=0.0)
        builder.answers[0] = b"plan bytes"
        assert runtime.wait_for_plans(timeout=0.0)
        assert [blob for _, blob in runtime.dnn.loaded] == [b"plan bytes"]
        # The next run takes it: cuDNN's call and the fixup, run eagerly, then captured anew.
        assert _ran(gpu, later, feeds) == (False, True)
        assert "[fused]" in later.describe() and "on its way" not in later.describe()
        assert _ran(gpu, later, feeds) == (False, True)
        assert gpu.captures == 2
        assert len(runtime.dnn.built) == 1  # nothing of it was built here


def test_a_declined_or_lost_plan_leaves_or_builds_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    with fake_gpu(monkeypatch) as gpu:
        runtime, [_, (declined, feeds), (lost, lost_feeds)] = _executables(
            monkeypatch, (64, 96, 128)
        )
        (builder,) = _Builder.made
        builder.answers[0] = BuildFailed("no engine", lost=False)
        builder.answers[1] = BuildFailed("the helper process exited (code 1)", lost=True)
        assert _ran(gpu, declined, feeds) == (True, False)
        assert "[direct]" in declined.describe()
        assert any("no engine" in why for why in runtime.dnn.declined.values())
        # A lost helper's plan is built here instead, at the next run.
        assert _ran(gpu, lost, lost_feeds) == (False, True)
        assert len(runtime.dnn.built) == 2 and not runtime.dnn.loaded


def test_without_the_helper_every_plan_is_built_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(sdpa_worker.WORKER_ENV, "0")
    with fake_gpu(monkeypatch) as gpu:
        runtime, [_, (later, feeds)] = _executables(monkeypatch, (64, 96))
        assert not _Builder.made and len(runtime.dnn.built) == 2
        assert _ran(gpu, later, feeds) == (False, True)


# ---- on the GPU --------------------------------------------------------------------------------


@pytest.mark.cuda
def test_a_new_size_switches_to_cudnns_plan_with_equal_results(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from knopt.cuda import executor

    rng = np.random.default_rng(5)
    runtime = executor.Runtime()
    try:
        made = []
        for length in (64, 131):
            case = Case(DType.F16, 2, 4, length, length, 64, 64, "export", "padding")
            program = attention_program(case, _mask(case, rng))
            feeds = {
                name: rng.standard_normal(program.tensors[tid].type.shape).astype(np.float16)  # type: ignore[arg-type]
                for name, tid in zip(program.input_names, program.inputs, strict=True)
            }
            made.append((executor.Executable(build_plan(program), runtime=runtime), feeds))
        later, feeds = made[1]
        assert "on its way" in later.describe()
        before = later.run(feeds)[0].astype(np.float32)
        assert runtime.wait_for_plans(timeout=120)
        after = later.run(feeds)[0].astype(np.float32)
        assert "[fused]" in later.describe(), runtime.dnn and runtime.dnn.declined
        assert np.isfinite(before).all()
        np.testing.assert_allclose(after, before, rtol=2e-2, atol=2e-2)
        assert np.abs(after - before).max() > 0  # cuDNN's kernel, not knopt's again
        np.testing.assert_array_equal(later.run(feeds)[0].astype(np.float32), after)
    finally:
        runtime.close()
