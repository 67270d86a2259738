"""int8 GEMMs with int32 accumulation on the tensor cores (cuBLASLt IMMA), and their epilogue.

`D[M, N] = A[M, K] @ W[N, K]^T` with A and W int8, row-major: W is stored as ONNX's
MatMulInteger / QLinearMatMul weights are after a transpose, one output channel a row, which is
what cuBLASLt's IMMA kernels want. In cuBLASLt's column-major terms the product is
`D^T (N x M) = W (op T, stored K x N) @ A^T (op N, stored K x M)`: the "TN" form, the only one
its regular-order IMMA kernels take (the COL32 orders are Turing and Ampere only, not Hopper).
They also need N and K to be multiples of 4 (cuBLASLt's m and k, and the leading dimensions K,
K and N) and 4-byte aligned pointers (16-byte for full speed; knopt's arena aligns to 256).

What D holds is a `GemmOutput`: the exact int32 accumulator (always available), or the
accumulator times a per-output-channel float alpha (`ALPHA_DEVICE_VECTOR_BETA_ZERO`: one alpha
per cuBLASLt row, which is an output channel n), rounded into int8 or written as a float, where
cuBLASLt offers an algorithm for it (`supported_outputs` asks its heuristic). Everything else
(zero points, per-row times per-column scales, knopt's exact requantization, bias,
activation) is codegen/int8_epilogue.cu, launched by `knopt.cuda.int8_epilogue.Int8Epilogue`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import numpy as np
from nvmath import CudaDataType
from nvmath.bindings import cublas
from nvmath.bindings import cublasLt as lt

from knopt.cuda.lt import CANDIDATES, WORKSPACE_LIMIT
from knopt.cuda.lt import call as _call
from knopt.cuda.lt import set_attribute as _set
from knopt.cuda.lt import set_desc as _desc
from knopt.cuda.steps import Gemm
from knopt.errors import CodegenError, CudaError
from knopt.ir.dtype import DType


class GemmOutput(enum.Enum):
    """What an int8 GEMM writes: D's type, and whether a per-channel alpha scales it."""

    I32 = "i32"  # the exact accumulator
    I8 = "i8"  # alpha[n] * acc, rounded and saturated by cuBLASLt
    F32 = "f32"  # alpha[n] * acc
    F16 = "f16"
    BF16 = "bf16"


_D_TYPES = {
    GemmOutput.I32: CudaDataType.CUDA_R_32I,
    GemmOutput.I8: CudaDataType.CUDA_R_8I,
    GemmOutput.F32: CudaDataType.CUDA_R_32F,
    GemmOutput.F16: CudaDataType.CUDA_R_16F,
    GemmOutput.BF16: CudaDataType.CUDA_R_16BF,
}
_D_ITEMSIZE = {
    GemmOutput.I32: 4,
    GemmOutput.I8: 1,
    GemmOutput.F32: 4,
    GemmOutput.F16: 2,
    GemmOutput.BF16: 2,
}


def check_sizes(m: int, n: int, k: int) -> None:
    """Refuse sizes cuBLASLt's IMMA kernels do not take.

    Raises:
        CodegenError: If a size is not positive or N or K is not a multiple of 4.
    """
    if min(m, n, k) < 1:
        raise CodegenError(f"int8 GEMM sizes must be positive, got M={m}, N={n}, K={k}")
    if n % 4 or k % 4:
        raise CodegenError(f"int8 GEMM (IMMA, TN) needs N and K multiples of 4, got N={n}, K={k}")


