"""Element types. `DType` is valued by ONNX `TensorProto` codes, so `DType(proto.data_type)` works.

Each dtype's facts (numpy type, byte size, CUDA C name, kind) sit in one table beside the enum.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from knopt.errors import UnsupportedModelError


class DType(enum.IntEnum):
    """Element types knopt supports, valued by ONNX `TensorProto.DataType` codes."""

    F32 = 1
    U8 = 2
    I8 = 3
    U16 = 4
    I16 = 5
    I32 = 6
    I64 = 7
    BOOL = 9
    F16 = 10
    F64 = 11
    U32 = 12
    U64 = 13
    BF16 = 16
    # Narrow storage types of quantized models. Arithmetic on them runs in f32 (or int8/uint8
    # for the integer ones) and rounds back; most models only cast them or (de)quantize.
    F8E4M3FN = 17
    F8E4M3FNUZ = 18
    F8E5M2 = 19
    F8E5M2FNUZ = 20
    U4 = 21
    I4 = 22
    F4E2M1 = 23
    F8E8M0 = 24
    U2 = 25
    I2 = 26

    @property
    def info(self) -> DTypeInfo:
        """The facts about this dtype."""
        return _INFO[self]

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype that holds values of this type."""
        return _INFO[self].numpy

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return _INFO[self].numpy.itemsize

    @property
    def is_float(self) -> bool:
        """True for floating-point types."""
        return _INFO[self].kind == "float"

    @property
    def is_int(self) -> bool:
        """True for signed and unsigned integer types (not bool)."""
        return _INFO[self].kind in ("int", "uint")

    @property
    def is_signed(self) -> bool:
        """True for floats and signed integers."""
        return _INFO[self].kind in ("float", "int")

    @property
    def short(self) -> str:
        """Short lowercase name used in dumps and rule files (f32, i64, bool...)."""
        return self.name.lower()

    @classmethod
    def from_numpy(cls, dtype: np.dtype | type) -> DType:
        """The DType of a numpy dtype.

        Raises:
            UnsupportedModelError: If knopt has no such dtype.
        """
        try:
            return _FROM_NUMPY[np.dtype(dtype)]
        except KeyError:
            raise UnsupportedModelError(f"numpy dtype {np.dtype(dtype)} is not supported") from None

    @classmethod
    def from_onnx(cls, code: int, where: str) -> DType:
        """The DType of an ONNX `TensorProto` data type code.

        Raises:
            UnsupportedModelError: If the code names a type knopt lacks (string, float8, int4...).
        """
        try:
            return cls(code)
        except ValueError:
            name = _onnx_type_name(code)
            supported = ", ".join(d.short for d in cls)
            raise UnsupportedModelError(
                f"{where}: element type {name} is not supported (supported: {supported})"
            ) from None


@dataclass(frozen=True)
class DTypeInfo:
    """Facts about one dtype."""

    numpy: np.dtype
    kind: str  # "float", "int", "uint" or "bool"
    c_name: str  # the CUDA C type


_INFO: dict[DType, DTypeInfo] = {
    DType.F32: DTypeInfo(np.dtype(np.float32), "float", "float"),
    DType.F64: DTypeInfo(np.dtype(np.float64), "float", "double"),
    DType.F16: DTypeInfo(np.dtype(np.float16), "float", "__half"),
    DType.BF16: DTypeInfo(np.dtype(ml_dtypes.bfloat16), "float", "__nv_bfloat16"),
    DType.I8: DTypeInfo(np.dtype(np.int8), "int", "signed char"),
    DType.I16: DTypeInfo(np.dtype(np.int16), "int", "short"),
    DType.I32: DTypeInfo(np.dtype(np.int32), "int", "int"),
    DType.I64: DTypeInfo(np.dtype(np.int64), "int", "long long"),
    DType.U8: DTypeInfo(np.dtype(np.uint8), "uint", "unsigned char"),
    DType.U16: DTypeInfo(np.dtype(np.uint16), "uint", "unsigned short"),
    DType.U32: DTypeInfo(np.dtype(np.uint32), "uint", "unsigned int"),
    DType.U64: DTypeInfo(np.dtype(np.uint64), "uint", "unsigned long long"),
    DType.BOOL: DTypeInfo(np.dtype(np.bool_), "bool", "bool"),
    # An empty CUDA C name: CUDA has no such type, and the CUDA backend rejects the dtype.
    DType.F8E4M3FN: DTypeInfo(np.dtype(ml_dtypes.float8_e4m3fn), "float", "__nv_fp8_e4m3"),
    DType.F8E4M3FNUZ: DTypeInfo(np.dtype(ml_dtypes.float8_e4m3fnuz), "float", ""),
    DType.F8E5M2: DTypeInfo(np.dtype(ml_dtypes.float8_e5m2), "float", "__nv_fp8_e5m2"),
    DType.F8E5M2FNUZ: DTypeInfo(np.dtype(ml_dtypes.float8_e5m2fnuz), "float", ""),
    DType.F8E8M0: DTypeInfo(np.dtype(ml_dtypes.float8_e8m0fnu), "float", "__nv_fp8_e8m0"),
    DType.F4E2M1: DTypeInfo(np.dtype(ml_dtypes.float4_e2m1fn), "float", "__nv_fp4_e2m1"),
    DType.I4: DTypeInfo(np.dtype(ml_dtypes.int4), "int", ""),
    DType.U4: DTypeInfo(np.dtype(ml_dtypes.uint4), "uint", ""),
    DType.I2: DTypeInfo(np.dtype(ml_dtypes.int2), "int", ""),
    DType.U2: DTypeInfo(np.dtype(ml_dtypes.uint2), "uint", ""),
}

# What numpy computes each narrow type in: it lacks their arithmetic (ml_dtypes has little).
COMPUTE_TYPE: dict[DType, np.dtype] = {
    DType.BF16: np.dtype(np.float32),
    DType.F8E4M3FN: np.dtype(np.float32),
    DType.F8E4M3FNUZ: np.dtype(np.float32),
    DType.F8E5M2: np.dtype(np.float32),
    DType.F8E5M2FNUZ: np.dtype(np.float32),
    DType.F8E8M0: np.dtype(np.float32),
    DType.F4E2M1: np.dtype(np.float32),
    DType.I4: np.dtype(np.int8),
    DType.U4: np.dtype(np.uint8),
    DType.I2: np.dtype(np.int8),
    DType.U2: np.dtype(np.uint8),
}

_FROM_NUMPY: dict[np.dtype, DType] = {info.numpy: dtype for dtype, info in _INFO.items()}


def _onnx_type_name(code: int) -> str:
    import onnx

    try:
        return str(onnx.TensorProto.DataType.Name(code))
    except ValueError:
        return f"code {code}"
