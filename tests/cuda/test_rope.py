"""The Rope kernel (knopt/cuda/gen/rope.py): planned and compiled anywhere, run on a GPU.

Planning, size lifting and NVRTC need no GPU; the tests marked `cuda` run the kernel against
the CPU executor.
"""

from __future__ import annotations

import numpy as np
import pytest

from knopt.cuda.generic import KernelLibrary, generic_source
from knopt.cuda.planner import build_plan
from knopt.cuda.precision import narrow_dtype, narrow_program
from knopt.cuda.steps import Launch, kernel_launches
from knopt.errors import CudaError
from knopt.ir import op as ops
from knopt.ir.bind import bind_program
from knopt.ir.dtype import DType
from knopt.ir.program import Program
from knopt.ir.shape import Sym, sym
from tests.cuda.programs import ProgramBuilder, compare, random_feeds

HEADS, HEAD = 4, 8


def _rope_program(batch: int | Sym, seq: int | Sym, dtype: DType = DType.F32) -> Program:
    """q = Rope(x) on x `[batch, seq, heads * head]` viewed as heads `[batch, heads, seq, head]`
    (a permuted view, as decoders rotate a projection), with `[seq, head]` tables broadcast."""
    p = ProgramBuilder()
    x = p.input("x", (batch, seq, HEADS * HEAD), dtype)
    cos, sin = p.input("cos", (seq, HEAD), dtype), p.input("sin", (seq, HEAD), dtype)
    heads = p.view(ops.Permute((0, 2, 1, 3)), p.view(ops.View((batch, seq, HEADS, HEAD)), x))
    shape = (batch, HEADS, seq, HEAD)

    def table(t: int) -> int:
        return p.view(ops.Broadcast(shape), p.view(ops.View((1, 1, seq, HEAD)), t))

    return p.build([p.op(ops.Rope(), (heads, table(cos), table(sin)))])


def _launches(program: Program, sizes: dict[str, int], precision: str) -> list[Launch]:
    target = narrow_dtype(precision)
    narrowed = narrow_program(program, target) if target is not None else program
    plan = build_plan(bind_program(narrowed, sizes), precision)
    return [x for step in plan.steps for x in kernel_launches(step)]


# Sizes of 1 drop their strides' terms: such sizes get a template (a structure) of their own.
_SIZES = [{"batch": 2, "seq": 5}, {"batch": 3, "seq": 17}, {"batch": 4, "seq": 130}]


@pytest.mark.parametrize("precision", ["f32", "fp16"])
def test_one_rope_template_serves_every_size_and_compiles(
    precision: str, tmp_path, monkeypatch
) -> None:
    program = _rope_program(sym("batch"), sym("seq"))
    # One rope launch per plan, reading the views in place (fp16 adds the inputs' casts).
    ropes = []
    for sizes in _SIZES:
        (rope,) = [x for x in _launches(program, sizes, precision) if x.name.startswith("kn_rope")]
        ropes.append(rope)
    library = KernelLibrary()
    for rope in ropes[:2]:
        library.observe(rope)
    for rope in ropes:
        template, instance = library.template(rope)
        assert template.instance_source(instance) == generic_source(rope)
    assert len(library.made) == 1 and library.made[0].lifted
    pytest.importorskip("cuda.bindings.nvrtc", reason="needs cuda-python's NVRTC")
    from knopt.cuda import nvrtc

    try:
        nvrtc.version()
    except (CudaError, RuntimeError) as err:
        pytest.skip(f"NVRTC cannot load: {err}")
    monkeypatch.setenv("KNOPT_CACHE_DIR", str(tmp_path))
    source = '#include "common.cuh"\n' + library.made[0].source
    assert nvrtc.compile_cubin(source, "sm_90")[:4] == b"\x7fELF"


@pytest.mark.cuda
@pytest.mark.parametrize(("batch", "seq"), [(1, 1), (2, 7), (3, 130)])
@pytest.mark.parametrize("precision", ["f32", "fp16"])
def test_rope_kernel_matches_the_cpu(
    rng: np.random.Generator, batch: int, seq: int, precision: str
) -> None:
    program = _rope_program(batch, seq)
    compare(program, random_feeds(program, rng), precision=precision)


@pytest.mark.cuda
def test_rope_kernel_on_half_tensors_matches_the_cpu(rng: np.random.Generator) -> None:
    # Half tensors: the kernel computes in float and rounds once, the oracle rounds each op.
    program = _rope_program(2, 9, DType.F16)
    compare(program, random_feeds(program, rng), rtol=2e-3, atol=1e-2)
