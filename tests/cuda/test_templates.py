"""Templates: every slot filled exactly, and every shipped template well-formed."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from knopt.cuda.templates import HEADERS, fill_template, render, template
from knopt.errors import CodegenError


def test_fill_template_fills_every_slot() -> None:
    assert fill_template("a @X@ b @Y_2@ @X@", X=1, Y_2="z") == "a 1 b z 1"


def test_missing_slot_is_an_error() -> None:
    with pytest.raises(CodegenError, match="missing \\['Y'\\]"):
        fill_template("@X@ @Y@", X=1)


def test_unused_value_is_an_error() -> None:
    with pytest.raises(CodegenError, match="unused \\['Z'\\]"):
        fill_template("@X@", X=1, Z=2)


def test_render_names_the_template() -> None:
    with pytest.raises(CodegenError, match=r"codegen/iota\.cu"):
        render("iota.cu", NAME="k")


def test_unknown_template_is_an_error() -> None:
    with pytest.raises(CodegenError, match="no codegen template"):
        template("nope.cu")


def _templates() -> list[str]:
    folder = resources.files("knopt") / "codegen"
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".cu"))


@pytest.mark.parametrize("name", _templates())
def test_each_kernel_template_defines_one_named_kernel(name: str) -> None:
    text = template(name)
    assert text.count('extern "C" __global__') == 1
    assert "@NAME@" in text
    assert text.startswith(f"// codegen/{name}:")


def test_headers_are_shipped() -> None:
    for name in HEADERS:
        assert "#pragma once" in template(name)


def test_every_ir_kind_has_a_device_function() -> None:
    from knopt.ir.op import Binary, Unary

    header = template("common.cuh")
    defined = set(re.findall(r"\b([ub]_[a-z_]+)\(", header))
    defined |= {f"u_{m}" for m in re.findall(r"KN_FLOAT_UNARY\((\w+),", header)}
    assert {f"u_{k.name.lower()}" for k in Unary} <= defined
    assert {f"b_{k.name.lower()}" for k in Binary} <= defined


@pytest.mark.parametrize("name", _templates())
def test_each_kernel_waits_for_the_kernel_ahead_before_anything_else(name: str) -> None:
    # knopt launches its kernels with programmatic dependent launch (knopt/cuda/driver.py): one
    # that touched memory before KN_PDL_BEGIN() could race with the kernel ahead of it.
    # A kernel opening with KN_PDL_OPEN(early) may load constants first (codegen/common.cuh)
    # and must then reach KN_PDL_WAIT() in the code it runs, behind the same compile-time flag.
    text = template(name)
    body = text[text.index("{", text.index('extern "C" __global__')) + 1 :].lstrip()
    if body.startswith("KN_PDL_OPEN("):
        flag = body[len("KN_PDL_OPEN(") : body.index(")")]
        assert re.fullmatch(r"@[A-Z]+@", flag), flag  # rendered true or false per kernel
        assert flag in body[body.index(")") :]  # passed on to the code that waits
        headers = re.findall(r'#include "([\w.]+)"', text)
        code = "".join(template(h) for h in headers)
        assert re.search(r"if constexpr \(\w+\) KN_PDL_WAIT\(\);", code)
        return
    assert body.startswith("KN_PDL_BEGIN();")
