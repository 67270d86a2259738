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
from knopt.cuda.resident import ResidentPlan, ResidentSlot
from knopt.cuda.steps import Buf, Launch, kernel_launches
from knopt.ir import op as ops
from knopt.ir.bind import bind_program
from knopt.ir.dtype import DType
from knopt.ir.program import Load, Program
from knopt.ir.shape import Sym, sym
from tests.cuda.programs import ProgramBuilder, compare, loaded_nvrtc, random_feeds

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
    nvrtc = loaded_nvrtc()
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


# ---- the rope as the cache append (knopt.cuda.resident) -----------------------------------------

_PAST, _ROWS = 5, 16  # cached positions planned, and the cache's capacity


def _append_program(rope_read_elsewhere: bool) -> Program:
    """present = Concat(past, Rope(k)) on [1, 2, positions, 8], and a kernel reading present."""
    p = ProgramBuilder()
    past = p.input("past", (1, 2, _PAST, HEAD))
    k = p.input("k", (1, 2, 1, HEAD))
    cos, sin = p.input("cos", (1, 2, 1, HEAD)), p.input("sin", (1, 2, 1, HEAD))
    rope = p.op(ops.Rope(), (k, cos, sin))
    present = p.op(ops.Concat(2), (past, rope))
    total = p.kernel(
        "elementwise", None, (present,), (1, 2, _PAST + 1, HEAD), DType.F32, body=Load(0)
    )
    return p.build([present, total, rope] if rope_read_elsewhere else [present, total])


def _resident_plan(program: Program) -> ResidentPlan:
    slot = ResidentSlot(program.inputs[0], program.outputs[0], 2, 0, (1, 2, _ROWS, HEAD))
    return ResidentPlan((slot,), _PAST, 1, False, _ROWS * 2 * HEAD * 4, _ROWS * 2 * HEAD * 4 + 256)


@pytest.mark.parametrize("read_elsewhere", [False, True])
def test_the_keys_rope_writes_the_new_cache_rows_itself(read_elsewhere: bool) -> None:
    program = _append_program(read_elsewhere)
    plan = build_plan(program, "f32", _resident_plan(program))
    launches = [x for step in plan.steps for x in kernel_launches(step)]
    kinds = [x.name.split("_")[1] for x in launches]
    rope = next(x for x in launches if x.name.startswith("kn_rope"))
    (written,) = [a.tensor for a in rope.args[:1] if isinstance(a, Buf)]
    out = plan.tensors[written]
    if read_elsewhere:  # the rope's result is needed as it is: the append copies it
        assert kinds.count("copy") == 1
        assert plan.buffers[out.buffer].region != "resident"
    else:  # written at rows _PAST... of the cache's buffer; no copy
        assert "copy" not in kinds
        assert plan.buffers[out.buffer].region == "resident"
        assert out.layout.offset == _PAST * HEAD
        assert out.layout.strides == (0, _ROWS * HEAD, 0, 1)
