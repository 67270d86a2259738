"""Rowwise kernels (knopt/cuda/gen/rowwise.py): thread counts, values read once a row.

A quantized LayerNorm's prologue dequantizes with per-tensor scales and its epilogue quantizes
with one: those are the same along the row and are read once a row. Without a GPU the kernels
plan and compile; on one they match the CPU.
"""

from __future__ import annotations

import numpy as np
import pytest

from knopt.cuda.gen.rowwise import MAX_CACHED, VALUES_PER_THREAD, row_threads
from knopt.cuda.planner import build_plan
from knopt.cuda.steps import Launch
from knopt.errors import CudaError
from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.op import Binary, Unary
from knopt.ir.program import Acc, BinaryE, Load, Program, UnaryE
from tests.cuda.programs import ProgramBuilder, compare, random_feeds

F32 = DType.F32
LENGTHS = [33, 768, 5000, 20000]  # one warp; 64 threads; cached at 512; 1024, not cached


def _mul(a, b):
    return BinaryE(Binary.MUL, a, b)


def _add(a, b):
    return BinaryE(Binary.ADD, a, b)


def test_row_threads_keep_rows_within_the_cached_values() -> None:
    assert VALUES_PER_THREAD <= MAX_CACHED
    assert row_threads(768) == 64  # BERT-base: every row of a batch of 32 in one wave
    for length in range(1, 20000, 37):
        threads = row_threads(length)
        assert threads == 1024 or threads * VALUES_PER_THREAD >= length


def _program(kind: str, length: int) -> Program:
    """A norm or softmax whose prologue and epilogue read per-row and per-tensor values."""
    p = ProgramBuilder()
    shape = (6, 3, length)
    x = p.input("x", shape)
    per_row = p.view(ops.Broadcast(shape), p.input("per_row", (6, 3, 1)))
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
    pytest.importorskip("cuda.bindings.nvrtc", reason="needs cuda-python's NVRTC")
    from knopt.cuda import nvrtc

    try:
        nvrtc.version()
    except (CudaError, RuntimeError) as err:
        pytest.skip(f"NVRTC cannot load: {err}")
    sources = {}
    for length in LENGTHS:
        steps = build_plan(_program(kind, length)).steps
        sources.update({s.name: s.source for s in steps if isinstance(s, Launch)})
    cubin = nvrtc.compile_cubin('#include "common.cuh"\n' + "\n".join(sources.values()), "sm_90")
    for name in sources:
        assert name.encode() in cubin


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["softmax", "layer_norm", "rms_norm"])
@pytest.mark.parametrize("length", LENGTHS)
def test_rowwise_kernels_with_row_invariant_reads_match_the_cpu(
    rng: np.random.Generator, kind: str, length: int
) -> None:
    program = _program(kind, length)
    compare(program, random_feeds(program, rng))
