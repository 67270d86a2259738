"""NVRTC compiles the generated kernels (no GPU needed, only the NVRTC library)."""

from __future__ import annotations

import re

import pytest

import knopt
from knopt.cuda.planner import build_plan
from knopt.cuda.steps import Conv, Launch, Sdpa
from knopt.errors import CudaError
from knopt.ir.program import program_from_graph
from tests.cuda.programs import loaded_nvrtc
from tests.models import fixtures


def _nvrtc():
    nvrtc = loaded_nvrtc()
    if not nvrtc.include_dirs():
        pytest.skip("no CUDA headers for NVRTC")
    return nvrtc


def test_compile_error_names_the_call_and_numbers_the_source(tmp_path, monkeypatch) -> None:
    nvrtc = _nvrtc()
    monkeypatch.setenv("KNOPT_CACHE_DIR", str(tmp_path))
    with pytest.raises(CudaError) as caught:
        nvrtc.compile_cubin('extern "C" __global__ void k() { undefined_thing(); }', "sm_90")
    assert caught.value.call == "nvrtcCompileProgram"
    assert "undefined_thing" in caught.value.log
    assert "    1  extern" in caught.value.log


def _fixture_sources(name: str) -> dict[str, str]:
    """The generated kernels of a fixture's plan, by name."""
    fixture = next(f for f in fixtures() if f.file == name)
    plan = build_plan(program_from_graph(knopt.load(fixture.path, {"batch": 2, "seq": 8})))
    sources = {}
    for step in plan.steps:
        if isinstance(step, Launch):
            launches: list[Launch | None] = [step]
        elif isinstance(step, Sdpa):
            launches = [step.direct, step.fixup]
        else:
            launches = [step.fallback, step.direct if isinstance(step, Conv) else None]
        sources.update({s.name: s.source for s in launches if s is not None})
    return sources


@pytest.mark.parametrize(
    "name", ["bert_dynamo18.onnx", "resnet_ts14nofold.onnx", "llama_ts14.onnx"]
)
def test_generated_kernels_compile(name: str, tmp_path, monkeypatch) -> None:
    nvrtc = _nvrtc()
    monkeypatch.setenv("KNOPT_CACHE_DIR", str(tmp_path))
    sources = _fixture_sources(name)
    cubin = nvrtc.compile_cubin('#include "common.cuh"\n' + "\n".join(sources.values()), "sm_90")
    assert cubin[:4] == b"\x7fELF"
    again = nvrtc.compile_cubin('#include "common.cuh"\n' + "\n".join(sources.values()), "sm_90")
    assert again == cubin


# ---- programmatic dependent launch (codegen/common.cuh's KN_PDL_BEGIN) -------------------------

# An instruction that may read or write global memory: every load, store, atomic, reduction or
# asynchronous copy except those of kernel parameters, shared, local or constant memory.
_MEMORY = re.compile(r"^\s*(?:@!?%p\d+\s+)?(?:ld|ldu|st|atom|red|cp)\.(?!param|shared|local|const)")


def _ptx(source: str, arch: str) -> str:
    """NVRTC's PTX of `source` for virtual architecture `arch` (such as "compute_90")."""
    from cuda.bindings import nvrtc as bindings

    from knopt.cuda.driver import check
    from knopt.cuda.nvrtc import BASE_OPTIONS, include_dirs
    from knopt.cuda.templates import headers

    included = headers()
    program = check(
        "nvrtcCreateProgram",
        bindings.nvrtcCreateProgram(
            source.encode(),
            b"pdl.cu",
            len(included),
            [text.encode() for text in included.values()],
            [name.encode() for name in included],
        ),
    )
    try:
        options = [f"--gpu-architecture={arch}", *BASE_OPTIONS, *(f"-I{d}" for d in include_dirs())]
        encoded = [o.encode() for o in options]
        check("nvrtcCompileProgram", bindings.nvrtcCompileProgram(program, len(encoded), encoded))
        size = check("nvrtcGetPTXSize", bindings.nvrtcGetPTXSize(program))
        ptx = b" " * size
        check("nvrtcGetPTX", bindings.nvrtcGetPTX(program, ptx))
        return ptx.decode().rstrip("\x00")
    finally:
        check("nvrtcDestroyProgram", bindings.nvrtcDestroyProgram(program))


