"""What the IR says about a value and where a node came from: scalar enums, dimensions, value metadata
(a node's FX ``meta["val"]``) and provenance. Part of the snapshot schema; texir.ir.types re-exports
every public name, and its SCHEMA_VERSION covers these structs too."""

from __future__ import annotations

import enum
from typing import Annotated, Literal, TypeAlias, Union

import msgspec

from texir.ir._struct import _Frozen, _Tagged


# --------------------------------------------------------------------------------------------------
# Scalar enums


class DType(enum.StrEnum):
    """torch dtypes by their torch name (``torch.float32`` -> ``"float32"``)."""

    bool, uint8, int8, int16 = "bool", "uint8", "int8", "int16"
    int32, int64, uint16, uint32 = "int32", "int64", "uint16", "uint32"
    uint64, float16, bfloat16, float32 = "uint64", "float16", "bfloat16", "float32"
    float64, complex64, complex128, float8_e5m2 = "float64", "complex64", "complex128", "float8_e5m2"
    float8_e4m3fn, float8_e5m2fnuz, float8_e4m3fnuz, qint8 = "float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3fnuz", "qint8"
    quint8, qint32, quint4x2, quint2x4 = "quint8", "qint32", "quint4x2", "quint2x4"
    bits16 = "bits16"


DTYPE_ITEMSIZE: dict[DType, int] = {
    DType.bool: 1, DType.uint8: 1, DType.int8: 1, DType.int16: 2, DType.int32: 4, DType.int64: 8,
    DType.uint16: 2, DType.uint32: 4, DType.uint64: 8, DType.float16: 2, DType.bfloat16: 2,
    DType.float32: 4, DType.float64: 8, DType.complex64: 8, DType.complex128: 16,
    DType.float8_e5m2: 1, DType.float8_e4m3fn: 1, DType.float8_e5m2fnuz: 1, DType.float8_e4m3fnuz: 1,
    DType.qint8: 1, DType.quint8: 1, DType.qint32: 4, DType.quint4x2: 1, DType.quint2x4: 1,
    DType.bits16: 2,
}


class Layout(enum.StrEnum):
    strided = "strided"
    sparse_coo, sparse_csr, sparse_csc = "sparse_coo", "sparse_csr", "sparse_csc"
    sparse_bsr, sparse_bsc = "sparse_bsr", "sparse_bsc"
    mkldnn = "_mkldnn"
    jagged = "jagged"


class MemoryFormat(enum.StrEnum):
    contiguous_format, channels_last = "contiguous_format", "channels_last"
    channels_last_3d, preserve_format = "channels_last_3d", "preserve_format"


# An index into a per-graph table (`Graph.metas`, `ProvenanceTable.locations`).
Index: TypeAlias = Annotated[int, msgspec.Meta(ge=0)]

# A dimension or stride: a concrete int, or a symbolic expression in sympy syntax ("s0", "2*s0 + 1").
Dim: TypeAlias = Union[int, str]

# Floats that JSON cannot hold (and NaN, which breaks structural equality) are spelled as strings.
SpecialFloat: TypeAlias = Literal["inf", "-inf", "nan"]
FloatValue: TypeAlias = Union[float, SpecialFloat]


# --------------------------------------------------------------------------------------------------
# Value metadata: what a node's value is (its FX ``meta["val"]``)


class TensorMeta(_Tagged, frozen=True, kw_only=True, tag="tensor"):
    """A tensor's metadata. Shapes and strides may hold symbolic expressions."""

    dtype: DType
    shape: tuple[Dim, ...]
    strides: tuple[Dim, ...]
    """Element strides, same length as `shape`; the dim order follows from them."""
    storage_offset: Dim = 0
    layout: Layout = Layout.strided
    device: str = "cpu"
    requires_grad: bool = False


class SymIntMeta(_Tagged, frozen=True, kw_only=True, tag="symint"):
    """A symbolic int; `expr` is its sympy expression, or an int once it is known."""

    expr: Dim


class SymFloatMeta(_Tagged, frozen=True, kw_only=True, tag="symfloat"):
    expr: str


