"""cuBLASLt calls checked in one place, and its descriptor setters (blas.py and intgemm.py).

Every cuBLASLt status passes through `call`, which names the call in the `CudaError` it raises.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from nvmath.bindings import cublasLt as lt

from knopt.errors import CudaError

WORKSPACE_LIMIT = 32 * 2**20  # NVIDIA's recommendation for Hopper
CANDIDATES = 8  # heuristic candidates timed per GEMM shape


def call(name: str, function: Any, *args: Any) -> Any:
    """`function(*args)`, its cuBLASLt error raised as a `CudaError` naming `name`.

    Raises:
        CudaError: If cuBLASLt fails.
    """
    try:
        return function(*args)
    except lt.cuBLASLtError as err:
        raise CudaError(f"cublasLt.{name}", getattr(err, "status", None), str(err)) from err


def set_attribute(
    setter: Any, getter: Any, obj: int, attribute: Any, value: Any, name: str
) -> None:
    """Set one attribute of a cuBLASLt object, typed as cuBLASLt says."""
    array = np.array([value], dtype=getter(attribute))
    call(name, setter, obj, attribute, array.ctypes.data, array.nbytes)


def set_desc(desc: int, attribute: Any, value: Any) -> None:
    """Set one attribute of a matmul descriptor."""
    set_attribute(
        lt.matmul_desc_set_attribute,
        lt.get_matmul_desc_attribute_dtype,
        desc,
        attribute,
        value,
        "matmul_desc_set_attribute",
    )
