"""What identifies a GPU for cached compiled programs: its name, architecture and CUDA versions."""

from __future__ import annotations

from cuda.bindings import driver as cu

from knopt.cuda.driver import check
from knopt.cuda.nvrtc import version as nvrtc_version


def device_fingerprint(index: int = 0) -> str:
    """A text naming GPU `index` of this process, such as "NVIDIA H200|sm_90|driver 13000|...".

    Two processes whose GPUs give the same text can share compiled programs and cubins.

    Raises:
        CudaError: If the driver cannot be initialized or the device does not exist.
    """
    check("cuInit", cu.cuInit(0))
    device = check("cuDeviceGet", cu.cuDeviceGet(index))
    raw = check("cuDeviceGetName", cu.cuDeviceGetName(256, device))
    name = raw.split(b"\0", 1)[0].decode(errors="replace").strip()
    attribute = cu.CUdevice_attribute
    major = check(
        "cuDeviceGetAttribute",
        cu.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device),
    )
    minor = check(
        "cuDeviceGetAttribute",
        cu.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device),
    )
    driver = check("cuDriverGetVersion", cu.cuDriverGetVersion())
    nvrtc_major, nvrtc_minor = nvrtc_version()
    return f"{name}|sm_{major}{minor}|driver {driver}|nvrtc {nvrtc_major}.{nvrtc_minor}"