class IntGemmPlan:
    """One int8 GEMM ready to enqueue: descriptors, layouts, the heuristic's algorithm.

    Attributes:
        workspace: Bytes of workspace the algorithm needs.

    Raises:
        CodegenError: If the sizes are refused (`check_sizes`).
        CudaError: If cuBLASLt has no algorithm for this output.
    """

    def __init__(self, handle: int, m: int, n: int, k: int, output: GemmOutput) -> None:
        check_sizes(m, n, k)
        self.handle, self.m, self.n, self.k, self.output = handle, m, n, k, output
        self._objects: list[tuple[Any, int]] = []
        exact = output is GemmOutput.I32
        scale_type = CudaDataType.CUDA_R_32I if exact else CudaDataType.CUDA_R_32F
        scalar = np.int32 if exact else np.float32
        self.alpha = np.ones(1, dtype=scalar)
        self.beta = np.zeros(1, dtype=scalar)
        self.desc = _call(
            "matmul_desc_create",
            lt.matmul_desc_create,
            cublas.ComputeType.COMPUTE_32I,
            scale_type,
        )
        self._objects.append((lt.matmul_desc_destroy, self.desc))
        _desc(self.desc, lt.MatmulDescAttribute.TRANSA, cublas.Operation.T)
        _desc(self.desc, lt.MatmulDescAttribute.TRANSB, cublas.Operation.N)
        if not exact:
            mode = lt.PointerMode.ALPHA_DEVICE_VECTOR_BETA_ZERO
            _desc(self.desc, lt.MatmulDescAttribute.POINTER_MODE, mode)
        int8 = CudaDataType.CUDA_R_8I
        self.w_layout = self._layout(int8, k, n, k)
        self.a_layout = self._layout(int8, k, m, k)
        self.d_layout = self._layout(_D_TYPES[output], n, m, n)
        try:
            self.algo, self.workspace = self._choose()
        except CudaError:
            self.close()
            raise

    def _layout(self, dtype: int, rows: int, cols: int, ld: int) -> int:
        layout = _call("matrix_layout_create", lt.matrix_layout_create, dtype, rows, cols, ld)
        self._objects.append((lt.matrix_layout_destroy, layout))
        return int(layout)

    def _choose(self) -> tuple[np.ndarray, int]:
        preference = _call("matmul_preference_create", lt.matmul_preference_create)
        try:
            _set(
                lt.matmul_preference_set_attribute,
                lt.get_matmul_preference_attribute_dtype,
                preference,
                lt.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES,
                WORKSPACE_LIMIT,
                "matmul_preference_set_attribute",
            )
            results = np.zeros(CANDIDATES, dtype=lt.matmul_heuristic_result_dtype)
            count = np.zeros(1, dtype=np.int32)
            _call(
                "matmul_algo_get_heuristic",
                lt.matmul_algo_get_heuristic,
                self.handle,
                self.desc,
                self.w_layout,
                self.a_layout,
                self.d_layout,
                self.d_layout,
                preference,
                CANDIDATES,
                results.ctypes.data,
                count.ctypes.data,
            )
        finally:
            _call("matmul_preference_destroy", lt.matmul_preference_destroy, preference)
        if count[0] == 0:
            raise CudaError(
                "cublasLt.matmul_algo_get_heuristic",
                "no algorithm",
                f"no IMMA algorithm for M={self.m}, N={self.n}, K={self.k} -> {self.output.value}",
            )
        best = results[:1].copy()
        return best, int(best[0]["workspace_size"])

    def enqueue(self, a: int, w: int, d: int, workspace: int, stream: int, alpha: int = 0) -> None:
        """Queue `D = A @ W^T` (device addresses); `alpha`: the [N] float32 scales, if scaled.

        Raises:
            CodegenError: If a scaled output has no alpha, or the exact one has one.
        """
        exact = self.output is GemmOutput.I32
        if exact == bool(alpha):
            raise CodegenError(
                f"int8 GEMM to {self.output.value}: alpha must be "
                f"{'absent' if exact else 'a device vector of N float32'}"
            )
        fields = self.algo.dtype.fields
        assert fields is not None
        algo = self.algo.ctypes.data + fields["algo"][1]
        _call(
            "matmul",
            lt.matmul,
            self.handle,
            self.desc,
            self.alpha.ctypes.data if exact else alpha,
            w,
            self.w_layout,
            a,
            self.a_layout,
            self.beta.ctypes.data,
            d,
            self.d_layout,
            d,
            self.d_layout,
            algo,
            workspace,
            self.workspace,
            stream,
        )

    @property
    def d_bytes(self) -> int:
        """Bytes of D."""
        return self.m * self.n * _D_ITEMSIZE[self.output]

    def close(self) -> None:
        """Destroy the cuBLASLt descriptors."""
        while self._objects:
            destroy, obj = self._objects.pop()
            _call(destroy.__name__, destroy, obj)


def supported_outputs(handle: int, m: int, n: int, k: int) -> list[GemmOutput]:
    """The outputs cuBLASLt has an IMMA algorithm for at these sizes (on this GPU and version)."""
    found = []
    for output in GemmOutput:
        try:
            plan = IntGemmPlan(handle, m, n, k, output)
        except CudaError:
            continue
        plan.close()
        found.append(output)
    return found


# A `Gemm` step of these types is an int8 GEMM (knopt/cuda/gen/quantized.py writes them): its
# operands are int8 and its result the exact int32 accumulator.
INT8_GEMM_TYPES = frozenset({DType.I8})


class Int8GemmCall:
    """A `Gemm` step of int8 operands as cuBLASLt's IMMA GEMM, the way `Blas.plan` returns plans.

    The step's A is row-major `[M, K]` and its B the transpose of a row-major `[N, K]` (each
    output channel a row): the "TN" form (see the module docstring); D is int32 `[M, N]`.

    Attributes:
        fused: False: the int8 GEMM fuses nothing; its epilogue is a kernel of its own.
        workspace: Bytes of workspace the algorithm needs.

    Raises:
        CodegenError: If the step is not in that form.
        CudaError: If cuBLASLt has no algorithm for it.
    """

    fused = False

    def __init__(self, handle: int, step: Gemm) -> None:
        a, b, d = step.a, step.b, step.d
        m, k, n = a.rows, a.cols, b.cols
        tn = a.col_stride == 1 and a.row_stride == k and b.row_stride == 1 and b.col_stride == k
        if step.batch != 1 or not tn or d.row_stride != n or d.col_stride != 1:
            raise CodegenError(
                f"int8 GEMM {m}x{k}x{n}: needs dense row-major A, B stored as [N, K] and one "
                "matrix (the planner makes them so)"
            )
        self.step = step
        self.plan = IntGemmPlan(handle, m, n, k, GemmOutput.I32)
        self.workspace = self.plan.workspace

    def enqueue(self, addresses: Mapping[int, int], workspace: int, stream: int) -> None:
        """Queue `D = A @ B` on `stream` (addresses by plan tensor id)."""
        step = self.step
        self.plan.enqueue(
            addresses[step.a.tensor],
            addresses[step.b.tensor],
            addresses[step.d.tensor],
            workspace,
            stream,
        )
