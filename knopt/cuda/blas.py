"""cuBLASLt GEMMs with fused epilogues, through nvmath-python's low-level bindings.

A `GemmPlan` (descriptors, layouts and algorithm) is made once per `GemmKey`: the sizes, types,
orders, strides, epilogue and operand alignment of a GEMM, without its tensors, so every GEMM of
one shape shares it and a planner may make plans per concrete size, lazily. The algorithm is the
fastest of cuBLASLt's top heuristic candidates, timed on scratch memory on the executor's stream
(`knopt.cuda.tuning`), and remembered on disk per GPU and cuBLASLt version.

Row-major `D = A @ B` is column-major `D^T = B^T @ A^T`, so cuBLASLt's "A" is our B and its
"B" our A; the bias vector then runs along cuBLASLt's rows, which are our output columns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from nvmath import CudaDataType
from nvmath.bindings import cublas
from nvmath.bindings import cublasLt as lt

from knopt.cuda import nvrtc, tuning
from knopt.cuda.intgemm import INT8_GEMM_TYPES, Int8GemmCall
from knopt.cuda.lt import CANDIDATES, WORKSPACE_LIMIT
from knopt.cuda.lt import call as _call
from knopt.cuda.lt import set_attribute as _set
from knopt.cuda.lt import set_desc as _desc
from knopt.cuda.steps import Gemm, Operand
from knopt.errors import CudaError
from knopt.ir.dtype import DType

SCRATCH_FILL = 0x3C  # bytes of timing operands: 1.06 in f16, 0.0115 in f32, finite in every type

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


def _preference(preference: int, attribute: Any, value: int) -> None:
    _set(
        lt.matmul_preference_set_attribute,
        lt.get_matmul_preference_attribute_dtype,
        preference,
        attribute,
        value,
        "matmul_preference_set_attribute",
    )


Matrix = tuple[int, int, int, int, int]  # rows, cols, row stride, col stride, batch stride


def _matrix(operand: Operand) -> Matrix:
    return (
        operand.rows,
        operand.cols,
        operand.row_stride,
        operand.col_stride,
        operand.batch_stride,
    )


@dataclass(frozen=True)
class GemmKey:
    """What a GEMM's plan and algorithm depend on (no tensors, no alpha).

    Attributes:
        compute: "64F", "32F" (strict) or "32F_FAST_TF32" (cuBLAS compute type names).
        c: The residual's matrix (beta 1), or None.
        alignment: Bytes each of a, b, c and d is aligned to (a power of two, at most 256).
    """

    a: Matrix
    b: Matrix
    d: Matrix
    c: Matrix | None
    batch: int
    dtype: DType
    compute: str
    activation: str
    bias: bool
    alignment: tuple[int, int, int, int]

    def text(self) -> str:
        """The key as stable text (the tuning file's key)."""
        return tuning.key_text(
            f"a{list(self.a)} b{list(self.b)} d{list(self.d)}",
            f"c{list(self.c) if self.c else '-'} x{self.batch} {self.dtype.short}",
            f"{self.compute} act={self.activation or '-'} bias={int(self.bias)}",
            f"align{list(self.alignment)}",
        )


def compute_name(dtype: DType, precision: str) -> str:
    """The cuBLAS compute type a GEMM of `dtype` uses under `precision`."""
    if dtype is DType.F64:
        return "64F"
    if dtype is DType.F32 and precision == "tf32":
        return "32F_FAST_TF32"
    return "32F"


def gemm_key(step: Gemm, fused: bool) -> GemmKey:
    """The key of `step` as planned with (`fused`) or without its epilogue."""
    residual = step.residual if fused else None
    return GemmKey(
        _matrix(step.a),
        _matrix(step.b),
        _matrix(step.d),
        _matrix(residual) if residual is not None else None,
        step.batch,
        step.dtype,
        compute_name(step.dtype, step.precision),
        step.activation if fused else "",
        fused and step.bias is not None,
        step.alignment,
    )


_COMPUTE = {
    "64F": (cublas.ComputeType.COMPUTE_64F, CudaDataType.CUDA_R_64F),
    "32F": (cublas.ComputeType.COMPUTE_32F, CudaDataType.CUDA_R_32F),
    "32F_FAST_TF32": (cublas.ComputeType.COMPUTE_32F_FAST_TF32, CudaDataType.CUDA_R_32F),
}


class GemmPlan:
    """Descriptors, layouts and the chosen algorithm of one `GemmKey`.

    Attributes:
        workspace: Bytes of workspace the chosen algorithm needs.
        times: Seconds per call of each timed candidate (empty when not timed).
        chosen: The index of the chosen candidate in the heuristic's ranking.

    Raises:
        CudaError: If cuBLASLt has no algorithm for the key.
    """

    def __init__(self, handle: int, key: GemmKey) -> None:
        self.handle = handle
        self.key = key
        dtype = _TYPES[key.dtype]
        compute, scale_type = _COMPUTE[key.compute]
        self.scale_dtype = np.float64 if key.compute == "64F" else np.float32
        self.desc = _call("matmul_desc_create", lt.matmul_desc_create, compute, scale_type)
        # cuBLASLt's A is our b and its B our a (see the module docstring).
        transa = cublas.Operation.N if key.b[3] == 1 else cublas.Operation.T
        transb = cublas.Operation.N if key.a[3] == 1 else cublas.Operation.T
        _desc(self.desc, lt.MatmulDescAttribute.TRANSA, transa)
        _desc(self.desc, lt.MatmulDescAttribute.TRANSB, transb)
        _desc(self.desc, lt.MatmulDescAttribute.EPILOGUE, _EPILOGUES[(key.activation, key.bias)])
        if key.bias:
            _desc(self.desc, lt.MatmulDescAttribute.BIAS_DATA_TYPE, dtype)
        self.a_layout = _layout(dtype, key.b, transa == cublas.Operation.N, key.batch)
        self.b_layout = _layout(dtype, key.a, transb == cublas.Operation.N, key.batch)
        self.d_layout = _layout(dtype, key.d, True, key.batch)
        self.c_layout = self.d_layout if key.c is None else _layout(dtype, key.c, True, key.batch)
        self.candidates = self._heuristic()
        self.times: list[float] = []
        self.chosen = 0
        self.workspace = int(self.candidates[0]["workspace_size"])

    def _heuristic(self) -> np.ndarray:
        preference = _call("matmul_preference_create", lt.matmul_preference_create)
        attribute = lt.MatmulPreferenceAttribute
        _preference(preference, attribute.MAX_WORKSPACE_BYTES, WORKSPACE_LIMIT)
        a, b, c, d = self.key.alignment
        # cuBLASLt's A is our b and its B our a (the module docstring): told the other way
        # round, it may pick vector loads wider than the less aligned operand allows.
        for name, value in zip("ABCD", (b, a, c, d), strict=True):
            _preference(preference, getattr(attribute, f"MIN_ALIGNMENT_{name}_BYTES"), value)
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
                f"no cuBLASLt algorithm for {self.key.text()}",
            )
        return results[: int(count[0])].copy()

    def algorithm_bytes(self, index: int) -> str:
        """Candidate `index`'s algorithm as hex (what the tuning file stores)."""
        return self.candidates[index]["algo"].tobytes().hex()

    def choose(self, index: int, times: list[float] | None = None) -> None:
        """Use candidate `index` from now on."""
        self.chosen = index
        self.times = list(times or [])
        self.workspace = int(self.candidates[index]["workspace_size"])

    def run(
        self,
        index: int,
        pointers: tuple[int, int, int, int],
        bias: int,
        scalars: tuple[np.ndarray, np.ndarray],
        workspace: int,
        stream: int,
    ) -> None:
        """Queue candidate `index` on `stream` (pointers: our a, b, c and d)."""
        if self.key.bias:
            _desc(self.desc, lt.MatmulDescAttribute.BIAS_POINTER, bias)
        a, b, c, d = pointers
        candidate = self.candidates[index : index + 1]
        fields = candidate.dtype.fields
        assert fields is not None
        algo = candidate.ctypes.data + fields["algo"][1]
        alpha, beta = scalars
        _call(
            "matmul",
            lt.matmul,
            self.handle,
            self.desc,
            alpha.ctypes.data,
            b,
            self.a_layout,
            a,
            self.b_layout,
            beta.ctypes.data,
            c,
            self.c_layout,
            d,
            self.d_layout,
            algo,
            workspace,
            int(candidate[0]["workspace_size"]),
            stream,
        )


