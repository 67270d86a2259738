"""3xTF32: the split's arithmetic on the CPU, when the planner uses it, and its GPU results."""

from __future__ import annotations

import numpy as np
import pytest

from knopt.cuda.gen import split
from knopt.cuda.planner import build_plan
from knopt.cuda.steps import Gemm, Launch
from knopt.errors import KnoptError
from knopt.ir.builder import GraphBuilder
from knopt.ir.dtype import DType
from knopt.ir.program import Program, program_from_graph
from tests.cuda.programs import loaded_nvrtc

LOW_BITS = np.uint32(0x1FFF)  # the 13 mantissa bits TF32 drops


def _tf32_as_the_hardware_reads_it(x: np.ndarray) -> np.ndarray:
    # Tensor cores read the top 19 bits; truncation is the worse of their two possible roundings.
    return (x.astype(np.float32).view(np.uint32) & ~LOW_BITS).view(np.float32)


def _relative(mine: np.ndarray, exact: np.ndarray) -> float:
    return float(np.linalg.norm(mine - exact) / np.linalg.norm(exact))


def test_hi_is_tf32_and_lo_is_the_exact_rest(rng: np.random.Generator) -> None:
    x = (rng.standard_normal(10_000) * 10.0 ** rng.integers(-30, 30, 10_000)).astype(np.float32)
    hi = split.round_tf32(x)
    assert not np.any(hi.view(np.uint32) & LOW_BITS)
    lo = x - hi
    assert np.array_equal(hi + lo, x)  # the rest is exact in f32
    assert np.all(np.abs(lo) <= np.abs(x) * 2.0**-11)


def test_rounding_is_to_nearest_even_and_keeps_non_finite_values() -> None:
    one = np.float32(1.0)
    half_step = np.float32(2.0**-11)  # half a TF32 ulp at 1
    assert split.round_tf32(np.array([one + half_step]))[0] == one  # tie: to even
    assert split.round_tf32(np.array([one + np.float32(3) * half_step]))[0] == 1 + 2.0**-9
    special = np.array([np.inf, -np.inf, np.nan, np.finfo(np.float32).max], dtype=np.float32)
    rounded = split.round_tf32(special)
    assert rounded[0] == np.inf and rounded[1] == -np.inf and np.isnan(rounded[2])
    assert np.isfinite(rounded[3])  # rounding up past the range falls back to truncation


def test_three_tf32_products_keep_f32_accuracy(rng: np.random.Generator) -> None:
    m, k, n = 64, 1024, 48
    a = rng.standard_normal((1, m, k)).astype(np.float32)
    b = rng.standard_normal((1, k, n)).astype(np.float32)
    exact = a[0].astype(np.float64) @ b[0].astype(np.float64)
    sa, sb = split.split_host(a, "a"), split.split_host(b, "b")
    assert sa.shape == (1, m, 3 * k) and sb.shape == (1, 3 * k, n)
    split_result = _tf32_as_the_hardware_reads_it(sa[0]).astype(
        np.float64
    ) @ _tf32_as_the_hardware_reads_it(sb[0]).astype(np.float64)
    tf32_result = _tf32_as_the_hardware_reads_it(a[0]).astype(
        np.float64
    ) @ _tf32_as_the_hardware_reads_it(b[0]).astype(np.float64)
    assert _relative(split_result, exact) < 1e-6
    assert _relative(tf32_result, exact) > 1e-4  # one TF32 product would not do


@pytest.mark.parametrize(
    ("m", "n", "k", "batch", "pays"),
    [
        (1, 768, 768, 1, False),  # decoding one token: weight reads dominate
        (128, 768, 768, 1, False),  # BERT-base at batch 1: about even, so strict
        (4096, 3072, 768, 1, True),  # BERT-base at batch 32: compute-bound
        (4096, 2048, 2048, 1, True),
    ],
)
def test_the_roofline_splits_only_compute_bound_gemms(
    m: int, n: int, k: int, batch: int, pays: bool
) -> None:
    assert split.split_pays(m, n, k, (batch, 1, batch), (True, False)) is pays


