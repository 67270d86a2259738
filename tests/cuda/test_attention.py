"""Attention kernels: the planner's choice, sizes as launch arguments, every variant compiling
for sm_90 through NVRTC (no GPU needed), and on the GPU the tensor-core, decode and exact kernels
against the CPU oracle on layouts and masks as transformer exports produce them."""

from __future__ import annotations

import itertools
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import ml_dtypes
import numpy as np
import pytest

from knopt.cpu.program import run_program
from knopt.cuda.gen import attention
from knopt.cuda.planner import Plan, build_plan
from knopt.cuda.steps import Buf, Gemm, Launch, Step
from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.program import Program
from tests.cuda.programs import ProgramBuilder, loaded_nvrtc, random_array

if TYPE_CHECKING:
    from knopt.cuda.executor import Executable

F16, BF16, F32 = DType.F16, DType.BF16, DType.F32


@pytest.fixture(autouse=True)
def _knopt_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """This file tests knopt's own kernels; tests/cuda/test_sdpa.py tests cuDNN's."""
    monkeypatch.setenv(attention.SDPA_ENV, "0")


# ---- programs with one Attention op ------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One attention: sizes, how q/k/v sit in memory, and the mask.

    Layouts: "dense" [b, h, s, d] inputs; "export" [b, s, h * d] inputs viewed and permuted to
    heads (what torch exports); "fused_qkv" one [b, s, h * (2d + e)] projection sliced three
    ways; "k_transposed" k given as [b, h, d, t]; "gqa" q [b, h/2, 2, s, d] with k and v
    broadcast over the group axis; "cache" k and v sliced from a longer [b, h, t + 37, d] cache.
    Masks: "none" (a zero constant), "padding" (the dtype's lowest value on random keys of each
    batch, broadcast over heads and rows), "causal" (-inf above the diagonal, aligned to the last
    key), "causal_finite" (the dtype's lowest instead of -inf, as exporters write it),
    "masked_rows" (rows 0 and s // 2 all -inf: NaN, as the CPU oracle gives).
    """

    dtype: DType
    batch: int
    heads: int
    s: int
    t: int
    d: int
    e: int
    layout: str = "dense"
    mask: str = "none"

    def __str__(self) -> str:
        return (
            f"{self.dtype.short}-b{self.batch}h{self.heads}-s{self.s}t{self.t}-d{self.d}e{self.e}"
            f"-{self.layout}-{self.mask}"
        )

    @property
    def lead(self) -> tuple[int, ...]:
        if self.layout == "gqa":
            return (self.batch, self.heads // 2, 2)
        return (self.batch, self.heads)


def _mask(case: Case, rng: np.random.Generator) -> np.ndarray:
    rank = len(case.lead) + 2
    lowest = float(ml_dtypes.finfo(case.dtype.numpy).min)
    if case.mask == "none":
        return np.zeros((1,) * rank, np.float32)
    if case.mask == "padding":
        keep = rng.random((case.batch, case.t)) >= 0.25
        keep[:, 0] = True
        shape = (case.batch,) + (1,) * (rank - 2) + (case.t,)
        return np.where(keep, 0.0, lowest).astype(np.float32).reshape(shape)
    rows = np.arange(case.s)[:, None]
    keys = np.arange(case.t)[None, :]
    if case.mask in ("causal", "causal_finite"):
        hidden = -np.inf if case.mask == "causal" else lowest
        mask = np.where(keys > rows + (case.t - case.s), hidden, 0.0)
    else:
        assert case.mask == "masked_rows", case.mask
        mask = np.zeros((case.s, case.t))
        mask[[0, case.s // 2]] = -np.inf
    return mask.astype(np.float32).reshape((1,) * (rank - 2) + (case.s, case.t))


def _heads_view(p: ProgramBuilder, x: int, batch: int, length: int, heads: int, size: int) -> int:
    """[batch, length, heads * size] -> [batch, heads, length, size] (a view)."""
    x = p.view(ops.View((batch, length, heads, size)), x)
    return p.view(ops.Permute((0, 2, 1, 3)), x)


def _operands(p: ProgramBuilder, case: Case, dtype: DType) -> tuple[int, int, int]:
    b, h, s, t, d, e = case.batch, case.heads, case.s, case.t, case.d, case.e
    if case.layout == "export":
        q = _heads_view(p, p.input("q", (b, s, h * d), dtype), b, s, h, d)
        k = _heads_view(p, p.input("k", (b, t, h * d), dtype), b, t, h, d)
        v = _heads_view(p, p.input("v", (b, t, h * e), dtype), b, t, h, e)
        return q, k, v
    if case.layout == "fused_qkv":
        assert s == t, case
        x = p.input("qkv", (b, s, h * (2 * d + e)), dtype)
        edges = (0, h * d, 2 * h * d, h * (2 * d + e))
        parts = [p.view(ops.Slice(2, lo, hi), x) for lo, hi in itertools.pairwise(edges)]
        sizes = (d, d, e)
        q, k, v = (_heads_view(p, x, b, s, h, n) for x, n in zip(parts, sizes, strict=True))
        return q, k, v
    if case.layout == "gqa":
        lead = case.lead
        q = p.input("q", (*lead, s, d), dtype)
        k = p.input("k", (*lead[:2], 1, t, d), dtype)
        v = p.input("v", (*lead[:2], 1, t, e), dtype)
        k = p.view(ops.Broadcast((*lead, t, d)), k)
        v = p.view(ops.Broadcast((*lead, t, e)), v)
        return q, k, v
    q = p.input("q", (b, h, s, d), dtype)
    if case.layout == "k_transposed":
        k = p.view(ops.Permute((0, 1, 3, 2)), p.input("k", (b, h, d, t), dtype))
        return q, k, p.input("v", (b, h, t, e), dtype)
    if case.layout == "cache":
        k = p.view(ops.Slice(2, 0, t), p.input("k", (b, h, t + 37, d), dtype))
        v = p.view(ops.Slice(2, 0, t), p.input("v", (b, h, t + 37, e), dtype))
        return q, k, v
    assert case.layout == "dense", case.layout
    return q, p.input("k", (b, h, t, d), dtype), p.input("v", (b, h, t, e), dtype)


def attention_program(
    case: Case, mask: np.ndarray, dtype: DType | None = None, *, merged: bool = False
) -> Program:
    """One Attention op over `case`'s layouts, computing in `dtype` (default: the case's).

    Args:
        merged: Merge the heads back as transformers do: the output permuted to
            [b, s, h, e], reshaped to [b, s, h * e] and negated (a kernel reads the reshape).
    """
    dtype = dtype or case.dtype
    p = ProgramBuilder()
    q, k, v = _operands(p, case, dtype)
    bias = p.view(ops.Broadcast((*case.lead, case.s, case.t)), p.constant(mask.astype(dtype.numpy)))
    out = p.op(ops.Attention(1.0 / np.sqrt(case.d)), (q, k, v, bias))
    if merged:
        assert len(case.lead) == 2, case
        out = p.view(ops.Permute((0, 2, 1, 3)), out)
        out = p.view(ops.View((case.batch, case.s, case.heads * case.e)), out)
        out = p.op(ops.UnaryOp(ops.Unary.NEG), (out,))
    return p.build([out])


# ---- planning (no GPU) -------------------------------------------------------------------------


def _launches(case: Case) -> list[Launch]:
    mask = _mask(case, np.random.default_rng(0))
    plan = build_plan(attention_program(case, mask))
    return [step for step in plan.steps if isinstance(step, Launch)]


def _flag(launch: Launch, name: str) -> bool:
    found = re.search(rf"constexpr bool {name} = (true|false);", launch.source)
    assert found is not None, name
    return found.group(1) == "true"


def test_half_types_with_head_sizes_in_eights_run_on_tensor_cores() -> None:
    for dtype in (F16, BF16):
        (launch,) = _launches(Case(dtype, 4, 16, 197, 197, 64, 64, "export", "padding"))
        assert launch.name.startswith("kn_attention_mma_")
        assert _flag(launch, "HAS_BIAS") and not _flag(launch, "CAUSAL")


@pytest.mark.parametrize("mask", ["causal", "causal_finite"])
def test_a_causal_mask_is_computed_not_read(mask: str) -> None:
    for dtype, s, t in itertools.product((F16, BF16), (4, 70), (70, 300)):
        launch = _launches(Case(dtype, 4, 16, s, t, 64, 64, "dense", mask))[0]
        assert _flag(launch, "CAUSAL") and not _flag(launch, "HAS_BIAS"), (dtype, s, t)
    # One query row aligned to the last key sees every key: no mask at all.
    launch = _launches(Case(F16, 4, 16, 1, 70, 64, 64, "dense", mask))[0]
    assert not _flag(launch, "CAUSAL") and not _flag(launch, "HAS_BIAS")


def test_masks_that_are_not_causal_are_read() -> None:
    # More queries than keys: the first rows see no key, which a finite mask would average.
    for case in (
        Case(F16, 4, 16, 70, 30, 64, 64, "dense", "causal_finite"),
        Case(F16, 4, 16, 70, 70, 64, 64, "dense", "masked_rows"),
        Case(F16, 4, 16, 70, 70, 64, 64, "gqa", "padding"),
    ):
        launch = _launches(case)[0]
        assert _flag(launch, "HAS_BIAS") and not _flag(launch, "CAUSAL"), case


def test_f32_and_odd_head_sizes_take_the_exact_kernel() -> None:
    for case in (Case(F32, 2, 3, 70, 70, 64, 64), Case(F16, 2, 3, 70, 70, 20, 20)):
        (launch,) = _launches(case)
        assert launch.name.startswith("kn_attention_") and "_mma_" not in launch.name


def test_heads_beyond_256_materialize_the_scores() -> None:
    plan = build_plan(attention_program(Case(F16, 1, 2, 40, 40, 300, 300), np.zeros((1,) * 4)))
    assert sum(isinstance(step, Gemm) for step in plan.steps) == 2


# The fused kernels (tensor cores, and the exact kernel in f32 and at odd head sizes).
MERGED_CASES = [
    Case(F16, 2, 12, 70, 70, 64, 64, "export", "padding"),
    Case(F32, 2, 3, 70, 50, 64, 64, "export", "padding"),
    Case(F16, 2, 3, 70, 70, 20, 20, "fused_qkv", "none"),
]


def _merged_steps(case: Case) -> tuple[Plan, list[Step]]:
    plan = build_plan(attention_program(case, _mask(case, np.random.default_rng(0)), merged=True))
    return plan, [s for s in plan.steps if isinstance(s, Launch | Gemm)]


@pytest.mark.parametrize("case", MERGED_CASES, ids=str)
def test_fused_kernels_write_merged_heads_in_place(case: Case) -> None:
    plan, steps = _merged_steps(case)
    kernel, negate = steps  # no copy between them: the reshape is a view
    assert isinstance(kernel, Launch) and kernel.name.startswith("kn_attention")
    assert isinstance(negate, Launch) and negate.name.startswith("kn_elementwise")
    out = plan.tensors[kernel.args[0].tensor]  # type: ignore[union-attr]
    b, h, s, e = case.batch, case.heads, case.s, case.e
    assert out.shape == (b, h, s, e) and out.layout.strides == (s * h * e, e, h * e, 1)
    read = plan.tensors[negate.args[1].tensor]  # type: ignore[union-attr]
    assert read.buffer == out.buffer and read.layout.is_contiguous


def test_unfused_attention_keeps_its_output_dense() -> None:
    case = Case(F16, 1, 2, 40, 40, 300, 300, "export")
    plan, steps = _merged_steps(case)
    first, second, *_, copy, negate = steps
    assert isinstance(first, Gemm) and isinstance(second, Launch)  # scores, softmax
    assert isinstance(copy, Launch) and isinstance(negate, Launch)
    # The copy reads [1, 40, 2, 300] permuted from the dense [1, 2, 40, 300] the GEMM wrote.
    read = plan.tensors[copy.args[1].tensor]  # type: ignore[union-attr]
    assert read.layout.strides == (0, 300, 40 * 300, 1)


def test_a_zero_bias_is_never_read() -> None:
    (launch,) = _launches(Case(F16, 2, 16, 64, 64, 64, 64, "dense", "none"))
    assert not _flag(launch, "HAS_BIAS") and not _flag(launch, "CAUSAL")


def test_strided_columns_are_loaded_element_by_element() -> None:
    (launch,) = _launches(Case(F16, 2, 16, 64, 64, 64, 64, "k_transposed"))
    found = re.findall(r"load_tile<[^>]*, (true|false)>\((\w+)", launch.source)
    flags = {target: vec for vec, target in found}
    assert flags == {
        "q_tile": "true",
        "k_tiles": "false",
        "k_next": "false",
        "v_tiles": "true",
        "v_next": "true",
    }


def test_decoding_splits_the_keys_and_merges_the_parts_in_one_launch() -> None:
    case = Case(F16, 1, 32, 1, 4096, 128, 128, "cache")
    plan = build_plan(attention_program(case, _mask(case, np.random.default_rng(0))))
    (main,) = [step for step in plan.steps if isinstance(step, Launch)]
    assert main.name.startswith("kn_attention_mma_")
    assert "constexpr int WM = 1;" in main.source
    assert main.grid[1] > 1
    assert main.grid[0] * main.grid[1] >= attention.MULTIPROCESSORS
    # The tickets by which the last block of a row tile finds itself: zero, one per row tile.
    tickets = plan.tensors[main.args[6].tensor]  # type: ignore[union-attr]
    assert tickets.dtype is DType.I32 and tickets.shape == (main.grid[0],)
    np.testing.assert_array_equal(plan.constants[tickets.buffer], 0)


def test_busy_grids_are_not_split() -> None:
    (launch,) = _launches(Case(BF16, 32, 12, 197, 197, 64, 64, "export"))
    assert launch.grid == (32 * 12 * 4, 1, 1)


def test_split_keys_cover_every_tile_with_no_empty_split() -> None:
    for blocks, tiles in itertools.product((1, 6, 32, 100, 131, 132, 500), (1, 2, 3, 7, 64, 999)):
        splits, per = attention.split_keys(blocks, tiles)
        assert (splits - 1) * per < tiles <= splits * per
        if blocks >= attention.MULTIPROCESSORS:
            assert splits == 1


def test_one_compiled_kernel_serves_every_length() -> None:
    # Sizes are arguments: the source, hence the compiled kernel, is the same for every length.
    names = set()
    for length in (17, 100, 197, 300, 1024):
        launch = _launches(Case(F16, 4, 12, length, length, 64, 64, "export", "causal"))[0]
        names.add(launch.name)
        assert np.int32(length) in launch.args
    assert len(names) == 1
    exact = {_launches(Case(F32, 1, 2, n, n, 64, 64))[0].name for n in (5, 70, 300)}
    assert len(exact) == 1


_SCALARS = {"float": np.float32, "int": np.int32, "long long": np.int64}


@pytest.mark.parametrize(
    "case",
    [
        Case(F16, 2, 16, 197, 197, 64, 64, "export", "causal"),
        Case(BF16, 1, 32, 1, 4096, 128, 128, "cache"),
        Case(F32, 2, 3, 70, 70, 64, 64),
    ],
    ids=str,
)
def test_launch_arguments_match_the_kernel_parameters(case: Case) -> None:
    for launch in _launches(case):
        signature = re.search(launch.name + r"\((.*?)\) \{", launch.source, re.S)
        assert signature is not None
        params = [" ".join(p.split()) for p in signature.group(1).split(",")]
        assert len(params) == len(launch.args), launch.name
        for param, arg in zip(params, launch.args, strict=True):
            if "*" in param:
                assert isinstance(arg, Buf), (launch.name, param)
            else:
                ctype = param.removeprefix("const ").rsplit(" ", 1)[0]
                assert type(arg) is _SCALARS[ctype], (launch.name, param, arg)


# ---- NVRTC: every variant compiles (no GPU) ----------------------------------------------------

VARIANT_HEADS = (32, 40, 64, 80, 128, 256)  # 40: a head size padded to whole 16-wide steps


def _nvrtc() -> ModuleType:
    nvrtc = loaded_nvrtc()
    if not nvrtc.include_dirs():
        pytest.skip("no CUDA headers for NVRTC")
    return nvrtc


def _variants(dtype: DType) -> list[str]:
    sources = []
    for head, bias, rows in itertools.product(VARIANT_HEADS, attention.BiasMode, (1, 64)):
        tiles = attention.mma_tiles(rows, head, head)
        sources.append(
            attention.mma_source(dtype, head, head, tiles, bias, (True, True, True), "int")[1]
        )
    # Element-wise loads, 64-bit indices, a value head unlike the key head.
    tiles = attention.mma_tiles(64, 64, 64)
    bias = attention.BiasMode.TENSOR
    sources.append(
        attention.mma_source(dtype, 64, 24, tiles, bias, (False, False, False), "long long")[1]
    )
    sources.append(attention.exact_source(dtype, 64, 64, 2, 64, True, "long long")[1])
    return sources


@pytest.mark.slow
def test_every_attention_variant_compiles_for_sm_90(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nvrtc = _nvrtc()
    monkeypatch.setenv("KNOPT_CACHE_DIR", str(tmp_path))
    units = [
        _variants(F16),
        _variants(BF16),
        [attention.exact_source(F32, 256, 256, 1, 32, False, "int")[1]],
    ]

    def build(sources: list[str]) -> bytes:
        return nvrtc.compile_cubin('#include "common.cuh"\n' + "\n".join(sources), "sm_90")

    with ThreadPoolExecutor(max_workers=2) as pool:
        cubins = list(pool.map(build, units))
    assert all(cubin[:4] == b"\x7fELF" for cubin in cubins)


# ---- on the GPU, against the CPU oracle ---------------------------------------------------------

# |gpu - cpu| <= RELATIVE * max|v|. Half types: p is rounded to the 16-bit type for p @ v (an
# error of at most u * max|v| after normalization, u the unit roundoff) and so is the output
# (at most u * |out| <= u * max|v|); scores and sums are f32. 3u leaves room for exp2f and
# f32 sums. f32: the exact kernel reassociates sums over up to 4096 keys and folds the scale
# into q.
RELATIVE = {F16: 3 * 2.0**-11, BF16: 3 * 2.0**-8, F32: 1e-4}

SEQS = (1, 7, 64, 197, 257, 1024)
HEADS = (32, 64, 80, 128)
MASKS = ("none", "padding", "causal")
LAYOUTS = ("export", "dense", "fused_qkv", "k_transposed")


def _prefill_cases() -> list[Case]:
    cases = []
    for shift, dtype in enumerate((F16, BF16)):
        for i, (s, d) in enumerate(itertools.product(SEQS, HEADS)):
            # (2, 3) heads leave the GPU idle, so the keys split; (3, 16) and (1, 12) do not.
            batch, heads = (1, 12) if s == 1024 else ((2, 3) if i % 2 == 0 else (3, 16))
            layout = LAYOUTS[(i + shift) % len(LAYOUTS)]
            mask = MASKS[(i + shift) % len(MASKS)]
            cases.append(Case(dtype, batch, heads, s, s, d, d, layout, mask))
    return cases


def _decode_cases() -> list[Case]:
    cases = []
    for shift, dtype in enumerate((F16, BF16)):
        for i, t in enumerate((1, 100, 128, 1000, 4096)):
            batch, heads = ((1, 32), (4, 8), (8, 32))[i % 3]
            rows = 4 if i == 3 else 1
            head = (64, 128)[i % 2]
            mask = ("none", "padding")[(i + shift) % 2]
            cases.append(Case(dtype, batch, heads, rows, t, head, head, "cache", mask))
    return cases


SPECIAL_CASES = [
    Case(F16, 2, 3, 70, 45, 64, 32, "dense", "padding"),  # cross attention, e != d
    Case(BF16, 2, 2, 33, 40, 40, 24, "dense", "causal"),  # heads padded to 16-wide steps
    Case(F16, 1, 4, 100, 100, 256, 256, "export", "causal"),
    Case(BF16, 1, 2, 16, 16, 256, 256, "dense", "none"),
    Case(F16, 2, 8, 128, 128, 64, 64, "gqa", "causal"),
    Case(F16, 1, 8, 1, 2048, 128, 128, "gqa", "padding"),
    Case(BF16, 2, 8, 16, 300, 64, 64, "gqa", "padding"),
    Case(F16, 1, 12, 300, 300, 64, 64, "export", "causal_finite"),
    Case(BF16, 2, 4, 100, 250, 128, 128, "dense", "causal_finite"),  # more keys than queries
    Case(F16, 2, 3, 100, 300, 64, 64, "dense", "causal"),  # split keys, tiles skipped
    Case(F16, 1, 32, 4, 1000, 128, 128, "cache", "causal"),  # decode tiles, split keys
    Case(F16, 2, 3, 50, 30, 64, 64, "dense", "causal"),  # rows without keys: read, NaN
    Case(F16, 2, 3, 64, 64, 64, 64, "dense", "masked_rows"),
    Case(BF16, 2, 3, 197, 197, 80, 80, "export", "masked_rows"),  # split keys, NaN rows
    Case(F16, 1, 32, 1, 1000, 128, 128, "cache", "masked_rows"),  # decode, every key -inf
    Case(F32, 2, 3, 197, 197, 64, 64, "export", "causal"),  # the exact kernel
    Case(F32, 1, 2, 1, 300, 128, 128, "cache", "padding"),
    Case(F32, 2, 2, 70, 45, 16, 24, "dense", "padding"),
    Case(F16, 2, 2, 33, 33, 20, 20, "dense", "causal"),  # exact kernel for an odd head size
]


def _feeds(program: Program, dtype: DType, rng: np.random.Generator) -> dict[str, np.ndarray]:
    feeds = {}
    for name, tid in zip(program.input_names, program.inputs, strict=True):
        shape = program.tensors[tid].type.shape
        feeds[name] = random_array(rng, shape, F32).astype(dtype.numpy)  # type: ignore[arg-type]
    return feeds


def _assert_close(actual: np.ndarray, expected: np.ndarray, bound: float, what: str) -> None:
    a = actual.astype(np.float64)
    b = expected.astype(np.float64)
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    error = np.abs(a - b)
    error[np.isnan(a) & np.isnan(b)] = 0.0
    error[np.isnan(error)] = np.inf
    worst = np.unravel_index(int(np.argmax(error)), error.shape)
    assert error[worst] <= bound, (
        f"{what}\nworst |gpu - cpu| = {error[worst]:.4g} > {bound:.4g} at {worst} "
        f"(gpu {a[worst]}, cpu {b[worst]}); NaNs gpu {int(np.isnan(a).sum())}, "
        f"cpu {int(np.isnan(b).sum())}; elements over the bound {int((error > bound).sum())}"
    )


def check_case(case: Case, rng: np.random.Generator, *, merged: bool = False) -> Executable:
    """Run `case` on the GPU against the CPU oracle; the executable that ran it.

    Args:
        merged: Run `attention_program`'s merged form.
    """
    from knopt.cuda import prepare

    mask = _mask(case, rng)
    program = attention_program(case, mask, merged=merged)
    feeds = _feeds(program, case.dtype, rng)
    # The oracle computes in f32 on the same (rounded) values: what the kernels aim at.
    (expected,) = run_program(
        attention_program(
            case, mask.astype(case.dtype.numpy).astype(np.float32), F32, merged=merged
        ),
        {name: x.astype(np.float32) for name, x in feeds.items()},
    )
    executable = prepare(program)
    (actual,) = executable.run(feeds)
    largest = max(float(np.abs(x.astype(np.float32)).max()) for x in feeds.values())
    _assert_close(
        actual, expected, RELATIVE[case.dtype] * largest, f"{case}\n{executable.describe()}"
    )
    return executable


@pytest.mark.cuda
@pytest.mark.parametrize("case", _prefill_cases(), ids=str)
def test_prefill_matches_the_cpu(case: Case, rng: np.random.Generator) -> None:
    check_case(case, rng)


@pytest.mark.cuda
@pytest.mark.parametrize("case", _decode_cases(), ids=str)
def test_decoding_against_a_cache_matches_the_cpu(case: Case, rng: np.random.Generator) -> None:
    check_case(case, rng)


@pytest.mark.cuda
@pytest.mark.parametrize("case", SPECIAL_CASES, ids=str)
def test_layouts_heads_and_masked_rows_match_the_cpu(case: Case, rng: np.random.Generator) -> None:
    check_case(case, rng)


@pytest.mark.cuda
@pytest.mark.parametrize("case", MERGED_CASES, ids=str)
def test_merged_heads_written_in_place_match_the_cpu(case: Case, rng: np.random.Generator) -> None:
    check_case(case, rng, merged=True)


@pytest.mark.cuda
def test_split_keys_merge_again_on_every_run(rng: np.random.Generator) -> None:
    # The last block of a row tile to finish merges the splits and resets the tile's ticket:
    # runs after the first (and CUDA graph replays) must merge as the first did.
    from knopt.cuda import prepare

    case = Case(F16, 1, 32, 1, 1000, 128, 128, "cache", "padding")
    mask = _mask(case, rng)
    executable = prepare(attention_program(case, mask))
    for _ in range(3):
        program = attention_program(case, mask)
        feeds = _feeds(program, case.dtype, rng)
        (expected,) = run_program(
            attention_program(case, mask.astype(case.dtype.numpy).astype(np.float32), F32),
            {name: x.astype(np.float32) for name, x in feeds.items()},
        )
        (actual,) = executable.run(feeds)
        largest = max(float(np.abs(x.astype(np.float32)).max()) for x in feeds.values())
        _assert_close(actual, expected, RELATIVE[case.dtype] * largest, str(case))
