"""cuBLASLt GEMMs with fused epilogues, through nvmath-python's low-level bindings.

One cached plan (descriptors, layouts and the heuristic's algorithm) per distinct GEMM.

Row-major `D = A @ B` is column-major `D^T = B^T @ A^T`, so cuBLASLt's "A" is our B and its
"B" our A; the bias vector then runs along cuBLASLt's rows, which are our output columns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from nvmath import CudaDataType
from nvmath.bindings import cublas
from nvmath.bindings import cublasLt as lt

from knopt.cuda.intgemm import INT8_GEMM_TYPES, Int8GemmCall
from knopt.cuda.lt import CANDIDATES, WORKSPACE_LIMIT
from knopt.cuda.lt import call as _call
from knopt.cuda.lt import set_attribute as _set
from knopt.cuda.lt import set_desc as _desc
from knopt.cuda.steps import Gemm, Operand
from knopt.errors import CudaError
from knopt.ir.dtype import DType

_TYPES = {
    DType.F32: CudaDataType.CUDA_R_32F,
    DType.F16: CudaDataType.CUDA_R_16F,
    DType.BF16: CudaDataType.CUDA_R_16BF,
    DType.F64: CudaDataType.CUDA_R_64F,
}
_EPILOGUES = {
    ("", False): lt.Epilogue.DEFAULT,
    ("", True): lt.Epilogue.BIAS,
    ("relu", False): lt.Epilogue.RELU,
    ("relu", True): lt.Epilogue.RELU_BIAS,
    ("gelu_tanh", False): lt.Epilogue.GELU,
    ("gelu_tanh", True): lt.Epilogue.GELU_BIAS,
}


class GemmPlan:
    """One GEMM ready to enqueue: descriptors, algorithm, scalars.

    Attributes:
        fused: Whether the step's epilogue runs inside the GEMM (else the caller applies the
            step's fallback kernel after a plain GEMM).
        workspace: Bytes of workspace the algorithm needs.
    """

    def __init__(self, handle: int, step: Gemm, fused: bool) -> None:
        self.handle = handle
        self.step = step
        self.fused = fused
        dtype = _TYPES[step.dtype]
        scale_dtype: type[np.floating[Any]]
        if step.dtype is DType.F64:
            compute, scale_type, scale_dtype = (
                cublas.ComputeType.COMPUTE_64F,
                CudaDataType.CUDA_R_64F,
                np.float64,
            )
        elif step.dtype is DType.F32 and step.precision == "tf32":
            compute, scale_type, scale_dtype = (
                cublas.ComputeType.COMPUTE_32F_FAST_TF32,
                CudaDataType.CUDA_R_32F,
                np.float32,
            )
        else:
            compute, scale_type, scale_dtype = (
                cublas.ComputeType.COMPUTE_32F,
                CudaDataType.CUDA_R_32F,
                np.float32,
            )
        self.desc = _call("matmul_desc_create", lt.matmul_desc_create, compute, scale_type)
        a, b = step.a, step.b  # our operands; cuBLASLt's A is b and its B is a
        transa = cublas.Operation.N if b.col_stride == 1 else cublas.Operation.T
        transb = cublas.Operation.N if a.col_stride == 1 else cublas.Operation.T
        _desc(self.desc, lt.MatmulDescAttribute.TRANSA, transa)
        _desc(self.desc, lt.MatmulDescAttribute.TRANSB, transb)
        alpha, beta = (
            (step.alpha, 1.0 if step.residual is not None else 0.0) if fused else (1.0, 0.0)
        )
        if fused:
            _desc(
                self.desc,
                lt.MatmulDescAttribute.EPILOGUE,
                _EPILOGUES[(step.activation, step.bias is not None)],
            )
            if step.bias is not None:
                _desc(self.desc, lt.MatmulDescAttribute.BIAS_DATA_TYPE, dtype)
        self.alpha = np.array([alpha], dtype=scale_dtype)
        self.beta = np.array([beta], dtype=scale_dtype)
        self.a_layout = self._layout(dtype, b, transa == cublas.Operation.N, step.batch)
        self.b_layout = self._layout(dtype, a, transb == cublas.Operation.N, step.batch)
        self.d_layout = self._layout(dtype, step.d, True, step.batch)
        self.c_layout = self.d_layout
        if fused and step.residual is not None:
            self.c_layout = self._layout(dtype, step.residual, True, step.batch)
        self.algo, self.workspace = self._choose()

    def _layout(self, dtype: int, operand: Operand, row_major: bool, batch: int) -> int:
        # A row-major (rows x cols) matrix is column-major (cols x rows) with ld = row stride.
        if row_major:
            rows, cols, ld = operand.cols, operand.rows, operand.row_stride
        else:
            rows, cols, ld = operand.rows, operand.cols, operand.col_stride
        layout = _call(
            "matrix_layout_create", lt.matrix_layout_create, dtype, rows, cols, max(ld, rows, 1)
        )
        if batch > 1:
            for attribute, value in (
                (lt.MatrixLayoutAttribute.BATCH_COUNT, batch),
                (lt.MatrixLayoutAttribute.STRIDED_BATCH_OFFSET, operand.batch_stride),
            ):
                _set(
                    lt.matrix_layout_set_attribute,
                    lt.get_matrix_layout_attribute_dtype,
                    layout,
                    attribute,
                    value,
                    "matrix_layout_set_attribute",
                )
        return layout

    def _choose(self) -> tuple[np.ndarray, int]:
        preference = _call("matmul_preference_create", lt.matmul_preference_create)
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
            self.a_layout,
            self.b_layout,
            self.c_layout,
            self.d_layout,
            preference,
            CANDIDATES,
            results.ctypes.data,
            count.ctypes.data,
        )
        _call("matmul_preference_destroy", lt.matmul_preference_destroy, preference)
        if count[0] == 0:
            raise CudaError(
                "cublasLt.matmul_algo_get_heuristic",
                "no algorithm",
                f"no cuBLASLt algorithm for {self.step}",
            )
        best = results[:1].copy()
        return best, int(best[0]["workspace_size"])

    def enqueue(self, addresses: Mapping[int, int], workspace: int, stream: int) -> None:
        """Queue the GEMM on `stream` (addresses by plan tensor id)."""
        step = self.step
        if self.fused and step.bias is not None:
            _desc(self.desc, lt.MatmulDescAttribute.BIAS_POINTER, addresses[step.bias])
        a, b, d = addresses[step.a.tensor], addresses[step.b.tensor], addresses[step.d.tensor]
        c = addresses[step.residual.tensor] if self.fused and step.residual is not None else d
        fields = self.algo.dtype.fields
        assert fields is not None
        algo = self.algo.ctypes.data + fields["algo"][1]
        _call(
            "matmul",
            lt.matmul,
            self.handle,
            self.desc,
            self.alpha.ctypes.data,
            b,
            self.a_layout,
            a,
            self.b_layout,
            self.beta.ctypes.data,
            c,
            self.c_layout,
            d,
            self.d_layout,
            algo,
            workspace,
            self.workspace,
            stream,
        )


class Blas:
    """A cuBLASLt handle and the plans made with it."""

    def __init__(self) -> None:
        self.handle = _call("create", lt.create)
        self._plans: dict[Gemm, GemmPlan] = {}

    def plan(self, step: Gemm) -> GemmPlan | Int8GemmCall:
        """The plan of `step`: fused if cuBLASLt takes its epilogue, else plain.

        Raises:
            CudaError: If cuBLASLt has no algorithm even for the plain GEMM.
        """
        if step.dtype in INT8_GEMM_TYPES:
            return Int8GemmCall(self.handle, step)  # int8 products: knopt/cuda/intgemm.py
        if step not in self._plans:
            fusing = (
                step.bias is not None
                or step.residual is not None
                or bool(step.activation)
                or step.alpha != 1.0
            )
            try:
                self._plans[step] = GemmPlan(self.handle, step, True)
            except CudaError:
                if not fusing or step.fallback is None:
                    raise
                self._plans[step] = GemmPlan(self.handle, step, False)
        return self._plans[step]