class SymBoolMeta(_Tagged, frozen=True, kw_only=True, tag="symbool"):
    expr: str


class ScalarMeta(_Tagged, frozen=True, kw_only=True, tag="scalar"):
    """A plain Python value computed by a node (rare: most scalars are arguments)."""

    value: Union[bool, int, FloatValue, str, None]


class TupleMeta(_Tagged, frozen=True, kw_only=True, tag="tuple"):
    """Several values, as returned by multi-output ops (``max.dim``, ``split``)."""

    items: tuple[ValueMeta, ...]
    is_list: bool = False
    """True when the op returns ``Tensor[]`` (a list), False for a tuple."""


class NoneMeta(_Tagged, frozen=True, kw_only=True, tag="none"):
    """The value None (e.g. an in-place op's result or a missing optional output)."""


class CustomObjMeta(_Tagged, frozen=True, kw_only=True, tag="custom_obj"):
    class_fqn: str


class TokenMeta(_Tagged, frozen=True, kw_only=True, tag="token"):
    """An effect token threaded through side-effecting ops."""


class SubgraphMeta(_Tagged, frozen=True, kw_only=True, tag="subgraph"):
    """The value of a `get_attr` node naming a nested graph (a torch.cond/torch.map branch)."""

    graph: str


class DelegateMeta(_Tagged, frozen=True, kw_only=True, tag="delegate"):
    """The value of a `get_attr` node naming a lowered backend module of the program."""

    module: str


ValueMeta: TypeAlias = Union[
    TensorMeta, SymIntMeta, SymFloatMeta, SymBoolMeta, ScalarMeta, TupleMeta, NoneMeta,
    CustomObjMeta, TokenMeta, SubgraphMeta, DelegateMeta,
]


# --------------------------------------------------------------------------------------------------
# Provenance


class ModuleFrame(_Frozen, frozen=True, kw_only=True):
    """One entry of FX ``nn_module_stack``: key -> (module path, module type)."""

    key: str
    path: str
    type: str


class SourceFn(_Frozen, frozen=True, kw_only=True):
    """One entry of FX ``source_fn_stack``: (name, target as a string)."""

    name: str
    target: str


class Provenance(_Frozen, frozen=True, kw_only=True):
    """Where a node came from (a view: `Graph.prov` assembles it from `Graph.provenance`).
    Debug handles follow ExecuTorch's numbering: nodes sharing their greatest ``from_node``
    ancestor share one handle; placeholders and outputs have none."""

    debug_handle: int | None = None
    ancestor: str | None = None
    """Identifier of the greatest ``from_node`` ancestor (its name and graph id)."""
    stack_trace: str | None = None
    nn_module_stack: tuple[ModuleFrame, ...] = ()
    source_fn_stack: tuple[SourceFn, ...] = ()
    torch_fn: tuple[str, str] | None = None
    """(call name, function type), e.g. ``("add_25", "method_descriptor.add")``."""
    custom: str | None = None
    """FX ``meta["custom"]`` as JSON text, as torch.export serializes it (e.g. Arm's quantizer notes)."""


class Location(_Frozen, frozen=True, kw_only=True):
    """The part of a node's provenance that many nodes share; uniqued per graph."""

    stack_trace: str | None = None
    nn_module_stack: tuple[ModuleFrame, ...] = ()
    source_fn_stack: tuple[SourceFn, ...] = ()
    torch_fn_type: str | None = None
    """Second half of `Provenance.torch_fn`; the first half (unique per call) is a column."""
    custom: str | None = None  # `Provenance.custom`


class ProvenanceTable(_Frozen, frozen=True, kw_only=True):
    """Provenance of a graph's nodes, column-wise: entry i of every column belongs to the graph's
    i-th node. Per-node values are columns; shared ones are `Location`s referenced by index."""

    debug_handle: tuple[int | None, ...]
    ancestor: tuple[str | None, ...]
    torch_fn_name: tuple[str | None, ...]
    location: tuple[Index | None, ...]
    """Index into `locations`, or None."""
    locations: tuple[Location, ...] = ()
