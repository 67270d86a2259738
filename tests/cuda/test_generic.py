"""Size lifting: kernel sources as templates whose size-dependent literals are parameters.

Everything here runs without a GPU; the compile test needs only NVRTC.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import knopt
from knopt.cuda.gen.indexing import PLACEHOLDER
from knopt.cuda.generic import (
    KernelLibrary,
    LiteralClass,
    generic_source,
    literal_class,
    make_template,
    tokenize,
)
from knopt.cuda.planner import build_plan
from knopt.cuda.precision import narrow_dtype, narrow_program
from knopt.cuda.steps import Launch, kernel_launches
from knopt.errors import CodegenError
from knopt.ir.bind import bind_program
from knopt.ir.program import Program, program_from_graph
from tests.cuda.programs import loaded_nvrtc
from tests.models import MODELS

DECODERS = MODELS.parent / "decoder"
# Symbolic fixtures and sizes inside what each model takes (positions up to 16).
SYMBOLIC = [
    "bert_ts14.onnx",
    "convnext_ts14.onnx",
    "efficientnet_ts14.onnx",
    "gpt2_ts14.onnx",
    "llama_ts14.onnx",
    "mlp_ts14.onnx",
    "mobilenetv2_ts14.onnx",
    "resnet_ts14.onnx",
    "unet_ts14.onnx",
    "vit_ts14.onnx",
]
SIZES = [
    {"batch": 2, "seq": 12},
    {"batch": 5, "seq": 16},
    {"batch": 1, "seq": 7},
    {"batch": 3, "seq": 1},
]


def _kernel(body: str, params: str = "float* __restrict__ out") -> str:
    return (
        f'extern "C" __global__ void __launch_bounds__(256) {PLACEHOLDER}({params}) {{\n{body}\n}}'
    )


def _liftable(source: str) -> list[str]:
    return [lit.text for lit in tokenize(source).literals if lit.liftable]


def test_literal_classes_follow_c() -> None:
    assert literal_class("12") is LiteralClass.INT
    assert literal_class("2147483647") is LiteralClass.INT
    assert literal_class("2147483648") is LiteralClass.LONG
    assert literal_class("24LL") is LiteralClass.LONG
    assert literal_class("0.5f") is LiteralClass.FLOAT
    assert literal_class("1e-05f") is LiteralClass.FLOAT
    assert literal_class("0.125") is LiteralClass.DOUBLE
    for other in ("0x1F", "017", "3ULL", "7u"):
        assert literal_class(other) is LiteralClass.OTHER


def test_compile_time_places_are_never_lifted() -> None:
    source = _kernel(
        "#pragma unroll 4\n"
        "  constexpr int kCount = (12 + 3) / 4;\n"
        "  __shared__ float tile[64];\n"
        "  kn::Vec<float, 8> w = *reinterpret_cast<const kn::Vec<float, 8>*>(in0 + 16);\n"
        "  switch (c) { case 3: break; }\n"
        "  // 99 in a comment\n"
        '  const char* text = "77";\n'
        "  if (c < 24) out[c * (96) + 5] = 0.5f;"
    )
    assert _liftable(source) == ["16", "24", "96", "5", "0.5f"]


def test_a_template_gives_back_every_source_it_stands_for() -> None:
    library = KernelLibrary()
    launches = [
        Launch(
            "k",
            _kernel(f"  if (i < {n}) out[i * ({3 * n}LL) + 1] = {n}.5f;"),
            (1, 1, 1),
            (1, 1, 1),
            (),
        )
        for n in (7, 9, 40)
    ]
    library.observe(launches[0])
    library.observe(launches[1])
    template, instance = library.template(launches[2])
    assert template.instance_source(instance) == generic_source(launches[2])
    assert template.arguments(instance) == (np.int32(40), np.int64(120), np.float32(40.5))
    assert "const long long kn_p1" in template.source
    assert all(library.template(x)[0] is template for x in launches)


def test_a_pinned_literal_that_differs_makes_another_template() -> None:
    library = KernelLibrary()
    first, second = (
        Launch("k", _kernel(f"  kn::Vec<float, {v}> r; out[{v}] = 1;"), (1, 1, 1), (1, 1, 1), ())
        for v in (4, 2)
    )
    one, _ = library.template(first)
    two, _ = library.template(second)
    assert one is not two
    assert library.template(first)[0] is one


def test_only_liftable_literals_become_parameters() -> None:
    instance = tokenize(_kernel("  kn::Vec<float, 4> r;"))
    with pytest.raises(CodegenError, match="cannot be lifted"):
        make_template(instance, [1])


@functools.cache
def _program(name: str) -> Program:
    path = DECODERS / name if name.startswith("llama_kv") else MODELS / name
    return program_from_graph(knopt.load(path))


def _sizes(program: Program) -> list[dict[str, int]]:
    names = {str(d) for t in program.tensors for d in t.type.shape if not isinstance(d, int)}
    if any("past" in n for n in names):
        return [
            {"batch": 2, "seq": 3, "past": 5, "total": 8},
            {"batch": 1, "seq": 1, "past": 63, "total": 64},
            {"batch": 4, "seq": 1, "past": 127, "total": 128},
        ]
    symbols = {"batch", "seq"} & {s for n in names for s in n.replace("*", " ").split()}
    return [{k: v for k, v in sizes.items() if k in symbols} for sizes in SIZES]


def _launches(program: Program, sizes: dict[str, int], precision: str) -> list[Launch]:
    target = narrow_dtype(precision)
    narrowed = narrow_program(program, target) if target is not None else program
    plan = build_plan(bind_program(narrowed, sizes), precision)
    return [x for step in plan.steps for x in kernel_launches(step)]


@pytest.mark.parametrize("name", [*SYMBOLIC, "llama_kv_ts17.onnx", "llama_kv_dynamo18.onnx"])
@pytest.mark.parametrize("precision", ["f32", "fp16"])
def test_templates_give_back_every_fixture_kernel(name: str, precision: str) -> None:
    program = _program(name)
    library = KernelLibrary()
    plans = [_launches(program, sizes, precision) for sizes in _sizes(program)]
    for launches in plans[:2]:
        for launch in launches:
            library.observe(launch)
    for launches in plans:
        for launch in launches:
            template, instance = library.template(launch)
            assert template.instance_source(instance) == generic_source(launch)
            assert len(template.arguments(instance)) == len(template.lifted)
    assert any(t.lifted for t in library.made), "no literal depends on the sizes"


@pytest.mark.parametrize("precision", ["f32", "fp16"])
def test_every_fixture_template_compiles_for_sm90(precision: str, tmp_path, monkeypatch) -> None:
    nvrtc = loaded_nvrtc()
    monkeypatch.setenv("KNOPT_CACHE_DIR", str(tmp_path))
    library = KernelLibrary()
    for name in [*SYMBOLIC, "llama_kv_ts17.onnx"]:
        program = _program(name)
        plans = [_launches(program, sizes, precision) for sizes in _sizes(program)]
        for launch in plans[0] + plans[1]:
            library.observe(launch)
        for launches in plans:
            for launch in launches:
                library.template(launch)
    sources = {t.name: t.source for t in library.made}
    cubin = nvrtc.compile_cubin('#include "common.cuh"\n' + "\n".join(sources.values()), "sm_90")
    assert cubin[:4] == b"\x7fELF"
