"""Replayed lowerings (knopt.cuda.replay): a plan that replays equal kernels is the plan that
lowers each kernel, for every fixture, for a session's every size, and where lowering reads
more than a kernel's tensors."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import pytest

import knopt
from knopt.cuda import planner
from knopt.cuda.context import LoweringContext
from knopt.cuda.planner import Plan, build_plan
from knopt.cuda.replay import KernelClasses, WatchedDict, kernel_classes, structure_key
from knopt.cuda.resident import ResidentPlan
from knopt.cuda.steps import (
    Buf,
    Conv,
    Gemm,
    Launch,
    Operand,
    Sdpa,
    Step,
    map_step_tensors,
    step_tensors,
)
from knopt.ir import bind_symbols, infer_sizes
from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.op import Binary
from knopt.ir.program import BinaryE, Const, Kernel, Load, Program, program_from_graph
from tests.cuda.programs import ProgramBuilder
from tests.models import MODELS, Fixture, fixtures

F16, F32 = DType.F16, DType.F32


def assert_same_plan(ours: Plan, theirs: Plan) -> None:
    """Equal steps, tensors, buffers, offsets, constants, inputs and outputs."""
    assert ours.tensors == theirs.tensors
    assert ours.buffers == theirs.buffers
    assert len(ours.steps) == len(theirs.steps)
    for index, (a, b) in enumerate(zip(ours.steps, theirs.steps, strict=True)):
        assert a == b, f"step {index}"
        assert _argument_types(a) == _argument_types(b), f"step {index}"
    assert ours.constants.keys() == theirs.constants.keys()
    for buffer, data in ours.constants.items():
        assert data.dtype == theirs.constants[buffer].dtype
        np.testing.assert_array_equal(data, theirs.constants[buffer])
    assert (ours.inputs, ours.outputs) == (theirs.inputs, theirs.outputs)
    assert (ours.region_bytes, ours.arena_lower_bound) == (
        theirs.region_bytes,
        theirs.arena_lower_bound,
    )


def _argument_types(step: Step) -> list[type]:
    """The types of a step's launch arguments (np.int32(1) == np.int64(1), yet they differ)."""
    if isinstance(step, Launch):
        launches: list[Launch | None] = [step]
    else:
        launches = [step.direct, step.fixup] if isinstance(step, Sdpa) else [step.fallback]
    return [type(a) for launch in launches if launch is not None for a in launch.args]


def _lowered_kernel_by_kernel(
    program: Program, precision: str = "f32", resident: ResidentPlan | None = None
) -> Plan:
    return build_plan(program, precision, resident, (None,) * len(program.kernels))


@pytest.fixture
def lowerings(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Kernel]]:
    """The kernels the planner lowers (not replays), in order."""
    lowered: list[Kernel] = []
    lower = planner.lower_kernel

    def counted(ctx: LoweringContext, kernel: Kernel) -> None:
        lowered.append(kernel)
        lower(ctx, kernel)

    monkeypatch.setattr(planner, "lower_kernel", counted)
    yield lowered


# ---- equal plans -----------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", fixtures(), ids=lambda f: f.file)
def test_every_fixture_plans_alike_with_and_without_replay(fixture: Fixture) -> None:
    graph = knopt.load(fixture.path)
    if graph.symbols():
        shapes = {k: v.shape for k, v in fixture.feeds().items()}
        graph = bind_symbols(graph, infer_sizes(graph, shapes))
    program = program_from_graph(graph)
    assert_same_plan(build_plan(program), _lowered_kernel_by_kernel(program))


