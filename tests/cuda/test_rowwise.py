"""Rowwise kernels (knopt/cuda/gen/rowwise.py): thread counts, values read once a row.

A quantized LayerNorm's prologue dequantizes with per-tensor scales and its epilogue quantizes
with one: those are the same along the row and are read once a row. Without a GPU the kernels
plan and compile; on one they match the CPU.
"""

from __future__ import annotations

import numpy as np
import pytest

from knopt.cuda.gen.rowwise import (
    BUSY_THREADS,
    FEW_VALUES,
    MANY_VALUES,
    MAX_CACHED,
    row_threads,
    values_per_thread,
)
from knopt.cuda.planner import build_plan
from knopt.cuda.steps import Launch
from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.op import Binary, Unary
from knopt.ir.program import Acc, BinaryE, Load, Program, UnaryE
from tests.cuda.programs import ProgramBuilder, compare, loaded_nvrtc, random_feeds

F32 = DType.F32
LENGTHS = [33, 768, 5000, 20000]  # one warp; 64 threads; cached at 512; 1024, not cached
# (leading size, length): 18 rows take few values a thread; the others enough rows for many.
CASES = [(6, n) for n in LENGTHS] + [(1366, 33), (683, 768), (86, 5000)]


def _mul(a, b):
    return BinaryE(Binary.MUL, a, b)


def _add(a, b):
    return BinaryE(Binary.ADD, a, b)


def test_row_threads_keep_rows_within_the_cached_values() -> None:
    assert FEW_VALUES <= MANY_VALUES <= MAX_CACHED
    assert row_threads(768, MANY_VALUES) == 64  # BERT-base: every row of a batch of 32 in one wave
    for per_thread in (FEW_VALUES, MANY_VALUES):
        for length in range(1, 20000, 37):
            threads = row_threads(length, per_thread)
            assert threads == 1024 or threads * per_thread >= length


def test_many_rows_take_many_values_a_thread_and_few_rows_few() -> None:
    assert values_per_thread(768, 32 * 128) == MANY_VALUES  # BERT-base at batch 32
    assert values_per_thread(2048, 1) == FEW_VALUES  # a decoding step's norm at batch 1
    assert values_per_thread(768, 128) == FEW_VALUES  # BERT-base at batch 1
    for rows, length in CASES:
        many = rows * 3 * row_threads(length, MANY_VALUES) >= BUSY_THREADS
        assert values_per_thread(length, rows * 3) == (MANY_VALUES if many else FEW_VALUES)
        assert many == (rows > 6)  # the cases below test both


def _program(kind: str, rows: int, length: int) -> Program:
    """A norm or softmax whose prologue and epilogue read per-row and per-tensor values."""
    p = ProgramBuilder()
    shape = (rows, 3, length)
    x = p.input("x", shape)
    per_row = p.view(ops.Broadcast(shape), p.input("per_row", (rows, 3, 1)))
    scalar = p.view(ops.Broadcast(shape), p.view(ops.View((1, 1, 1)), p.input("scalar", (1,))))
    op = {
        "softmax": ops.Softmax(2),
        "layer_norm": ops.LayerNorm(2, 1e-5),
        "rms_norm": ops.RmsNorm(2, 1e-6),
    }[kind]
    out = p.kernel(
        kind,
        op,
        (x, per_row, scalar),
        shape,
        F32,
        prologue=_add(_mul(Load(0), Load(1)), Load(2)),
        epilogue=UnaryE(Unary.ABS, _add(_mul(Acc(), Load(2)), Load(1))),
    )
    return p.build([out])


@pytest.mark.parametrize("kind", ["softmax", "layer_norm", "rms_norm"])
def test_rowwise_kernels_with_row_invariant_reads_compile(kind: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("KNOPT_CACHE_DIR", str(tmp_path))
    nvrtc = loaded_nvrtc()
    sources = {}
    for rows, length in CASES:
        steps = build_plan(_program(kind, rows, length)).steps
        sources.update({s.name: s.source for s in steps if isinstance(s, Launch)})
    cubin = nvrtc.compile_cubin('#include "common.cuh"\n' + "\n".join(sources.values()), "sm_90")
    for name in sources:
        assert name.encode() in cubin


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["softmax", "layer_norm", "rms_norm"])
@pytest.mark.parametrize(("rows", "length"), CASES)
def test_rowwise_kernels_with_row_invariant_reads_match_the_cpu(
    rng: np.random.Generator, kind: str, rows: int, length: int
) -> None:
    program = _program(kind, rows, length)
    feeds = random_feeds(program, rng)
    # A per-row scale near 0 makes the prologue's `x * s + c` a row of tiny spread around c,
    # where its one rounding (a fused multiply-add on the GPU, two roundings on the CPU) is
    # magnified 1/|s| times by the normalisation: keep the rows well conditioned.
    per_row = feeds["per_row"]
    feeds["per_row"] = (np.sign(per_row) * (0.5 + np.abs(per_row))).astype(per_row.dtype)
    compare(program, feeds)
