"""The epilogue of an int8 GEMM (codegen/int8_epilogue.cu): zero points, scales, requantization.

cuBLASLt's IMMA kernels (knopt/cuda/intgemm.py) multiply signed int8 and write the exact int32
accumulator; this kernel turns it into what a quantized model asks for: `sum_k (a - za)(w - zw)`
(zero-point terms added from precomputed column offsets and activation row sums), scaled by a
per-tensor factor, per-row and per-column scales, then either requantized (round half to even,
saturate, add the output zero point) to int8/uint8 or dequantized, with bias and activation, to a
float type. A prologue kernel turns uint8 activations into int8 and sums their rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np

from knopt.cuda.templates import render
from knopt.errors import CodegenError
from knopt.ir.dtype import DType

if TYPE_CHECKING:
    from knopt.cuda.driver import Gpu

_OUT_C_TYPES = {
    DType.I8: "signed char",
    DType.U8: "unsigned char",
    DType.F32: "float",
    DType.F16: "__half",
    DType.BF16: "__nv_bfloat16",
}
_ACTIVATIONS = {"": 0, "relu": 1}
EPILOGUE_THREADS = 256


@dataclass(frozen=True)
class Int8Epilogue:
    """The epilogue of an int8 GEMM: requantize to int8/uint8, or dequantize to a float type.

    Raises:
        CodegenError: If the output type or activation has no kernel, or an activation is asked
            of a requantizing epilogue (fold it into qmin instead, as QDQ models do).
    """

    out: DType
    activation: str = ""

    def __post_init__(self) -> None:
        if self.out not in _OUT_C_TYPES:
            raise CodegenError(f"int8 epilogue cannot write {self.out}")
        if self.activation not in _ACTIVATIONS:
            raise CodegenError(
                f"int8 epilogue activation '{self.activation}' is not one of {sorted(_ACTIVATIONS)}"
            )
        if self.requantizes and self.activation:
            raise CodegenError("a requantizing int8 epilogue takes no activation: clamp by qmin")

    @property
    def requantizes(self) -> bool:
        """True when the epilogue writes int8 or uint8."""
        return self.out in (DType.I8, DType.U8)

    @property
    def name(self) -> str:
        """The kernel's name."""
        return f"int8_epilogue_{self.out.short}{'_' + self.activation if self.activation else ''}"

    def source(self) -> str:
        """The CUDA C++ of the module (includes common.cuh)."""
        return render(
            "int8_epilogue.cu",
            NAME=self.name,
            OUT_T=_OUT_C_TYPES[self.out],
            REQUANTIZE="true" if self.requantizes else "false",
            ACTIVATION=_ACTIVATIONS[self.activation],
        )

    def launch(
        self,
        gpu: Gpu,
        kernel: Any,
        args: EpilogueArgs,
        sizes: tuple[int, int],
        sm_count: int,
    ) -> None:
        """Queue the epilogue over the int32 accumulator [M, N]."""
        m, n = sizes
        blocks = max(1, min(-(-m * n // EPILOGUE_THREADS), 8 * sm_count))
        info = ml_dtypes.iinfo(self.out.numpy) if self.requantizes else None
        values: Sequence[Any] = (
            args.acc,
            np.int32(m),
            np.int32(n),
            args.col_offset,
            args.row_sum,
            args.w_zero,
            args.row_scale,
            args.col_scale,
            np.float32(args.scale),
            args.bias,
            np.int32(args.zero_point),
            np.int32(info.min if info is not None else 0),
            np.int32(info.max if info is not None else 0),
            args.y,
        )
        gpu.launch(kernel, (blocks, 1, 1), (EPILOGUE_THREADS, 1, 1), 0, values)


PROLOGUE = "int8_prologue"


def prologue_source() -> str:
    """The CUDA C++ of the activation prologue (codegen/int8_prologue.cu)."""
    return render("int8_prologue.cu", NAME=PROLOGUE)


def launch_prologue(
    gpu: Gpu, kernel: Any, x: int, out: int, rowsum: int, m: int, k: int, flip: bool
) -> None:
    """Queue the prologue over uint8/int8 activations `x` [M, K] (device addresses, 0 if absent).

    It writes `out = x - 128` (uint8 to int8) if `flip`, else `out = x`, and `rowsum[m]`, the
    sum of row m of `out`.
    """
    args = (x, out, rowsum, np.int32(k), np.int32(int(flip)))
    gpu.launch(kernel, (m, 1, 1), (EPILOGUE_THREADS, 1, 1), 0, args)


@dataclass(frozen=True)
class EpilogueArgs:
    """Device addresses (0 where absent) and scalars of one epilogue launch.

    Attributes:
        acc: int32 accumulator [M, N].
        y: Output [M, N].
        col_offset: int32 [N] added to every row (zero-point terms of the constant weights).
        row_sum: int32 [M], sums of the int8 activation rows (with `w_zero`).
        w_zero: int32 [N] weight zero points; `w_zero[n] * row_sum[m]` is subtracted.
        row_scale: float32 [M] (per-row activation scales).
        col_scale: float32 [N] (per-channel scales, or requantization multipliers).
        scale: Per-tensor factor.
        bias: float32 [N], dequantizing only.
        zero_point: Output zero point, requantizing only.
    """

    acc: int
    y: int
    col_offset: int = 0
    row_sum: int = 0
    w_zero: int = 0
    row_scale: int = 0
    col_scale: int = 0
    scale: float = 1.0
    bias: int = 0
    zero_point: int = 0


def column_offsets(w: np.ndarray, a_zero: int, w_zero: np.ndarray | int) -> np.ndarray:
    """int32 [N]: `K a_zero w_zero[n] - a_zero sum_k w[n, k]` for int8 weights `w` [N, K].

    With these added, and `w_zero[n] * rowsum(a)[m]` subtracted, the int8 GEMM of `a` and `w`
    equals `sum_k (a - a_zero)(w - w_zero)`.
    """
    k = w.shape[1]
    zeros = np.broadcast_to(np.asarray(w_zero, dtype=np.int64), (w.shape[0],))
    sums = w.astype(np.int64).sum(axis=1)
    return (k * a_zero * zeros - a_zero * sums).astype(np.int32)
