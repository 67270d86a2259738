"""The CUDA C++ templates of codegen/ and the one way to fill their `@NAME@` slots."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

from knopt.errors import CodegenError

_SLOT = re.compile(r"@([A-Z][A-Z0-9_]*)@")


def fill_template(source: str, **values: object) -> str:
    """Fill every `@NAME@` slot of a template; a missing or unused value is an error.

    Raises:
        CodegenError: If the slots and the given values differ.
    """
    slots = set(_SLOT.findall(source))
    if slots != values.keys():
        missing = sorted(slots - values.keys())
        unused = sorted(values.keys() - slots)
        raise CodegenError(f"template slots and values differ: missing {missing}, unused {unused}")
    return _SLOT.sub(lambda m: str(values[m[1]]), source)


@cache
def template(name: str) -> str:
    """The text of codegen/`name` (a .cu or .cuh file shipped with knopt).

    Raises:
        CodegenError: If there is no such template.
    """
    path = resources.files("knopt") / "codegen" / name
    try:
        return path.read_text()
    except FileNotFoundError as err:
        raise CodegenError(f"no codegen template '{name}'") from err


def render(name: str, **values: object) -> str:
    """Template `name` with its slots filled."""
    try:
        return fill_template(template(name), **values)
    except CodegenError as err:
        raise CodegenError(f"codegen/{name}: {err}") from err


HEADERS = ("common.cuh", "attention.cuh", "gemv.cuh", "w4a16.cuh", "w4a16_stream.cuh")


def headers() -> dict[str, str]:
    """The headers kernels include, by name, for NVRTC's in-memory include list."""
    return {name: template(name) for name in HEADERS}