def test_a_session_plans_every_size_alike_with_and_without_replay(
    monkeypatch: pytest.MonkeyPatch, lowerings: list[Kernel]
) -> None:
    pytest.importorskip("cuda.core", reason="the cuda runner needs cuda-python (not a GPU)")
    from knopt.cuda import runner
    from tests.cuda.fake_gpu import fake_gpu

    checked: list[Program] = []
    build = runner.build_plan

    def both_ways(
        program: Program,
        precision: str,
        resident: ResidentPlan | None,
        classes: KernelClasses | None,
    ) -> Plan:
        plan = build(program, precision, resident, classes)
        assert_same_plan(plan, _lowered_kernel_by_kernel(program, precision, resident))
        checked.append(program)
        return plan

    monkeypatch.setattr(runner, "build_plan", both_ways)
    with fake_gpu(monkeypatch):
        session = knopt.compile(
            MODELS / "bert_ts14.onnx",
            "cuda",
            precision="fp16",
            dims={"batch": (1, 2, 4), "seq": (1, 8, 16)},
        )
        lowerings.clear()
        for batch, seq in ((2, 8), (3, 11), (1, 1), (4, 16)):
            ids = np.ones((batch, seq), np.int64)
            session.run(None, {"input_ids": ids, "attention_mask": ids})
    assert len(checked) > 4  # the sizes run, the profile's kinds warmed, probes
    work = sum(1 for program in checked for k in program.kernels if not k.is_view)
    # Each plan was built twice; with replay, the second layer's kernels were not lowered.
    assert len(lowerings) - work < 0.8 * work


def test_decoding_steps_plan_alike_with_and_without_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("cuda.core", reason="the cuda runner needs cuda-python (not a GPU)")
    from knopt.cuda import runner
    from tests.cuda.fake_gpu import fake_gpu

    residents: list[ResidentPlan | None] = []
    build = runner.build_plan

    def both_ways(
        program: Program,
        precision: str,
        resident: ResidentPlan | None,
        classes: KernelClasses | None,
    ) -> Plan:
        plan = build(program, precision, resident, classes)
        assert_same_plan(plan, _lowered_kernel_by_kernel(program, precision, resident))
        residents.append(resident)
        return plan

    monkeypatch.setattr(runner, "build_plan", both_ways)
    caches = {
        f"present.{i}.{kv}": f"past_key_values.{i}.{kv}"
        for i in range(2)
        for kv in ("key", "value")
    }
    with fake_gpu(monkeypatch):
        session = knopt.compile(
            MODELS.parent / "decoder" / "llama_kv_ts17.onnx",
            "cuda",
            precision="fp16",
            dims={"batch": (1, 1, 2), "seq": (1, 4, 8), "past": (0, 8, 100)},
            resident=caches,
            cache_mask="attention_mask",
        )
        feeds = {
            "input_ids": np.ones((1, 4), np.int64),
            "attention_mask": np.ones((1, 4), np.int64),
            "position_ids": np.arange(4)[None],
        }
        session.run(["logits"], feeds)
        for position in range(4, 8):
            step = {
                "input_ids": np.ones((1, 1), np.int64),
                "attention_mask": np.ones((1, position + 1), np.int64),
                "position_ids": np.array([[position]]),
            }
            session.run(["logits"], step)
    assert any(resident is not None for resident in residents)


# ---- what lowering reads beyond a kernel's tensors ---------------------------------------


def _attention_pair(masks: list[np.ndarray]) -> Program:
    """Attention kernels of one class and shape over constant biases (read when lowering)."""
    p = ProgramBuilder()
    q = p.input("q", (1, 2, 16, 32), F16)
    outputs = []
    for mask in masks:
        bias = p.view(
            ops.Broadcast((1, 2, 16, 16)), p.constant(mask.astype(np.float16)[None, None])
        )
        outputs.append(p.op(ops.Attention(0.25), (q, q, q, bias)))
    return p.build(outputs)


def test_lowerings_that_read_constant_values_are_not_replayed(lowerings: list[Kernel]) -> None:
    causal = np.triu(np.full((16, 16), -1e4), 1)
    program = _attention_pair([np.zeros((16, 16)), causal, causal])
    classes = kernel_classes(program)
    attention = [classes[i] for i, k in enumerate(program.kernels) if k.kind == "Attention"]
    assert len(set(attention)) == 1
    plan = build_plan(program, "fp16")
    assert [k.kind for k in lowerings].count("Attention") == 3
    sources = [s.source for s in plan.steps if isinstance(s, Launch)]
    assert len(set(sources)) == 2  # no bias, then a causal one twice
    assert_same_plan(plan, _lowered_kernel_by_kernel(program, "fp16"))


