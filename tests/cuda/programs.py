"""Hand-built kernel Programs (fused kinds included) and running them on the GPU and the CPU."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from knopt.cpu.program import run_program
from knopt.errors import CudaError
from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.graph import Graph
from knopt.ir.op import TensorType
from knopt.ir.program import Expr, Kernel, Program, Tensor, program_from_graph
from knopt.ir.shape import Dim


class ProgramBuilder:
    """Tensors and kernels added in order; `build` marks the outputs."""

    def __init__(self) -> None:
        self.tensors: list[Tensor] = []
        self.kernels: list[Kernel] = []
        self.inputs: list[int] = []
        self.names: list[str] = []
        self.constants: dict[int, np.ndarray] = {}

    def _tensor(self, shape: Sequence[Dim], dtype: DType, role: str) -> int:
        self.tensors.append(Tensor(len(self.tensors), TensorType(tuple(shape), dtype), role))
        return len(self.tensors) - 1

    def input(self, name: str, shape: Sequence[Dim], dtype: DType = DType.F32) -> int:
        tid = self._tensor(shape, dtype, "input")
        self.inputs.append(tid)
        self.names.append(name)
        return tid

    def constant(self, array: np.ndarray) -> int:
        tid = self._tensor(array.shape, DType.from_numpy(array.dtype), "constant")
        self.constants[tid] = array
        return tid

    def view(self, op: ops.Op, source: int) -> int:
        out = op.infer([self.tensors[source].type], "view")
        tid = self._tensor(out.shape, out.dtype, "intermediate")
        self.kernels.append(Kernel("view", op, (source,), tid))
        return tid

    def kernel(
        self,
        kind: str,
        op: ops.Op | None,
        inputs: Sequence[int],
        shape: Sequence[Dim],
        dtype: DType,
        *,
        body: Expr | None = None,
        prologue: Expr | None = None,
        epilogue: Expr | None = None,
    ) -> int:
        tid = self._tensor(shape, dtype, "intermediate")
        self.kernels.append(Kernel(kind, op, tuple(inputs), tid, body, prologue, epilogue))
        return tid

    def op(self, op: ops.Op, inputs: Sequence[int]) -> int:
        out = op.infer([self.tensors[t].type for t in inputs], op.name)
        return self.kernel(op.name, op, inputs, out.shape, out.dtype)

    def build(self, outputs: Sequence[int]) -> Program:
        tensors = [
            Tensor(t.id, t.type, "output" if t.id in outputs else t.role) for t in self.tensors
        ]
        return Program(
            tensors,
            list(self.kernels),
            list(self.inputs),
            list(self.names),
            list(outputs),
            [f"out{i}" for i in range(len(outputs))],
            dict(self.constants),
        )


def random_feeds(program: Program, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random non-zero inputs for every program input."""
    feeds = {}
    for name, tid in zip(program.input_names, program.inputs, strict=True):
        t = program.tensors[tid].type
        feeds[name] = random_array(rng, t.shape, t.dtype)  # type: ignore[arg-type]
    return feeds


def random_array(rng: np.random.Generator, shape: Sequence[int], dtype: DType) -> np.ndarray:
    """Values in about [-3, 3), never zero; bools random; unsigned ints positive."""
    if dtype is DType.BOOL:
        return rng.random(shape) < 0.5
    if dtype.is_float:
        values = rng.uniform(-3, 3, shape)
        values = np.where(np.abs(values) < 1e-2, 0.5, values)
        return values.astype(dtype.numpy)
    low = 1 if not dtype.is_signed else -5
    ints = rng.integers(low, 6, shape)
    return np.where(ints == 0, 1, ints).astype(dtype.numpy)


def compare(
    program: Program,
    feeds: Mapping[str, np.ndarray],
    *,
    precision: str = "f32",
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Run `program` on the GPU and on the CPU oracle; assert the outputs match.

    f32 strict uses rtol 1e-4, atol 1e-5; fp16/bf16 compare to the f32 oracle with rtol 1e-2
    and an atol of 1e-2 of the output's largest magnitude.
    """
    from knopt.cuda import prepare

    expected = run_program(program, feeds)
    actual = prepare(program, precision).run(feeds)
    narrow = precision in ("fp16", "bf16")
    for i, (mine, theirs) in enumerate(zip(actual, expected, strict=True)):
        assert mine.shape == theirs.shape, f"output {i}"
        assert mine.dtype == theirs.dtype, f"output {i}"
        if theirs.dtype.kind in "biu" or theirs.dtype == np.bool_:
            np.testing.assert_array_equal(mine, theirs, err_msg=f"output {i}")
            continue
        scale = float(np.max(np.abs(theirs[np.isfinite(theirs)]), initial=1.0))
        r = rtol if rtol is not None else (1e-2 if narrow else 1e-4)
        a = atol if atol is not None else (1e-2 * scale if narrow else 1e-5)
        np.testing.assert_allclose(
            mine.astype(np.float64),
            theirs.astype(np.float64),
            rtol=r,
            atol=a,
            err_msg=f"output {i}",
        )


def compare_graph(graph: Graph, feeds: Mapping[str, np.ndarray], **kwargs: object) -> None:
    """`compare` on the unfused program of a graph with static sizes."""
    compare(program_from_graph(graph), feeds, **kwargs)  # type: ignore[arg-type]


def loaded_nvrtc() -> ModuleType:
    """knopt's NVRTC module once NVRTC loads; else the test skips, saying why (no GPU needed)."""
    pytest.importorskip("cuda.bindings.nvrtc", reason="needs cuda-python's NVRTC")
    from knopt.cuda import nvrtc

    try:
        nvrtc.version()
    except (CudaError, RuntimeError) as err:
        pytest.skip(f"NVRTC cannot load: {err}")
    return nvrtc


# A kernel that copies `src` into `a` (`count` halves) after spinning `spin` clocks: put ahead
# of a kernel that loads its weight before it waits (KN_PDL_OPEN), it writes the activations
# that kernel may read only after the wait (knopt's kernels let the next start at once).
SLOW_COPY = r"""
#include "common.cuh"
extern "C" __global__ void slow_copy(__half* a, const __half* src, int count, long long spin) {
  KN_PDL_BEGIN();
  const long long start = clock64();
  while (clock64() - start < spin) {
  }
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
    a[i] = src[i];
  }
}
"""


def slow_copy_kernel(gpu: Any) -> Any:
    """SLOW_COPY compiled and loaded on `gpu` (a `knopt.cuda.driver.Gpu`)."""
    from knopt.cuda import nvrtc

    return gpu.load(nvrtc.compile_cubin(SLOW_COPY, gpu.arch), ["slow_copy"])["slow_copy"]
