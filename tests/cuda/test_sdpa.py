"""cuDNN's fused attention: which attentions the lowering gives it, as which views, the step's
bookkeeping and its fallback dry-run without a GPU, and on the GPU cuDNN's results against the
CPU oracle on transformer layouts (and knopt's kernel when cuDNN declines)."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from knopt.cuda.gen import attention
from knopt.cuda.gen.attention_views import attention_views
from knopt.cuda.planner import build_plan
from knopt.cuda.steps import (
    AttentionView,
    Buf,
    Launch,
    Sdpa,
    describe_step,
    kernel_launches,
    map_step_tensors,
    step_tensors,
)
from knopt.ir.dtype import DType
from tests.cuda.fake_gpu import FakeLibraryPlan, fake_gpu
from tests.cuda.programs import loaded_nvrtc
from tests.cuda.test_attention import Case, _mask, attention_program, check_case

F16, BF16, F32 = DType.F16, DType.BF16, DType.F32


@pytest.fixture(autouse=True)
def _cudnn_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(attention.SDPA_ENV, raising=False)


def _steps(case: Case) -> list[Sdpa | Launch]:
    plan = build_plan(attention_program(case, _mask(case, np.random.default_rng(0))))
    return [s for s in plan.steps if isinstance(s, Sdpa | Launch)]


def _sdpa(case: Case) -> Sdpa:
    (step,) = _steps(case)
    assert isinstance(step, Sdpa), describe_step(step)
    return step


# ---- which attentions go to cuDNN (no GPU) ----------------------------------------------------


def test_a_bert_padding_mask_is_a_bias_broadcast_over_heads_and_rows() -> None:
    step = _sdpa(Case(F16, 4, 12, 197, 197, 64, 64, "export", "padding"))
    # q, k and v are read in place from [b, s, h * d]: [b, h, s, d] views over them.
    assert step.q_view == AttentionView((4, 12, 197, 64), (197 * 768, 64, 768, 1))
    assert step.k_view == step.q_view and step.v_view == step.q_view
    assert step.bias_view == AttentionView((4, 1, 1, 197), (197, 197, 197, 1))
    assert step.bias is not None and not step.causal
    assert step.scale == pytest.approx(1 / 8)
    assert step.direct.name.startswith("kn_attention_mma")


def test_one_fused_projection_is_read_in_place_three_ways() -> None:
    step = _sdpa(Case(BF16, 2, 12, 128, 128, 64, 64, "fused_qkv", "none"))
    assert step.q_view.strides == (128 * 2304, 64, 2304, 1)
    assert step.k_view.strides == step.q_view.strides
    assert step.bias is None and step.bias_view is None and not step.causal


@pytest.mark.parametrize("mask", ["causal", "causal_finite"])
def test_a_causal_mask_is_cudnns_not_a_bias(mask: str) -> None:
    step = _sdpa(Case(BF16, 2, 12, 431, 431, 64, 64, "export", mask))
    assert step.causal and step.bias is None and step.bias_view is None


def test_merged_heads_are_the_output_view_cudnn_writes() -> None:
    case = Case(F16, 4, 12, 128, 128, 64, 64, "fused_qkv", "padding")
    plan = build_plan(attention_program(case, _mask(case, np.random.default_rng(0)), merged=True))
    step, negate = (s for s in plan.steps if isinstance(s, Sdpa | Launch))
    assert isinstance(step, Sdpa) and isinstance(negate, Launch)
    # [b, h, s, e] written as [b, s, h * e]: the reshape after it reads it in place.
    assert step.out_view == AttentionView((4, 12, 128, 64), (128 * 768, 64, 768, 1))
    read = plan.tensors[negate.args[1].tensor]  # type: ignore[union-attr]
    assert read.buffer == plan.tensors[step.out].buffer and read.layout.is_contiguous


def test_grouped_queries_give_k_and_v_fewer_heads() -> None:
    step = _sdpa(Case(F16, 2, 16, 128, 128, 128, 128, "gqa", "causal"))
    q_heads = step.q_view.dims[0] * step.q_view.dims[1]
    kv_heads = step.k_view.dims[0] * step.k_view.dims[1]
    assert q_heads == 32 and kv_heads == 16 and step.v_view.dims == step.k_view.dims


@pytest.mark.parametrize(
    "case",
    [
        Case(F16, 1, 32, 1, 1000, 128, 128, "cache", "padding"),  # decoding: the split kernel
        Case(F16, 1, 32, 16, 1000, 128, 128, "cache", "padding"),
        Case(F32, 2, 3, 197, 197, 64, 64, "export", "causal"),  # f32 stays exact
        Case(F16, 2, 2, 33, 33, 20, 20, "dense", "causal"),  # the exact kernel's head size
        Case(F16, 2, 3, 100, 100, 64, 64, "k_transposed", "none"),  # k's rows are strided
    ],
    ids=str,
)
def test_decoding_f32_and_unreadable_operands_stay_on_knopts_kernels(case: Case) -> None:
    assert not any(isinstance(s, Sdpa) for s in _steps(case))


def test_the_switch_keeps_the_kernel_the_step_would_fall_back_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    case = Case(F16, 4, 12, 128, 128, 64, 64, "export", "padding")
    step = _sdpa(case)
    monkeypatch.setenv(attention.SDPA_ENV, "0")
    assert _steps(case) == [step.direct]


def test_a_bias_broadcast_over_part_of_the_heads_is_not_cudnns() -> None:
    dense = (12 * 2048, 3 * 2048, 2048, 64, 1)
    g = attention.Geometry(
        32, 32, 64, 64, (2, 4, 3), (dense, dense, dense, (0, 1024, 0, 32, 1), dense), (0,) * 5
    )
    assert attention.sdpa_views(g, attention.BiasMode.TENSOR) is None
    views = attention.sdpa_views(g, attention.BiasMode.NONE)
    assert views is not None and views[0].dims == (2, 12, 32, 64) and views[4] is None


def test_one_key_head_for_every_query_head_is_multi_query_attention() -> None:
    q = (4 * 8 * 2048, 8 * 2048, 2048, 64, 1)
    kv = (4 * 2048, 0, 0, 64, 1)  # [b, 1, 1, t, d] broadcast over both head axes
    views = attention_views((32, 32, 64, 64), (2, 4, 8), (q, kv, kv, q, q), False)
    assert views is not None
    assert views[0].dims == (2, 32, 32, 64) and views[1].dims == (2, 1, 32, 64)
    assert views[1].strides == (4 * 2048, 2048, 64, 1)  # the head axis of size 1: dense


def test_keys_broadcast_over_the_batch_are_not_cudnns() -> None:
    q = (4 * 2048, 2048, 0, 64, 1)
    kv = (0, 2048, 0, 64, 1)
    assert attention_views((32, 32, 64, 64), (2, 4, 1), (q, kv, kv, q, q), False) is None


# ---- the step's bookkeeping (no GPU) -----------------------------------------------------------


def test_the_step_names_its_tensors_and_its_fallback_kernel() -> None:
    step = _sdpa(Case(F16, 2, 4, 64, 64, 64, 64, "dense", "padding"))
    assert step.bias is not None and step.fixup is not None
    assert kernel_launches(step) == [step.direct, step.fixup]
    assert [a.tensor for a in step.fixup.args if isinstance(a, Buf)] == [step.bias, step.out]
    tensors = step_tensors(step)
    assert {step.q, step.k, step.v, step.out, step.bias} <= set(tensors)
    renamed = map_step_tensors(step, {t: t + 100 for t in tensors})
    assert isinstance(renamed, Sdpa) and renamed.fixup is not None
    assert step_tensors(renamed) == [t + 100 for t in tensors]
    assert [a.tensor for a in renamed.fixup.args if isinstance(a, Buf)] == [
        step.bias + 100,
        step.out + 100,
    ]
    assert describe_step(step) == "sdpa q[2, 4, 64, 64] k[2, 4, 64, 64] v[2, 4, 64, 64] f16 +bias"


def test_only_a_bias_can_hide_every_key_of_a_row() -> None:
    assert _sdpa(Case(F16, 2, 4, 64, 64, 64, 64, "gqa", "causal")).fixup is None
    step = _sdpa(Case(F16, 2, 3, 64, 64, 64, 64, "dense", "masked_rows"))
    assert step.fixup is not None and step.bias_view is not None
    assert step.bias_view.dims == (1, 1, 64, 64)  # one bias row a query row, for every head
    assert step.fixup.grid[0] * step.fixup.block[0] >= 64 * 32  # a warp a bias row


def test_the_nan_rows_kernel_compiles(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("KNOPT_CACHE_DIR", str(tmp_path))
    nvrtc = loaded_nvrtc()
    fixups = {}
    for case in (
        Case(F16, 2, 3, 64, 64, 64, 64, "dense", "masked_rows"),
        Case(BF16, 4, 12, 128, 128, 64, 64, "export", "padding"),
    ):
        fixup = _sdpa(case).fixup
        assert fixup is not None
        fixups[fixup.name] = fixup.source
    cubin = nvrtc.compile_cubin('#include "common.cuh"\n' + "\n".join(fixups.values()), "sm_90")
    assert all(name.encode() in cubin for name in fixups)


def test_equal_attentions_over_other_tensors_share_one_cudnn_plan() -> None:
    pytest.importorskip("cuda.core", reason="the executor needs cuda-python (not a GPU)")
    from knopt.cuda.executor import _canonical

    step = _sdpa(Case(F16, 2, 4, 64, 64, 64, 64, "dense", "padding"))
    other = map_step_tensors(step, {t: t + 7 for t in step_tensors(step)})
    assert isinstance(other, Sdpa)
    (mine, ids), (theirs, their_ids) = _canonical(step), _canonical(other)
    assert mine == theirs and hash(mine) == hash(theirs)
    assert [their_ids[i] - ids[i] for i in range(5)] == [7] * 5


class _Declining:
    """A cuDNN that declines every attention graph (and serves every convolution)."""

    def __init__(self, gpu: object = None) -> None:
        self.plans: list[object] = []

    def plan(self, step: object) -> FakeLibraryPlan | None:
        self.plans.append(step)
        return None if isinstance(step, Sdpa) else FakeLibraryPlan(step)


@pytest.mark.parametrize("declines", [False, True])
def test_a_declined_graph_runs_knopts_kernel_in_its_place(
    monkeypatch: pytest.MonkeyPatch, declines: bool
) -> None:
    pytest.importorskip("cuda.core", reason="the executor needs cuda-python (not a GPU)")
    from knopt.cuda.executor import Executable

    case = Case(F16, 2, 4, 64, 64, 64, 64, "dense", "padding")
    program = attention_program(case, _mask(case, np.random.default_rng(0)))
    feeds = {
        name: np.ones(program.tensors[tid].type.shape, np.float16)  # type: ignore[type-var]
        for name, tid in zip(program.input_names, program.inputs, strict=True)
    }
    with fake_gpu(monkeypatch) as gpu:
        if declines:
            module = types.ModuleType("knopt.cuda.dnn")
            module.Dnn = _Declining  # type: ignore[attr-defined]
            monkeypatch.setitem(sys.modules, "knopt.cuda.dnn", module)
        executable = Executable(build_plan(program))
        executable.run(feeds)
        assert executable.dnn is not None
        assert any(isinstance(s, Sdpa) for s in executable.dnn.plans)  # type: ignore[attr-defined]
        (step,) = (s for s in executable.plan.steps if isinstance(s, Sdpa))
        kernel = executable.launches[step.direct][0].name
        assert any(name == kernel for name, _, _ in gpu.launches) == declines
        assert ("[direct]" in executable.describe()) == declines
        # The NaN rows follow cuDNN's call only: knopt's kernel writes them itself.
        assert step.fixup is not None
        fixup = executable.launches[step.fixup][0].name
        assert any(name == fixup for name, _, _ in gpu.launches) != declines


# ---- on the GPU ----------------------------------------------------------------------------------

# Attentions as transformer exports give them, which cuDNN is expected to serve.
TRANSFORMER_CASES = [
    # BERT: a padding mask added as a bias, lengths that are not multiples of the tile
    Case(F16, 8, 12, 128, 128, 64, 64, "fused_qkv", "padding"),
    Case(F16, 4, 12, 197, 197, 64, 64, "export", "padding"),
    Case(BF16, 2, 12, 431, 431, 64, 64, "export", "padding"),
    Case(BF16, 8, 12, 128, 128, 64, 64, "export", "padding"),
    # ViT: no mask
    Case(F16, 4, 12, 197, 197, 64, 64, "fused_qkv", "none"),
    # GPT-2: causal, as a -inf or a finite mask
    Case(F16, 4, 12, 128, 128, 64, 64, "export", "causal_finite"),
    Case(BF16, 2, 12, 431, 431, 64, 64, "export", "causal"),
    # Rows whose keys are all -inf: NaN there (cuDNN writes 0; the launch after it, NaN)
    Case(F16, 2, 3, 64, 64, 64, 64, "dense", "masked_rows"),
    Case(BF16, 4, 12, 128, 128, 64, 64, "export", "masked_rows"),
    # LLaMA: grouped queries, causal, head size 64 and 128
    Case(F16, 2, 16, 128, 128, 64, 64, "gqa", "causal"),
    Case(BF16, 1, 32, 256, 256, 128, 128, "gqa", "causal"),
]

# Served by cuDNN or by knopt's kernel, correct either way.
OTHER_CASES = [
    Case(F16, 2, 4, 100, 250, 128, 128, "dense", "causal_finite"),  # more keys than queries
    Case(F16, 2, 3, 70, 45, 64, 32, "dense", "padding"),  # cross attention, e != d
    Case(BF16, 1, 4, 100, 100, 256, 256, "export", "causal"),
    Case(F16, 1, 32, 64, 1000, 128, 128, "cache", "padding"),  # a chunk against a cache
]


def _sdpa_lines(described: str) -> list[str]:
    return [line for line in described.splitlines() if line.startswith("sdpa")]


@pytest.mark.cuda
@pytest.mark.parametrize("case", OTHER_CASES, ids=str)
def test_attention_cudnn_may_decline_matches_the_cpu(case: Case, rng: np.random.Generator) -> None:
    check_case(case, rng)


@pytest.mark.cuda
@pytest.mark.parametrize("case", TRANSFORMER_CASES, ids=str)
def test_transformer_attention_runs_in_cudnn_and_matches_the_cpu(
    case: Case, rng: np.random.Generator
) -> None:
    executable = check_case(case, rng)
    lines = _sdpa_lines(executable.describe())
    declined = executable.dnn.declined if executable.dnn is not None else {}
    assert lines and all(line.endswith("[fused]") for line in lines), (lines, declined)


@pytest.mark.cuda
@pytest.mark.parametrize(
    "case",
    [
        Case(F16, 8, 12, 128, 128, 64, 64, "fused_qkv", "padding"),
        Case(BF16, 2, 12, 431, 431, 64, 64, "export", "causal"),
    ],
    ids=str,
)
def test_merged_heads_written_in_place_by_cudnn_match_the_cpu(
    case: Case, rng: np.random.Generator
) -> None:
    executable = check_case(case, rng, merged=True)
    lines = _sdpa_lines(executable.describe())
    assert lines and all(line.endswith("[fused]") for line in lines), lines


@pytest.mark.cuda
def test_a_graph_cudnn_declines_runs_knopts_kernel(
    monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator
) -> None:
    from knopt.cuda import dnn

    def decline(handle: object, step: Sdpa, kernel_cache: object = None) -> None:
        raise RuntimeError("cudnn: GRAPH_NOT_SUPPORTED (planted by the test)")

    monkeypatch.setattr(dnn, "SdpaPlan", decline)
    executable = check_case(Case(F16, 4, 12, 197, 197, 64, 64, "export", "padding"), rng)
    assert _sdpa_lines(executable.describe()) == [
        "sdpa q[4, 12, 197, 64] k[4, 12, 197, 64] v[4, 12, 197, 64] f16 +bias [direct]"
    ]
    assert executable.dnn is not None
    (reason,) = executable.dnn.declined.values()
    assert "planted by the test" in reason
