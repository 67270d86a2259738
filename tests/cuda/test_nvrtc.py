"""NVRTC compiles the generated kernels (no GPU needed, only the NVRTC library)."""

from __future__ import annotations

import pytest

import knopt
from knopt.cuda.planner import build_plan
from knopt.cuda.steps import Conv, Launch
from knopt.errors import CudaError
from knopt.ir.program import program_from_graph
from tests.models import fixtures


def _nvrtc():
    pytest.importorskip("cuda.bindings.nvrtc", reason="needs cuda-python's NVRTC")
    from knopt.cuda import nvrtc

    try:
        nvrtc.version()
    except (CudaError, RuntimeError) as err:
        pytest.skip(f"NVRTC cannot load: {err}")
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


@pytest.mark.parametrize(
    "name", ["bert_dynamo18.onnx", "resnet_ts14nofold.onnx", "llama_ts14.onnx"]
)
def test_generated_kernels_compile(name: str, tmp_path, monkeypatch) -> None:
    nvrtc = _nvrtc()
    monkeypatch.setenv("KNOPT_CACHE_DIR", str(tmp_path))
    fixture = next(f for f in fixtures() if f.file == name)
    plan = build_plan(program_from_graph(knopt.load(fixture.path, {"batch": 2, "seq": 8})))
    sources = {}
    for step in plan.steps:
        launches = [step] if isinstance(step, Launch) else [step.fallback]
        launches += [step.direct] if isinstance(step, Conv) else []
        sources.update({s.name: s.source for s in launches if s is not None})
    cubin = nvrtc.compile_cubin('#include "common.cuh"\n' + "\n".join(sources.values()), "sm_90")
    assert cubin[:4] == b"\x7fELF"
    again = nvrtc.compile_cubin('#include "common.cuh"\n' + "\n".join(sources.values()), "sm_90")
    assert again == cubin