def _layout(dtype: int, matrix: Matrix, row_major: bool, batch: int) -> int:
    # A row-major (rows x cols) matrix is column-major (cols x rows) with ld = row stride.
    rows, cols, row_stride, col_stride, batch_stride = matrix
    if row_major:
        rows, cols, ld = cols, rows, row_stride
    else:
        ld = col_stride
    layout = _call(
        "matrix_layout_create", lt.matrix_layout_create, dtype, rows, cols, max(ld, rows, 1)
    )
    if batch > 1:
        for attribute, value in (
            (lt.MatrixLayoutAttribute.BATCH_COUNT, batch),
            (lt.MatrixLayoutAttribute.STRIDED_BATCH_OFFSET, batch_stride),
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


class BoundGemm:
    """A `GemmPlan` applied to one step's tensors and scalars: what the executor enqueues.

    Attributes:
        fused: Whether the step's epilogue runs inside the GEMM (else the caller applies the
            step's fallback kernel after a plain GEMM).
        workspace: Bytes of workspace the algorithm needs.
    """

    def __init__(self, plan: GemmPlan, step: Gemm, fused: bool) -> None:
        self.plan = plan
        self.step = step
        self.fused = fused
        alpha, beta = (
            (step.alpha, 1.0 if step.residual is not None else 0.0) if fused else (1.0, 0.0)
        )
        self.scalars = (
            np.array([alpha], dtype=plan.scale_dtype),
            np.array([beta], dtype=plan.scale_dtype),
        )

    @property
    def workspace(self) -> int:
        """Bytes of workspace the chosen algorithm needs."""
        return self.plan.workspace

    def enqueue(self, addresses: Mapping[int, int], workspace: int, stream: int) -> None:
        """Queue the GEMM on `stream` (addresses by plan tensor id)."""
        step = self.step
        a, b, d = addresses[step.a.tensor], addresses[step.b.tensor], addresses[step.d.tensor]
        c = addresses[step.residual.tensor] if self.fused and step.residual is not None else d
        bias = addresses[step.bias] if self.fused and step.bias is not None else 0
        self.plan.run(self.plan.chosen, (a, b, c, d), bias, self.scalars, workspace, stream)


def _extent(matrix: Matrix, batch: int, itemsize: int) -> int:
    """Bytes from a matrix's first element to past its last."""
    rows, cols, row_stride, col_stride, batch_stride = matrix
    last = (rows - 1) * row_stride + (cols - 1) * col_stride + (batch - 1) * batch_stride
    return (last + 1) * itemsize


class Blas:
    """A cuBLASLt handle and the plans made with it, one per `GemmKey`.

    Args:
        gpu: The GPU whose stream times the candidates (None: no timing, the heuristic's
            first pick, as with `KNOPT_TUNE=0`).
    """

    def __init__(self, gpu: Any = None) -> None:
        self.handle = _call("create", lt.create)
        self.gpu = gpu
        self._plans: dict[GemmKey, GemmPlan] = {}
        self._cache: tuning.TuningCache | None = None

    def plan(self, step: Gemm) -> BoundGemm | Int8GemmCall:
        """The plan of `step`: fused if cuBLASLt takes its epilogue, else plain.

        Must be called outside any stream capture (it may time candidates).

        Raises:
            CudaError: If cuBLASLt has no algorithm even for the plain GEMM.
        """
        if step.dtype in INT8_GEMM_TYPES:
            return Int8GemmCall(self.handle, step)  # int8 products: knopt/cuda/intgemm.py
        fusing = (
            step.bias is not None
            or step.residual is not None
            or bool(step.activation)
            or step.alpha != 1.0
        )
        try:
            return BoundGemm(self.plan_key(gemm_key(step, True)), step, True)
        except CudaError:
            if not fusing or step.fallback is None:
                raise
        return BoundGemm(self.plan_key(gemm_key(step, False)), step, False)

    def plan_key(self, key: GemmKey) -> GemmPlan:
        """The plan of `key`, made (and its algorithm chosen) on first use."""
        if key not in self._plans:
            plan = GemmPlan(self.handle, key)
            if self.gpu is not None and tuning.tuning_enabled() and len(plan.candidates) > 1:
                self._tune(plan)
            self._plans[key] = plan
        return self._plans[key]

    def _tuning_cache(self) -> tuning.TuningCache:
        if self._cache is None:
            version = _call("get_version", lt.get_version)
            path = tuning.cache_file(nvrtc.cache_dir(), "cublaslt", version, self.gpu.name)
            self._cache = tuning.TuningCache(path)
        return self._cache

    def _tune(self, plan: GemmPlan) -> None:
        cache = self._tuning_cache()
        text = plan.key.text()
        stored = cache.get(text)
        index = stored.get("index") if stored is not None else None
        # The stored choice holds while the heuristic still ranks that algorithm there.
        if (
            stored is not None
            and isinstance(index, int)
            and 0 <= index < len(plan.candidates)
            and plan.algorithm_bytes(index) == stored.get("algo")
        ):
            plan.choose(index)
            return
        times = self._time(plan)
        best = tuning.fastest(times)
        plan.choose(best, times)
        cache.put(
            text,
            {
                "index": best,
                "algo": plan.algorithm_bytes(best),
                "seconds": [t if np.isfinite(t) else None for t in times],
            },
        )

    def _time(self, plan: GemmPlan) -> list[float]:
        """Seconds per call of each candidate, on scratch operands shaped like the key's."""
        key = plan.key
        item = key.dtype.itemsize
        parts = [
            _extent(key.a, key.batch, item),
            _extent(key.b, key.batch, item),
            _extent(key.c, key.batch, item) if key.c is not None else 0,
            _extent(key.d, key.batch, item),
            key.d[1] * item if key.bias else 0,
        ]
        offsets, total = [], 0
        for index, size in enumerate(parts):
            # Each operand starts `alignment` bytes past a 256-byte boundary, as aligned as the
            # real one is and no more, so the timed kernels are the ones that will run.
            shift = key.alignment[index] % 256 if index < 4 else 0
            offsets.append(total + shift)
            total += -(-(size + shift) // 256) * 256 + 256
        gpu = self.gpu
        scratch = gpu.device.allocate(total + WORKSPACE_LIMIT, stream=gpu.stream)
        try:
            base = int(scratch.handle)
            gpu.fill(base, SCRATCH_FILL, total)
            a, b, c, d, bias = (base + o for o in offsets)
            pointers = (a, b, c if key.c is not None else d, d)
            scalars = (
                np.ones(1, dtype=plan.scale_dtype),
                np.full(1, 1.0 if key.c is not None else 0.0, dtype=plan.scale_dtype),
            )
            workspace = base + total
            stream = gpu.stream_handle

            def candidate(index: int) -> Any:
                return lambda: plan.run(index, pointers, bias, scalars, workspace, stream)

            return tuning.time_candidates(gpu, [candidate(i) for i in range(len(plan.candidates))])
        finally:
            gpu.sync()
            scratch.close(gpu.stream)