def test_tensors_read_twice_and_signed_zeros_are_told_apart(lowerings: list[Kernel]) -> None:
    p = ProgramBuilder()
    x, y = p.input("x", (4, 8)), p.input("y", (4, 8))
    square = BinaryE(Binary.MUL, Load(0), Load(1))
    outputs = [
        p.kernel("elementwise", None, (x, x), (4, 8), F32, body=square),
        p.kernel("elementwise", None, (x, y), (4, 8), F32, body=square),
        p.kernel("elementwise", None, (y, y), (4, 8), F32, body=square),
    ]
    for zero in (0.0, -0.0, 0.0):
        body = BinaryE(Binary.ADD, Load(0), Const(zero, F32))
        outputs.append(p.kernel("elementwise", None, (x,), (4, 8), F32, body=body))
    program = p.build(outputs)
    classes = kernel_classes(program)
    assert classes[0] == classes[1] == classes[2]
    assert classes[3] == classes[5] != classes[4]
    plan = build_plan(program)
    assert len(lowerings) == 4  # (x, x) and (x, y); +0.0 and -0.0
    assert plan.steps[0] == map_step_tensors(plan.steps[2], {y: x, outputs[2]: outputs[0]})
    assert "-0.0" in plan.steps[4].source and "-0.0" not in plan.steps[5].source  # type: ignore[union-attr]
    assert_same_plan(plan, _lowered_kernel_by_kernel(program))


# ---- the parts -------------------------------------------------------------------------------


def test_structure_keys_are_exact() -> None:
    assert structure_key(0.0) != structure_key(-0.0)
    assert structure_key(1) != structure_key(1.0)
    assert structure_key(1) != structure_key(True)
    assert structure_key(DType.F32) != structure_key(1)
    assert structure_key(np.float32(2.5)) != structure_key(np.float64(2.5))
    assert structure_key(np.float64(2.5)) != structure_key(2.5)
    assert structure_key(Const(0.5, F16)) == structure_key(Const(0.5, F16))
    assert structure_key((1, (2.0, "a"))) != structure_key([1, (2.0, "a")])


def test_a_watched_dict_notes_reads_and_writes() -> None:
    watched = WatchedDict(keys_read=False)
    watched[1] = "a"
    assert watched.read
    watched.read = False
    assert 1 in watched and 2 not in watched and watched.get(2) is None
    assert not watched.read  # asking for a key is no read here, only reading its value
    reads = (
        lambda d: d.get(1),
        lambda d: d[1],
        lambda d: list(d),
        lambda d: d.items(),
        lambda d: d.values(),
    )
    for read in reads:
        watched.read = False
        read(watched)
        assert watched.read
    strict = WatchedDict(keys_read=True)
    assert 2 not in strict and strict.read
    strict.read = False
    assert strict.get(2) is None and strict.read


def _steps() -> list[Step]:
    fallback = Launch("k", "src", (1, 1, 1), (32, 1, 1), (Buf(5), np.int32(3), Buf(6)))
    gemm = Gemm(
        Operand(1, 4, 8, 8, 1, 0),
        Operand(2, 8, 4, 4, 1, 0),
        Operand(3, 4, 4, 4, 1, 0),
        1,
        F32,
        "f32",
        bias=4,
        residual=Operand(7, 4, 4, 4, 1, 0),
        activation="relu",
        fallback=fallback,
    )
    conv = Conv(
        1, 2, 3, (1, 2, 4, 4), (2, 2, 1, 1), (1, 2, 4, 4), (1, 1), ((0, 0), (0, 0)), (1, 1), 1,
        F32, "f32", bias=4, residual=7, fallback=fallback,
        direct=Launch("d", "src", (1, 1, 1), (1, 1, 1), (Buf(3), Buf(1), Buf(2))),
    )  # fmt: skip
    return [fallback, gemm, conv]


@pytest.mark.parametrize("step", _steps(), ids=lambda s: type(s).__name__)
def test_mapping_a_step_maps_every_tensor_it_reads_or_writes(step: Step) -> None:
    new = {t: 100 + t for t in range(10)}
    mapped = map_step_tensors(step, new)
    assert step_tensors(mapped) == [new[t] for t in step_tensors(step)]
    back = map_step_tensors(mapped, {v: k for k, v in new.items()})
    assert back == step
    assert type(mapped) is type(step)


def test_an_operand_of_another_tensor_keeps_every_other_field() -> None:
    operand = Operand(**{f.name: 10 + i for i, f in enumerate(dataclasses.fields(Operand))})
    assert operand.with_tensor(3) == dataclasses.replace(operand, tensor=3)