def _matmul_program(m: int, k: int, n: int, rng: np.random.Generator) -> Program:
    g = GraphBuilder("mm")
    x = g.input("x", (m, k), DType.F32)
    w = g.constant(rng.standard_normal((k, n)).astype(np.float32))
    g.output(g.matmul(x, w), "y")
    g.output(g.matmul(x, g.constant(rng.standard_normal((k, n)).astype(np.float32))), "z")
    return program_from_graph(g.build())


def test_strict_f32_is_the_default(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(split.SPLIT_ENV, raising=False)
    assert split.policy() == "never"
    plan = build_plan(_matmul_program(4096, 512, 1024, rng), "f32")  # split would pay here
    gemms = [s for s in plan.steps if isinstance(s, Gemm)]
    assert len(gemms) == 2 and all(g.precision == "f32" and g.a.cols == 512 for g in gemms)
    assert not [s for s in plan.steps if isinstance(s, Launch) and "tf32_split" in s.name]


def test_a_large_f32_gemm_is_planned_as_one_tf32_gemm_of_triple_depth(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(split.SPLIT_ENV, "auto")
    plan = build_plan(_matmul_program(4096, 512, 1024, rng), "f32")
    gemms = [s for s in plan.steps if isinstance(s, Gemm)]
    splits = [s for s in plan.steps if isinstance(s, Launch) and "tf32_split" in s.name]
    assert len(gemms) == 2 and all(g.precision == "tf32" for g in gemms)
    assert all(g.a.cols == g.b.rows == 3 * 512 for g in gemms)
    assert len(splits) == 1  # both GEMMs read the input: it is split once
    weight = plan.constants[plan.tensors[gemms[0].b.tensor].buffer]
    assert weight.shape == (1, 3 * 512, 1024)
    lo, hi = weight[0, :512], weight[0, 512:1024]  # b = [lo ; hi ; hi]: small products first
    assert np.array_equal(weight[0, 1024:], hi)
    assert not np.any(hi.view(np.uint32) & LOW_BITS)
    assert np.all(np.abs(lo) <= np.abs(hi + lo) * 2.0**-11)


def test_the_small_products_come_first_along_k(rng: np.random.Generator) -> None:
    a = rng.standard_normal((1, 3, 5)).astype(np.float32)
    b = rng.standard_normal((1, 5, 4)).astype(np.float32)
    sa, sb = split.split_host(a, "a")[0], split.split_host(b, "b")[0]
    hi_a, hi_b = split.round_tf32(a[0]), split.round_tf32(b[0])
    assert np.array_equal(sa, np.concatenate([hi_a, a[0] - hi_a, hi_a], axis=1))
    assert np.array_equal(sb, np.concatenate([b[0] - hi_b, hi_b, hi_b], axis=0))


@pytest.mark.parametrize(("policy", "splits"), [("never", False), ("always", True)])
def test_the_variable_overrides_the_roofline(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, policy: str, splits: bool
) -> None:
    monkeypatch.setenv(split.SPLIT_ENV, policy)
    plan = build_plan(_matmul_program(4096, 512, 1024, rng), "f32")
    assert all((g.precision == "tf32") is splits for g in plan.steps if isinstance(g, Gemm))


@pytest.mark.parametrize("precision", ["tf32", "fp16"])
def test_other_precisions_never_split(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, precision: str
) -> None:
    from knopt.cuda.precision import narrow_dtype, narrow_program

    monkeypatch.setenv(split.SPLIT_ENV, "always")
    program = _matmul_program(64, 64, 64, rng)
    target = narrow_dtype(precision)
    if target is not None:
        program = narrow_program(program, target)
    plan = build_plan(program, precision)
    assert all(g.a.cols == 64 for g in plan.steps if isinstance(g, Gemm))


def test_a_bad_policy_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(split.SPLIT_ENV, "sometimes")
    with pytest.raises(KnoptError, match="KNOPT_SPLIT_F32='sometimes'"):
        split.policy()


def _batched_program() -> Program:
    g = GraphBuilder("bmm")
    q = g.input("q", (4, 96, 32), DType.F32)
    k = g.input("k", (4, 80, 32), DType.F32)
    g.output(g.matmul(q, g.permute(k, (0, 2, 1))), "s")  # k read column-major
    return program_from_graph(g.build())


def test_computed_operands_are_split_by_a_kernel_that_compiles(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(split.SPLIT_ENV, "always")
    plan = build_plan(_batched_program(), "f32")
    (gemm,) = [s for s in plan.steps if isinstance(s, Gemm)]
    launches = [s for s in plan.steps if isinstance(s, Launch) and "tf32_split" in s.name]
    assert len(launches) == 2 and gemm.batch == 4
    assert (gemm.a.rows, gemm.a.cols, gemm.a.batch_stride) == (96, 96, 96 * 96)
    assert (gemm.b.rows, gemm.b.cols, gemm.b.batch_stride) == (96, 80, 96 * 80)
    nvrtc = loaded_nvrtc()

    source = '#include "common.cuh"\n' + "\n".join(launch.source for launch in launches)
    assert nvrtc.compile_cubin(source, "sm_90")


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(512, 768, 640), (4, 96, 32, 80)])
def test_split_results_by_policy(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, shape: tuple[int, ...]
) -> None:
    """The default keeps strict f32's error; the opt-in stays within its accumulation bound."""
    from knopt.cuda import prepare

    if len(shape) == 3:
        m, k, n = shape
        program = _matmul_program(m, k, n, rng)
        feeds = {"x": rng.standard_normal((m, k)).astype(np.float32)}
    else:
        program = _batched_program()
        k = shape[2]
        feeds = {
            "q": rng.standard_normal((4, 96, 32)).astype(np.float32),
            "k": rng.standard_normal((4, 80, 32)).astype(np.float32),
        }
    exact = _exact(program, feeds)
    errors = {}
    for policy in ("", "always"):
        monkeypatch.setenv(split.SPLIT_ENV, policy)  # "": the default
        outputs = prepare(program).run(feeds)
        errors[policy or "default"] = max(
            _relative(o.astype(np.float64), e) for o, e in zip(outputs, exact, strict=True)
        )
    print(f"3xTF32 {shape}: relative errors {errors}")
    # Strict f32: sums rounded to nearest, off by about sqrt(K) u (a sequential f32 sum of
    # these products is off by 0.3 of that on the CPU).
    assert errors["default"] < np.sqrt(k) * 2.0**-24
    # The opt-in: tensor cores truncate their f32 accumulator once per 8-deep step (module
    # docstring of knopt.cuda.gen.split). A CPU model of that is off by 1.05e-5 at K = 768
    # with the big products first (an H200 measured 8.0e-6), about 2^-23 K/8, and by a fifth
    # of it with the small products first; twice 2^-23 K/8 bounds both.
    assert errors["always"] < 2.0**-22 * k / 8


def _exact(program: Program, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Each output in float64, from the program's own constants."""
    values = {tid: np.asarray(a, dtype=np.float64) for tid, a in program.constants.items()}
    for name, tid in zip(program.input_names, program.inputs, strict=True):
        values[tid] = feeds[name].astype(np.float64)
    for kernel in program.kernels:
        if kernel.kind == "MatMul":
            a, b = (values[t] for t in kernel.inputs)
            values[kernel.output] = a @ b
        else:  # the test programs' only other kernels are permutes
            (source,) = kernel.inputs
            values[kernel.output] = np.transpose(values[source], kernel.op.perm)  # type: ignore[union-attr]
    return [values[t] for t in program.outputs]
