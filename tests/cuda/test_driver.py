"""The driver's launch configuration: programmatic dependent launch exactly where it is on."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import knopt

pytest.importorskip("cuda.core", reason="needs cuda-python")

from knopt.cuda.driver import PDL_ENV, launch_config, pdl_enabled


@pytest.mark.parametrize("setting", [None, "1", "0", " 0 "])
@pytest.mark.parametrize("arch", [75, 80, 89, 90, 100, 120])
def test_pdl_is_on_from_sm_90_unless_turned_off(
    arch: int, setting: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if setting is None:
        monkeypatch.delenv(PDL_ENV, raising=False)
    else:
        monkeypatch.setenv(PDL_ENV, setting)
    expected = arch >= 90 and (setting is None or setting.strip() != "0")
    assert pdl_enabled(arch) is expected


@pytest.mark.parametrize("pdl", [False, True])
def test_the_launch_config_carries_the_attribute_exactly_when_asked(pdl: bool) -> None:
    config = launch_config((3, 2, 1), (128, 1, 1), 4096, pdl)
    assert config.programmatic_stream_serialization is pdl
    assert (config.grid, config.block, config.shmem_size) == ((3, 2, 1), (128, 1, 1), 4096)
    assert not config.is_cooperative


def test_only_the_driver_launches_kernels() -> None:
    # Gpu.launch sets the attribute for kernels compiled from codegen/, which wait for the one
    # ahead; a kernel launched another way could get it without waiting, or skip the driver.
    launches = re.compile(r"\bcore\.launch\(|\bcuLaunchKernel(?:Ex)?\(")
    package = Path(knopt.__file__).parent
    found = [p for p in package.rglob("*.py") if launches.search(p.read_text())]
    assert [p.relative_to(package).as_posix() for p in found] == ["cuda/driver.py"]
