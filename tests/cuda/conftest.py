"""GPU tests skip themselves where no GPU answers; the CUDA packages load only when asked."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def gpu_available() -> bool:
    import knopt.cuda

    return knopt.cuda.is_available()


@pytest.fixture(autouse=True)
def _skip_without_gpu(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("cuda") is not None and not request.getfixturevalue(
        "gpu_available"
    ):
        pytest.skip("no usable NVIDIA GPU")
