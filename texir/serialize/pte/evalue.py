"""The value side of program.fbs (the `.pte` schema; texir.serialize.pte.schema re-exports every name):
the enums (scalar_type.fbs' ScalarType, tensor dynamism, data and delegate locations, device types),
and the members of `union KernelTypes`, an EValue's payload, with the tables they hold. Same names
and field order as the .fbs, as in schema.py."""

from __future__ import annotations

import enum
from typing import Final

from msgspec import Struct


class _Table(Struct, frozen=True, kw_only=True):
    """Base of every table struct (frozen, keyword-only, hashable), here and in schema.py."""


# --- enums (see program.fbs / scalar_type.fbs) -------------------------------------------------


class ScalarType(enum.IntEnum):
    """See scalar_type.fbs (byte). Values 8 and 18-21 are not declared there; 9 and 10 neither,
    but ExecuTorch's emitter writes them for complex tensors (exir's scalar_type.py) and its
    portable FFT kernels read them."""

    BYTE = 0
    CHAR = 1
    SHORT = 2
    INT = 3
    LONG = 4
    HALF = 5
    FLOAT = 6
    DOUBLE = 7
    COMPLEX64 = 9
    COMPLEX128 = 10
    BOOL = 11
    QINT8 = 12
    QUINT8 = 13
    QINT32 = 14
    BFLOAT16 = 15
    QUINT4X2 = 16
    QUINT2X4 = 17
    BITS16 = 22
    FLOAT8E5M2 = 23
    FLOAT8E4M3FN = 24
    FLOAT8E5M2FNUZ = 25
    FLOAT8E4M3FNUZ = 26
    UINT16 = 27
    UINT32 = 28
    UINT64 = 29


class TensorShapeDynamism(enum.IntEnum):
    """See program.fbs `enum TensorShapeDynamism : byte`."""

    STATIC = 0
    DYNAMIC_BOUND = 1
    DYNAMIC_UNBOUND = 2


class TensorDataLocation(enum.IntEnum):
    """See program.fbs `enum TensorDataLocation : byte`."""

    SEGMENT = 0
    EXTERNAL = 1


class DeviceType(enum.IntEnum):
    """See program.fbs `enum DeviceType : byte`."""

    CPU = 0
    CUDA = 1


class DataLocation(enum.IntEnum):
    """See program.fbs `enum DataLocation : byte`."""

    INLINE = 0
    SEGMENT = 1


# --- the members of union KernelTypes (program.fbs) ----------------------------------------------


class _KernelType(Struct, frozen=True, kw_only=True, tag_field="kind"):
    """Base of the members of the `KernelTypes` union (tag = member name)."""


class Null(_KernelType, frozen=True, kw_only=True, tag=True):
    """See program.fbs `table Null {}`."""


class AllocationDetails(_Table, frozen=True, kw_only=True):
    """See program.fbs `table AllocationDetails`. `memory_id` is 1-based (0 is the constant arena)."""

    memory_id: int
    memory_offset_low: int
    memory_offset_high: int = 0

    @property
    def memory_offset(self) -> int:
        return (self.memory_offset_high << 32) | self.memory_offset_low


class ExtraTensorInfo(_Table, frozen=True, kw_only=True):
    """See program.fbs `table ExtraTensorInfo`."""

    mutable_data_segments_idx: int = 0
    fully_qualified_name: str | None = None
    location: TensorDataLocation = TensorDataLocation.SEGMENT
    device_type: DeviceType = DeviceType.CPU
    device_index: int = 0


class Tensor(_KernelType, frozen=True, kw_only=True, tag=True):
    """See program.fbs `table Tensor`.

    Constant: data_buffer_idx >= 1, no allocation_info. Planned: allocation_info, data_buffer_idx 0
    (or >= 1 for a mutable buffer initialised from the mutable-data segment). Neither: caller-provided.
    """

    scalar_type: ScalarType
    storage_offset: int = 0
    sizes: tuple[int, ...]
    dim_order: tuple[int, ...]
    requires_grad: bool = False
    data_buffer_idx: int = 0
    allocation_info: AllocationDetails | None = None
    layout: int = 0
    shape_dynamism: TensorShapeDynamism = TensorShapeDynamism.STATIC
    extra_tensor_info: ExtraTensorInfo | None = None


class Int(_KernelType, frozen=True, kw_only=True, tag=True):
    """See program.fbs `table Int`."""

    int_val: int


class Bool(_KernelType, frozen=True, kw_only=True, tag=True):
    """See program.fbs `table Bool`."""

    bool_val: bool


class Double(_KernelType, frozen=True, kw_only=True, tag=True):
    """See program.fbs `table Double`; inf and nan are plain IEEE values.

    Equality follows Python floats, so a NaN Double is not equal to itself; compare encoded bytes instead.
    """

    double_val: float


class String(_KernelType, frozen=True, kw_only=True, tag=True):
    """See program.fbs `table String`."""

    string_val: str


class IntList(_KernelType, frozen=True, kw_only=True, tag=True):
    """See program.fbs `table IntList`: the items are value indices of Int values, not integers."""

    items: tuple[int, ...]


class DoubleList(_KernelType, frozen=True, kw_only=True, tag=True):
    """See program.fbs `table DoubleList` (literal values)."""

    items: tuple[float, ...]


class BoolList(_KernelType, frozen=True, kw_only=True, tag=True):
    """See program.fbs `table BoolList` (literal values)."""

    items: tuple[bool, ...]


class TensorList(_KernelType, frozen=True, kw_only=True, tag=True):
    """See program.fbs `table TensorList`: value indices of Tensor values."""

    items: tuple[int, ...]


class OptionalTensorList(_KernelType, frozen=True, kw_only=True, tag=True):
    """See program.fbs `table OptionalTensorList`: value indices, -1 meaning None."""

    items: tuple[int, ...]


KernelTypes = (
    Null
    | Int
    | Bool
    | Double
    | Tensor
    | String
    | IntList
    | DoubleList
    | BoolList
    | TensorList
    | OptionalTensorList
)
"""See program.fbs `union KernelTypes`."""

KERNEL_TYPES: Final[tuple[type[_KernelType], ...]] = (
    Null,
    Int,
    Bool,
    Double,
    Tensor,
    String,
    IntList,
    DoubleList,
    BoolList,
    TensorList,
    OptionalTensorList,
)
"""Members in union order: the flatbuffer type tag of `KERNEL_TYPES[i]` is `i + 1` (0 is NONE)."""