def _kernels_of_every_family() -> str:
    """One translation unit with kernels of 14 of the templates.

    A transformer's, attention's (tensor-core and exact), the int8 GEMM's prologue and
    epilogue, the int4 weights' (GEMV, GEMM, stream GEMV with and without early weight loads,
    dequantizer), the half-precision GEMV's (early, and not, in a cluster) and the resident
    caches' copy.
    """
    from knopt.cuda.gen import attention, gemv
    from knopt.cuda.gen.indexing import named
    from knopt.cuda.int8_epilogue import Int8Epilogue, prologue_source
    from knopt.cuda.templates import render
    from knopt.cuda.w4a16 import W4A16, GemmConfig, GemvConfig, StreamConfig
    from knopt.ir.dtype import DType

    tiles = attention.mma_tiles(64, 64, 64)
    sources = [
        *_fixture_sources("llama_ts14.onnx").values(),
        attention.mma_source(
            DType.F16, 64, 64, tiles, attention.BiasMode.CAUSAL, (True, True, True), "int"
        )[1],
        attention.exact_source(DType.F32, 64, 64, 1, 32, True, "int")[1],
        prologue_source(),
        Int8Epilogue(DType.I8).source(),
        W4A16(
            DType.F16,
            128,
            (GemvConfig(split=2),),
            (GemmConfig(64, 2),),
            (StreamConfig(1), StreamConfig(1, rows=4, early=True)),
        ).source(),
        named("gemv", gemv.kernel_source(DType.F16, 1, 1, True))[1],
        named("gemv", gemv.kernel_source(DType.BF16, 8, 4, False))[1],
        render("copy_rows.cu", NAME="copy_rows_f16", T="__half"),
    ]
    return '#include "common.cuh"\n' + "\n".join(sources)


def test_every_kernel_waits_before_it_touches_global_memory_on_sm_90() -> None:
    _nvrtc()
    ptx = _ptx(_kernels_of_every_family(), "compute_90")
    # A kernel that lets the kernels behind it start before it waits (KN_PDL_OPEN(true))
    # loads its weight early, and only its weight: read-only loads, 16-byte ones not allocated
    # in L1 (the weight; a W4A16 weight's scales and zero points are 2 and 1 bytes), where
    # both kernels read their activations with 16-byte loads that are. Every other kernel
    # touches nothing before the wait.
    kernels = ptx.split(".entry ")[1:]
    assert len(kernels) >= 10
    early = 0
    for kernel in kernels:
        lines = kernel.splitlines()
        wait = next((i for i, line in enumerate(lines) if "griddepcontrol.wait;" in line), None)
        assert wait is not None, f"{lines[0]} never waits for the kernel ahead"
        touched = [line for line in lines[:wait] if _MEMORY.match(line)]
        if any("griddepcontrol.launch_dependents;" in line for line in lines[:wait]):
            early += 1
            assert touched, f"{lines[0]} starts the kernels behind early but loads nothing"
            weights = [
                line
                for line in touched
                if "ld.global.nc.L1::no_allocate.v4." in line
                or re.search(r"ld\.global\.nc\.u(8|16)\s", line)
            ]
            assert weights == touched, f"{lines[0]} touches more than its weight early: {touched}"
            continue
        assert not touched, f"{lines[0]} touches memory before griddepcontrol.wait: {touched}"
        assert "griddepcontrol.launch_dependents;" in lines[wait + 1]
    assert early == 2  # the W4A16 stream GEMV and the GEMV that load early


def test_kernels_compile_without_grid_dependency_control_below_sm_90(tmp_path, monkeypatch) -> None:
    nvrtc = _nvrtc()
    monkeypatch.setenv("KNOPT_CACHE_DIR", str(tmp_path))
    sources = _fixture_sources("bert_dynamo18.onnx")
    source = '#include "common.cuh"\n' + "\n".join(sources.values())
    assert "griddepcontrol" not in _ptx(source, "compute_80")
    assert nvrtc.compile_cubin(source, "sm_80")[:4] == b"\x7fELF"
