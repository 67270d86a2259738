"""The CUDA backend: a kernel Program planned, generated, compiled and run on an NVIDIA GPU.

Importing this package is cheap and needs no CUDA package; the modules that talk to the GPU
(driver, nvrtc, blas, dnn, executor, runner) import cuda-python, nvmath-python and the cuDNN
frontend themselves, so they load only when a GPU is used.

    from knopt.cuda import prepare
    executable = prepare(program, precision="fp16")
    (logits,) = executable.run({"x": x})
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from knopt.cuda.executor import Executable
    from knopt.ir.program import Program


def is_available() -> bool:
    """True when the CUDA packages import and a GPU answers."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return False
    try:
        (status,) = driver.cuInit(0)
        if int(status) != 0:
            return False
        status, count = driver.cuDeviceGetCount()
    except RuntimeError:  # cuda.bindings raises this when libcuda cannot be loaded
        return False
    return int(status) == 0 and count > 0


def prepare(program: Program, precision: str = "f32") -> Executable:
    """Plan, compile and load `program` (all sizes static) on the GPU.

    Args:
        program: The kernels to run, such as `knopt.ir.program.program_from_graph(graph)`.
        precision: "f32" (strict; 3xTF32 GEMMs only where `KNOPT_SPLIT_F32` opts in), "tf32"
            (plain TF32 GEMMs and convolutions), "fp16" or "bf16".

    Raises:
        KnoptError: If the precision is unknown or the program has symbolic sizes.
        UnsupportedModelError: If a dtype has no CUDA equivalent.
        CudaError: If a CUDA, NVRTC, cuBLASLt or cuDNN call fails.
    """
    from knopt.cuda.executor import Executable
    from knopt.cuda.planner import build_plan
    from knopt.cuda.precision import effective_precision, narrow_dtype, narrow_program

    precision = effective_precision(program, precision)
    target = narrow_dtype(precision)
    if target is not None:
        program = narrow_program(program, target)
    return Executable(build_plan(program, precision))


__all__ = ["is_available", "prepare"]
