"""IR dtypes and the `.pte` schema's ScalarType codes, both ways."""

from __future__ import annotations

from texir.ir.types import DType
from texir.serialize.pte.schema import ScalarType

__all__ = ["DTYPE_TO_SCALAR_TYPE", "SCALAR_TYPE_TO_DTYPE"]

DTYPE_TO_SCALAR_TYPE: dict[DType, ScalarType] = {
    DType.uint8: ScalarType.BYTE, DType.int8: ScalarType.CHAR, DType.int16: ScalarType.SHORT,
    DType.int32: ScalarType.INT, DType.int64: ScalarType.LONG, DType.float16: ScalarType.HALF,
    DType.float32: ScalarType.FLOAT, DType.float64: ScalarType.DOUBLE, DType.bool: ScalarType.BOOL,
    DType.qint8: ScalarType.QINT8, DType.quint8: ScalarType.QUINT8, DType.qint32: ScalarType.QINT32,
    DType.bfloat16: ScalarType.BFLOAT16, DType.quint4x2: ScalarType.QUINT4X2,
    DType.quint2x4: ScalarType.QUINT2X4, DType.bits16: ScalarType.BITS16,
    DType.float8_e5m2: ScalarType.FLOAT8E5M2, DType.float8_e4m3fn: ScalarType.FLOAT8E4M3FN,
    DType.float8_e5m2fnuz: ScalarType.FLOAT8E5M2FNUZ, DType.float8_e4m3fnuz: ScalarType.FLOAT8E4M3FNUZ,
    DType.uint16: ScalarType.UINT16, DType.uint32: ScalarType.UINT32, DType.uint64: ScalarType.UINT64,
    DType.complex64: ScalarType.COMPLEX64, DType.complex128: ScalarType.COMPLEX128,
}

SCALAR_TYPE_TO_DTYPE: dict[ScalarType, DType] = {v: k for k, v in DTYPE_TO_SCALAR_TYPE.items()}

